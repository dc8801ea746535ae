"""The soak's pure parts: its window plan, the well-behaved client's percentile table and
verdicts, the attack table, and resuming a stopped run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.soak import (
    ATTACKER_NICE,
    _params,
    command,
    cpu_split,
    cpu_table,
    descendants,
    load_store,
    markdown,
    pending,
    percentile_table,
    plan_windows,
    pooled,
    route_stats,
    verdicts,
    write,
)
from benchmarks.soak_attacks import (
    ATTACKS,
    MATES,
    UNANSWERED,
    WRONG_WIDTH,
    is_finding,
    select_attacks,
)


def _route(latencies_ms: list[float], n: int | None = None,
           errors: dict[str, int] | None = None) -> dict[str, Any]:
    stats = route_stats(latencies_ms, len(latencies_ms) if n is None else n, errors or {})
    return {**stats, "latencies_ms": latencies_ms, "send_lag_p99_ms": 0.5}


def _window(index: int, kind: str, model: list[float], graph: list[float], *,
            graph_n: int | None = None, rss: tuple[float, ...] = (100.0,),
            attacks: dict[str, dict[str, int]] | None = None) -> dict[str, Any]:
    failed = {"HTTP 500": graph_n - len(graph)} if graph_n else {}
    return {"index": index, "kind": kind, "seconds": 10.0, "offset_s": 10.0 * index,
            "routes": {"model": _route(model), "graph": _route(graph, graph_n, failed)},
            "rss_mb": [[float(i), mb] for i, mb in enumerate(rss)], "attacks": attacks or {}}


def test_the_plan_starts_and_ends_calm_and_alternates() -> None:
    plan = plan_windows(3, 20.0, 30.0)
    assert [w.kind for w in plan] == ["calm", "hostile"] * 3 + ["calm"]
    assert [w.index for w in plan] == list(range(7))
    assert [w.offset_s for w in plan] == [0, 20, 50, 70, 100, 120, 150]
    with pytest.raises(ValueError, match="rounds >= 1"):
        plan_windows(0, 20.0, 30.0)


def _args(**changed: Any) -> argparse.Namespace:
    """The command line's defaults, as argparse hands them to ``_params``."""
    return argparse.Namespace(**{
        "quick": True, "rounds": 10, "calm_s": 30.0, "hostile_s": 60.0, "rate_model": 20.0,
        "rate_graph": 20.0, "seed": 0, "attacks": None, "graph_share": None,
        "graph_share_shared": None, "attacker_nice": ATTACKER_NICE, **changed})


def test_the_default_soak_is_ten_hostile_minutes_and_quick_is_under_three_in_all() -> None:
    def total(quick: bool, kind: str | None = None) -> float:
        p = _params(_args(quick=quick))
        plan = plan_windows(p["rounds"], p["calm_s"], p["hostile_s"])
        assert p["windows"] == len(plan)
        return sum(w.seconds for w in plan if kind in (None, w.kind))

    assert total(False, "hostile") >= 600
    assert total(True) <= 180


def test_a_graph_share_is_a_parameter_of_the_run_and_at_least_one() -> None:
    def params(share: int | None) -> dict[str, object]:
        return _params(_args(graph_share=share))

    assert "graph_share" not in params(None)  # a default run resumes as before
    assert params(4)["graph_share"] == 4
    with pytest.raises(ValueError, match="at least 1"):
        params(0)
    assert "graph_share_shared" not in params(None)
    assert _params(_args(graph_share_shared=8))["graph_share_shared"] == 8
    with pytest.raises(ValueError, match="--graph-share-shared is at least 1"):
        _params(_args(graph_share_shared=0))


def test_the_attackers_niceness_is_recorded_checked_and_reported() -> None:
    def params(nice: int) -> dict[str, Any]:
        return _params(_args(attacker_nice=nice))

    # always recorded: a run of the old co-located default (no key) does not resume as this
    assert ATTACKER_NICE == 19 and params(19)["attacker_nice"] == 19
    assert params(0)["attacker_nice"] == 0
    for bad in (-1, 20):
        with pytest.raises(ValueError, match="0 to 19"):
            params(bad)
    store = {"params": params(19), "machine": "2 cores", "command": "python -m x",
             "windows": {str(w["index"]): w for w in (
                 _window(0, "calm", [1.0] * 100, [2.0] * 100),
                 _window(1, "hostile", [1.0] * 100, [2.0] * 100))}}
    assert "attackers' process at nice 19" in markdown(store)
    store["params"] = params(0)
    assert "attackers' process at normal priority" in markdown(store)


