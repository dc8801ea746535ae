"""``benchmarks.hams_nodes``'s pure rules (issue 41): an event's failover records folded
into one split, its consistency verdict, the summary's medians and counts, the goal lines
(the failover ratio to the process kill, TCP against Unix at 64 rows), and the tables."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.hams_analysis import overhead_rows
from benchmarks.hams_nodes_analysis import (
    digests_equal,
    event_failover,
    event_problems,
    goals,
    render_markdown,
    summarise,
)


def record(detected: float, protocol: float, first: float | None) -> dict[str, Any]:
    return {"detected_at": detected, "protocol_done_at": protocol, "first_reply_at": first}


def test_one_failover_splits_into_detection_protocol_and_handover() -> None:
    split = event_failover(10.0, [record(10.2, 10.21, 10.25)])
    assert split == pytest.approx({"detection_ms": 200, "protocol_ms": 10,
                                   "handover_ms": 40, "total_ms": 250})


def test_a_node_that_took_two_primaries_counts_from_the_first_loss_to_the_last_reply(
        ) -> None:
    split = event_failover(10.0, [record(10.3, 10.32, 10.4), record(10.1, 10.35, 10.5)])
    assert split == pytest.approx({"detection_ms": 100, "protocol_ms": 250,
                                   "handover_ms": 150, "total_ms": 500})


def test_no_failover_and_no_first_reply_yet() -> None:
    assert event_failover(1.0, []) == dict.fromkeys(
        ("detection_ms", "protocol_ms", "handover_ms", "total_ms"))
    split = event_failover(10.0, [record(10.1, 10.2, 10.3), record(10.1, 10.2, None)])
    assert split["handover_ms"] is None and split["total_ms"] is None
    assert split["detection_ms"] == pytest.approx(100)


def side(seq: int, digest: str) -> dict[str, Any]:
    return {"seq": seq, "digest": digest, "pid": 1}


@pytest.mark.parametrize(("digests", "equal"), [
    ({"seq1": {"primary": side(5, "a"), "backup": side(5, "a")}}, True),
    ({"seq1": {"primary": side(5, "a"), "backup": side(4, "a")}}, False),  # behind
    ({"seq1": {"primary": side(5, "a"), "backup": side(5, "b")}}, False),  # other bytes
    ({"seq1": {"primary": side(5, "a"), "backup": None}}, False),  # no backup yet
    ({"seq1": {"primary": side(5, "a"), "backup": side(5, "a")},
      "seq2": {"primary": side(9, "c"), "backup": side(8, "c")}}, False),
    ({}, False),
], ids=["equal", "behind", "differs", "no-backup", "one-of-two", "none"])
def test_digests_equal(digests: dict[str, Any], equal: bool) -> None:
    assert digests_equal(digests) is equal


def event(index: int = 0, kind: str = "seq1 primary", total: float | None = 300.0,
          **changes: Any) -> dict[str, Any]:
    failover = dict.fromkeys(("detection_ms", "protocol_ms", "handover_ms", "total_ms"))
    if total is not None:
        failover = {"detection_ms": total / 2, "protocol_ms": 10.0,
                    "handover_ms": total / 2 - 10, "total_ms": total}
    base = {"index": index, "kind": kind, "held": [kind], "failover": failover,
            "detections": ["exit"] if total is not None else [], "gap_ms": 400.0,
            "sent": 100, "answered": 100, "lost": 0, "errors": 0, "duplicates": 0,
            "conflicts": 0, "diverged_streams": 0, "digests_equal": True, "not_whole": None}
    return {**base, **changes}


@pytest.mark.parametrize(("changes", "problem"), [
    ({}, None),
    ({"lost": 4, "answered": 96}, "4 lost (no answer or 504)"),
    ({"errors": 4, "answered": 96}, "4 answered with an error"),
    ({"duplicates": 1}, "1 answered twice"),
    ({"conflicts": 2}, "2 (operator, sequence) pairs with two outputs"),
    ({"diverged_streams": 1}, "1 streams diverging from their replay"),
    ({"answered": 97}, "3 rows sent but not answered"),
    ({"digests_equal": False}, "backup and primary digests differ"),
    ({"not_whole": "no backup"}, "not whole again: no backup"),
], ids=["consistent", "lost", "errors", "twice", "pairs", "diverged", "unanswered",
        "digests", "not-whole"])
def test_what_makes_an_event_inconsistent(changes: dict[str, Any], problem: str | None
                                          ) -> None:
    problems = event_problems(event(**changes))
    assert problems == ([] if problem is None else [problem])


def test_the_summary_counts_consistent_events_and_takes_medians_over_failovers_only(
        ) -> None:
    events = [event(0, total=200), event(1, total=400), event(2, "seq2 primary", total=300,
                                                              lost=1, answered=99),
              event(3, "spare", total=None, gap_ms=50.0),
              event(4, "backup", held=["seq1 primary", "seq2 backup"])]
    s = summarise(events)
    assert (s["events"], s["consistent"]) == (5, 4)
    assert s["failovers"]["kills"] == 4  # the spare's node had no failover
    assert s["failovers"]["median"]["total_ms"] == pytest.approx(300)
    assert s["failovers"]["max"]["total_ms"] == pytest.approx(400)
    assert s["gap_ms"] == {"median": pytest.approx(400), "max": pytest.approx(400)}
    assert s["kinds"] == {"seq1 primary": 2, "seq2 primary": 1, "spare": 1, "backup": 1}
    assert s["fig6"] == 1  # the backup's node held seq1's primary too
    assert s["problems"] == {"2": ["1 lost (no answer or 504)"]}


def link_rows(unix_ms: list[float], tcp_ms: list[float]) -> list[dict[str, Any]]:
    def cells(means: list[float]) -> list[dict[str, Any]]:
        return [{"mean_ms": m, "p50_ms": m, "p99_ms": 2 * m, "p999_ms": 3 * m,
                 "rows_per_s": 100.0, "n": 50} for m in means]
    return overhead_rows({"unix": {64: cells(unix_ms)}, "tcp": {64: cells(tcp_ms)}}, "unix")


def test_tcp_rows_are_paired_with_unix_per_repetition() -> None:
    tcp = next(r for r in link_rows([10, 20, 10], [11, 21, 13]) if r["mode"] == "tcp")
    assert tcp["mean_vs_unix_paired"] == pytest.approx(1.1)  # median of 1.1, 1.05, 1.3
    assert "mean_vs_bare" not in tcp


@pytest.mark.parametrize(("node_total", "tcp", "met"), [
    (500.0, [11, 21, 10.5], True),  # 500 / 300 = 1.67x; paired 1.05x
    (700.0, [12, 24, 12], False),  # 2.33x; 1.2x
], ids=["met", "not-met"])
def test_goals(node_total: float, tcp: list[float], met: bool) -> None:
    node = summarise([event(i, total=node_total) for i in range(3)])
    process = summarise([event(i, total=300.0) for i in range(3)])
    verdict = goals(node, process, 3, link_rows([10, 20, 10], tcp))
    assert verdict["failover_ratio"] == pytest.approx(node_total / 300)
    assert verdict["3 of 3 node kills consistent"] is True
    assert verdict["node-loss failover median <= 2x process kill"] is met
    assert verdict["TCP link <= 1.10x Unix at 64 rows"] is met


def test_fewer_events_than_planned_do_not_meet_the_count() -> None:
    node = summarise([event(0)])
    assert goals(node, {}, 50, [])["50 of 50 node kills consistent"] is False


def test_the_markdown_has_both_tables_and_the_goal_lines() -> None:
    node = [event(0, total=400.0), event(1, "spare", total=None)]
    process = [event(0, total=200.0)]
    rows = link_rows([10.0], [10.5])
    state = {"title": "quick", "command": "python -m benchmarks.hams_nodes --quick",
             "kills": {"node": {"events": node, "summary": summarise(node)},
                       "process": {"events": process, "summary": summarise(process)}},
             "link": {"unix_saturation_rows_per_s": {"64": 900.0}, "load_share": 0.5,
                      "seconds": 3.0, "rows": rows}}
    state["goals"] = goals(state["kills"]["node"]["summary"],
                           state["kills"]["process"]["summary"], 2, rows)
    text = render_markdown(state)
    assert "| node (crash) | 2 | 2 | 1 | 200.0 / 200.0 |" in text
    assert "| process (kill -9) | 1 | 1 | 1 |" in text
    assert "failover median, node loss over process kill: 2.00x" in text
    assert "- node-loss failover median <= 2x process kill: met" in text
    assert "| tcp | 64 | 10.50 |" in text and "1.050x" in text
    assert "mean vs unix (paired)" in text and "900 at 64 rows" in text
    assert "| 1 | spare | spare | – | – |" in text
