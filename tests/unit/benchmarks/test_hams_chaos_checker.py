"""The chaos part's checker (``benchmarks.hams_chaos``): each stream replayed, errors
classified by whether their state was applied, reply gaps per event, the tables."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.hams_chaos import (
    Outcome,
    event_gaps,
    gap_table,
    render_chaos,
    render_stocks,
    replay_streams,
)


def step(state: tuple[Any, ...], x: Any) -> tuple[tuple[float, ...], tuple[Any, ...]]:
    """A toy stateful stream: the running sum, output after each step."""
    total = state[0] + x[0]
    return (total,), (total,)


def ok(x: float, out: float) -> Outcome:
    return Outcome((x,), (out,))


def err(x: float, kind: str = "HTTP 503") -> Outcome:
    return Outcome((x,), None, kind)


def check(history: list[Outcome]) -> dict[str, Any]:
    return replay_streams({"s": history}, step, (0.0,)).as_dict()


def test_answers_that_match_the_replay_pass() -> None:
    v = check([ok(1, 1), ok(2, 3), ok(4, 7)])
    assert (v["answered"], v["matched"], v["errors"], v["diverged_streams"]) == (3, 3, 0, 0)


def test_an_error_that_left_no_state_is_a_clean_error() -> None:
    v = check([ok(1, 1), err(5), ok(2, 3)])  # 5 was never applied: 1 + 2
    assert (v["errors"], v["errors_after_applied"], v["diverged_streams"]) == (1, 0, 0)


def test_an_error_whose_state_was_applied_is_caught() -> None:
    v = check([ok(1, 1), err(5), err(7), ok(2, 8)])  # 5 applied, 7 not: 1 + 5 + 2
    assert (v["errors"], v["errors_after_applied"], v["diverged_streams"]) == (2, 1, 0)
    assert "before it had been applied" in v["examples"][0]


def test_a_state_applied_twice_diverges_and_the_rest_is_unchecked() -> None:
    v = check([ok(1, 1), ok(2, 5), ok(1, 6), err(3), ok(1, 7)])  # 2 counted twice
    assert (v["diverged_streams"], v["matched"], v["unchecked"]) == (1, 1, 2)
    assert "differs from every replay" in v["examples"][0]


def test_many_errors_in_a_row_are_assumed_unapplied_past_the_limit() -> None:
    v = check([err(1), err(1), err(1), err(1), err(1), ok(2, 2)])
    assert (v["errors"], v["errors_after_applied"], v["diverged_streams"]) == (5, 0, 0)


def test_each_events_longest_gap_runs_to_the_next_event() -> None:
    replies = [0.1, 0.2, 0.5, 0.6, 0.9, 2.0, 2.1]
    events = [{"at": 0.15}, {"at": 1.0}]
    assert event_gaps(replies, events, end=2.2) == pytest.approx([300.0, 1000.0])
    assert event_gaps([], [{"at": 1.0}], end=3.0) == pytest.approx([2000.0])  # no reply


def test_gap_table_per_kind() -> None:
    events = [{"kind": "backup", "gap_ms": 10.0}, {"kind": "primary", "gap_ms": 50.0},
              {"kind": "primary", "gap_ms": 30.0}, {"kind": "primary", "gap_ms": 90.0}]
    table = gap_table(events)
    assert list(table) == ["primary", "backup"]  # in the order
    assert table["primary"] == {"events": 3, "median_gap_ms": 50.0, "max_gap_ms": 90.0}


def test_the_tables_show_the_checkers_figures() -> None:
    run = {"events_done": 2, "events": [{"kind": "primary"}, {"kind": "chain"}],
           "gaps": gap_table([{"kind": "primary", "gap_ms": 40.0},
                              {"kind": "chain", "gap_ms": 400.0}]),
           "clients": 3, "streams": 12, "sent": 100, "lost": 0, "error_kinds": {},
           "replay": check([ok(1, 1)]), "pairs": 50, "conflicts": 0, "duplicates": 0,
           "outages": 0, "failovers": 3, "false_timeouts": 0, "elapsed_s": 60.0,
           "calm": {"seconds": 10, "hogs": 2, "losses": 0, "timeouts": 0}}
    text = "\n".join(render_chaos({"hams": run}))
    assert "| chain | 1 | 400 | 400 |" in text and "lost (no answer, or 504): 0" in text
    part = {"bare_saturation_rows_per_s": {"64": 5000.0}, "load_share": 0.5, "seconds": 20,
            "rows": [{"mode": "hams", "batch": 64, "mean_ms": 10.0, "p50_ms": 9.0,
                      "p99_ms": 20.0, "p999_ms": 30.0, "n": 700, "errors": 0,
                      "mean_vs_bare_paired": 1.1, "each_mean_ms": [10.0]}],
            "targets": {"hams <= 1.15x bare at 64 rows": True}}
    text = "\n".join(render_stocks(part))
    assert "| hams | 64 | 10.00 |" in text and "1.100x" in text and ": met" in text