def test_percentiles_come_with_their_samples_and_failures_count_only_against_success() -> None:
    stats = route_stats([float(i) for i in range(1, 101)], 200, {"timeout": 100})
    assert stats["success"] == 0.5 and stats["ok"] == 100
    # method "higher": a latency some query saw, never one between two
    assert (stats["p50_ms"], stats["p99_ms"]) == pytest.approx((51.0, 100.0))
    assert stats["p99_reliable"] and not stats["p999_reliable"]


def test_pooled_figures_cover_every_window_of_a_kind() -> None:
    windows = [_window(0, "calm", [1.0] * 50, [2.0] * 50),
               _window(1, "hostile", [3.0] * 50, [4.0] * 40, graph_n=50),
               _window(2, "calm", [1.0] * 50, [5.0] * 50)]
    calm = pooled(windows, "calm", ("model", "graph"))
    assert (calm["windows"], calm["n"], calm["p99_ms"]) == (2, 200, 5.0)
    hostile = pooled(windows, "hostile", ("graph",))
    assert hostile["success"] == 0.8 and hostile["errors"] == {"HTTP 500": 10}


def test_the_table_marks_a_percentile_without_enough_samples() -> None:
    windows = [_window(0, "calm", [1.0] * 100, [2.0] * 10, rss=(100.0, 120.0))]
    windows[0]["health_ms"] = [[0.0, 2.0], [0.25, 40.0]]
    rows = percentile_table(windows)
    assert rows[2] == ("| 0 | calm | model | 100 / 100 | 100.00% | 1.0 | 1.0 | 1.0* | 0.5 "
                       "| 120.0 | 40.0 |")
    assert rows[3].startswith("| 0 | calm | graph | 10 / 10 | 100.00% | 2.0 | 2.0* | 2.0* |")
    assert any(r.startswith("| **all calm** | calm | both | 110 / 110 |") for r in rows)


def test_verdicts_read_success_the_p99_ratio_rss_and_findings() -> None:
    attacks = {"huge shape, V2 gRPC": {"grpc INVALID_ARGUMENT": 9, "grpc UNKNOWN": 1},
               "10 MB stream key": {"400": 3}}
    windows = [_window(0, "calm", [10.0] * 100, [10.0] * 100, rss=(100.0, 110.0)),
               _window(1, "hostile", [15.0] * 100, [30.0] * 99, graph_n=100,
                       rss=(110.0, 400.0), attacks=attacks)]
    v = verdicts(windows)
    assert v["p99_ratio"] == 3.0 and not v["p99_met"]
    assert v["hostile"]["success"] == 199 / 200 and not v["success_met"]
    assert (v["rss_first_mb"], v["rss_max_mb"]) == (100.0, 400.0)
    assert v["findings"] == {"huge shape, V2 gRPC": {"grpc UNKNOWN": 1}}


def test_the_report_names_every_attack_its_answers_and_the_command() -> None:
    windows = [_window(0, "calm", [1.0] * 10, [1.0] * 10),
               _window(1, "hostile", [1.0] * 10, [1.0] * 10, attacks={
                   "10 MB stream key": {"500": 2, "400": 1},
                   "Host: evil.example on /admin/state": {"421": 5},
                   "cross-site text/plain admin POST": {"200": 4},
                   "50,000-row input_batch": {UNANSWERED: 1}})]
    windows[1]["attack_round_ms"] = {"10 MB stream key": [10.0, 30.0, 20.0]}
    store = {"params": {"calm_s": 10.0, "hostile_s": 10.0, "rate_model": 20.0,
                        "rate_graph": 20.0}, "machine": "2 cores",
             "command": "python -m benchmarks.soak --quick",
             "windows": {str(w["index"]): w for w in windows}}
    text = markdown(store)
    assert ("| 10 MB stream key | 3 | 500: 2, 400: 1 | 400, 413 | **finding** | 20.0 | 30.0 |"
            in text)
    assert ("| Host: evil.example on /admin/state | 5 | 421: 5 | 421 | as expected | - | - |"
            in text)
    assert "| 403, 415 | unexpected: 200 |" in text
    assert "| 50,000-row input_batch | 1 |" in text and "no answer within a window" in text
    assert all(a.name in text for a in ATTACKS)
    assert text.rstrip().endswith("python -m benchmarks.soak --quick")


def test_the_results_folder_gets_the_table_the_plot_and_the_command(tmp_path: Path) -> None:
    windows = [_window(0, "calm", [1.0] * 10, [2.0] * 10),
               _window(1, "hostile", [3.0] * 10, [4.0] * 10)]
    windows[1]["health_ms"] = [[0.0, 3.0], [0.25, 300.0]]
    store = {"params": {"calm_s": 10.0, "hostile_s": 10.0, "rate_model": 20.0,
                        "rate_graph": 20.0}, "machine": "2 cores",
             "command": "python -m benchmarks.soak --quick",
             "windows": {str(w["index"]): w for w in windows}}
    write(tmp_path, store)
    assert (tmp_path / "command.txt").read_text() == "python -m benchmarks.soak --quick\n"
    assert "| 1 | hostile | graph | 10 / 10 |" in (tmp_path / "soak.md").read_text()
    assert (tmp_path / "soak.png").stat().st_size > 0


def test_a_stopped_run_resumes_with_its_finished_windows(tmp_path: Path) -> None:
    path = tmp_path / "soak.json"
    params = {"rounds": 1, "calm_s": 5.0, "hostile_s": 5.0, "seed": 0}
    store = load_store(path, params, "python -m benchmarks.soak")
    store["windows"]["0"] = _window(0, "calm", [1.0], [1.0])
    path.write_text(json.dumps(store))
    plan = plan_windows(1, 5.0, 5.0)

    again = load_store(path, params, "python -m benchmarks.soak --rounds 1")
    assert [w.index for w in pending(plan, again)] == [1, 2]
    assert again["command"] == "python -m benchmarks.soak --rounds 1"
    other = load_store(path, {**params, "seed": 1}, "python -m benchmarks.soak --seed 1")
    assert other["windows"] == {} and len(pending(plan, other)) == 3


def test_findings_are_server_faults_not_refusals() -> None:
    assert is_finding("500") and is_finding("503") and is_finding("grpc INTERNAL")
    assert is_finding("error RemoteProtocolError")
    assert not any(is_finding(a) for a in ("400", "413", "429", "421", "held", "closed",
                                           "grpc INVALID_ARGUMENT", UNANSWERED))


def test_the_command_is_recorded_from_the_project_root() -> None:
    assert command(["--quick", "--results-dir", "a b"]) == (
        "python -m benchmarks.soak --quick --results-dir 'a b'")


def test_cpu_is_split_by_role_and_the_rest_is_other_jobs() -> None:
    # pid -> (parent, ticks): 10 the frontend, 11 and 12 its workers (12 under 11), 20 the
    # attackers, 30 the client, 40 a stranger; 13 started during the window
    before = {10: (1, 100), 11: (10, 50), 12: (11, 0), 20: (1, 0), 30: (1, 10), 40: (1, 0)}
    after = {10: (1, 150), 11: (10, 100), 12: (11, 25), 13: (10, 25), 20: (1, 40),
             30: (1, 20), 40: (1, 60)}
    assert descendants(10, after) == {11, 12, 13}
    roles = {"frontend": {10}, "workers": descendants(10, after), "attackers": {20},
             "soak client": {30}}
    # 2 cores, 200 ticks of wall time (400 core-ticks), 300 of them busy: 1.5 cores
    cpu = cpu_split(before, after, (1000, 5000), (1300, 5400), roles, cores=2)
    assert cpu == {"machine": 1.5, "frontend": 0.25, "workers": 0.5, "attackers": 0.2,
                   "soak client": 0.05, "other": 0.5}
    rows = cpu_table([{"index": 0, "kind": "hostile", "cpu_cores": cpu}])
    assert rows[2] == "| 0 | hostile | 1.50 | 0.25 | 0.50 | 0.20 | 0.05 | 0.50 |"


def test_all_attacks_unless_filtered() -> None:
    assert select_attacks(None) == ATTACKS
    assert select_attacks([]) == ATTACKS


def test_a_filter_selects_by_words_in_any_case_keeping_the_order() -> None:
    chosen = select_attacks(["HUGE SHAPE", "1,024"])
    names = [a.name for a in chosen]
    assert names[0] == "1,024 new streams in one request"
    assert [n for n in names[1:]] == [a.name for a in ATTACKS if "huge shape" in a.name]
    assert select_attacks(["wrong-width", "batch-mates"]) == tuple(
        a for a in ATTACKS if a.name in (WRONG_WIDTH, MATES))


def test_a_filter_that_matches_nothing_names_the_attacks() -> None:
    with pytest.raises(ValueError, match="no attack matches .xyzzy.*10 MB stream key"):
        select_attacks(["1,024", "xyzzy"])
