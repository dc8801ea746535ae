"""benchmarks.sim_testbed's pure rules: replaying a testbed run, the knee, the comparison and
the projection's shard plan and limits."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks import parm_testbed as tb
from benchmarks.parm_testbed import run_seed, shuffle_events, shuffle_horizon_s, shuffle_transitions
from benchmarks.sim_testbed import (
    FULL,
    QUICK,
    Overheads,
    compare_point,
    default_testbed,
    frontends_needed,
    knee_reason,
    projection_limit,
    shard_plan,
    sim_config,
    steal_free_line,
    verdict,
    windows_from_transitions,
)
from benchmarks.sim_testbed import testbed_inputs as replay_inputs  # not a test: renamed
from parityserve.bench.loadgen import poisson_schedule

TESTBED = {"seed": 0, "queries_per_point": 500, "reactive_ms": 60.0,
           "shuffle": {"concurrent": 4, "size_mb": [128, 256], "gbps": 1.5, "delay_ms": 50.0,
                       "cluster_slots": 18}}


def _point(**kw: object) -> dict:
    base = {"case": "none", "mode": "none", "instances": 12, "rate": 100.0, "n": 6000,
            "offered_qps": 100.0, "throughput_qps": 99.0, "p50_ms": 32.0, "p99_ms": 80.0,
            "p999_ms": 95.0}
    return {**base, **kw}


def _sim(p50: float, p99: float, n: int = 2000) -> dict:
    return {"n": n, "p50_ms": p50, "p99_ms": p99, "p999_ms": p99 * 1.2}


def test_default_testbed_prefers_the_full_run(tmp_path) -> None:
    assert default_testbed(tmp_path) == tmp_path / QUICK
    (tmp_path / FULL).write_text("{}")
    assert default_testbed(tmp_path) == tmp_path / FULL


def test_windows_follow_the_switches_and_an_open_one_lasts_to_the_end() -> None:
    transitions = [(0.5, 3, True), (1.5, 3, False), (1.0, 7, True), (2.0, 3, True)]
    windows = windows_from_transitions(transitions, 0.05)
    assert windows[7] == [(1.0, math.inf, 0.05)]
    assert windows[3] == [(0.5, 1.5, 0.05), (2.0, math.inf, 0.05)]


def test_a_replayed_run_has_the_testbeds_own_arrivals_and_shuffles() -> None:
    # parm_testbed._point draws both from fresh generators on run_seed(seed, rep, rate).
    arrivals, windows = replay_inputs(TESTBED, 12, 250.0, 1)
    seed = run_seed(0, 1, 250.0)
    np.testing.assert_array_equal(arrivals, poisson_schedule(250.0, 500,
                                                             np.random.default_rng(seed)))
    events = shuffle_events(18, 4, shuffle_horizon_s(500, 250.0), 1.5,
                            np.random.default_rng(seed))
    expected = windows_from_transitions(shuffle_transitions(events, 12), 0.05)
    assert windows == expected
    assert windows and max(windows) < 12  # slots the 12-instance deployment lacks: not hit
    other, _ = replay_inputs(TESTBED, 12, 250.0, 2)
    assert not np.array_equal(arrivals, other)  # each repetition its own schedule


@pytest.mark.parametrize("name", ["none", "equal-resources-18", "replication-2", "reactive",
                                  "parm-k2", "parm-k4", "berrut", "systematic-berrut"])
def test_each_testbed_case_simulates_with_its_instance_count(name: str) -> None:
    case = next(c for c in tb.testbed_cases(
        ["none", "equal-resources", "replication", "reactive", "parm", "berrut",
         "systematic-berrut"], [2, 4], 12, 60.0) if c.name == name)
    config = sim_config(case.__dict__, 60.0, Overheads(0.6, 2.0, 0.1), {0: [(0.0, 1.0, 0.05)]})
    assert config.instances() == case.instances
    assert config.max_batch_size == 1 and config.slo_s == 60.0
    assert config.frontend_query_cpu_s == pytest.approx(0.0006)
    assert config.frontend_overhead_s == pytest.approx(0.002)
    if name == "reactive":
        assert config.reactive_timeout_s == pytest.approx(0.060)


def test_a_shard_scales_every_instance_kind() -> None:
    case = next(c for c in tb.testbed_cases(["parm"], [2], 12, 60.0))
    config = sim_config(case.__dict__, 60.0, Overheads(), {}, replicas=120)
    assert (config.replicas, config.parity_replicas(), config.instances()) == (120, 60, 180)


def test_knee_by_throughput_or_a_queued_median() -> None:
    assert knee_reason(_point(), idle_p50_ms=32.0) is None
    assert "served 90 of 100" in str(knee_reason(_point(throughput_qps=90.0), 32.0))
    assert "p50" in str(knee_reason(_point(p50_ms=70.0), 32.0))
    assert knee_reason(_point(p50_ms=63.0), 32.0) is None  # under 2x idle


def test_comparison_errors_medians_and_sample_counts() -> None:
    row = compare_point(_point(), [_sim(33.0, 88.0), _sim(35.0, 70.0), _sim(30.0, 84.0)], None)
    assert row["sim_p50_ms"] == 33.0 and row["sim_p99_ms"] == 84.0  # medians
    assert row["p50_error"] == pytest.approx(33 / 32 - 1)
    assert row["p99_error"] == pytest.approx(84 / 80 - 1)
    assert row["within"] and row["counted"]
    assert (row["measured_n"], row["sim_n"], row["repeats"]) == (6000, 6000, 3)
    assert not compare_point(_point(), [_sim(32.0, 89.0)], None)["within"]  # p99 +11%


def test_verdict_counts_points_below_the_knee_and_not_the_fitted_p50() -> None:
    good = compare_point(_point(), [_sim(32.5, 82.0)], None)
    fit = compare_point(_point(case="none"), [_sim(20.0, 81.0)], None, calibration=True)
    past = compare_point(_point(case="berrut"), [_sim(300.0, 900.0)], "served 90 of 100")
    assert "**met**: 2 of 2" in verdict([good, fit, past])
    bad = compare_point(_point(case="parm-k2"), [_sim(32.0, 60.0)], None)
    text = verdict([good, bad])
    assert "**missed**: 1 of 2" in text and "parm-k2" in text
    assert "nothing to validate" in verdict([past])


def test_the_steal_free_answers_are_compared_beside_the_target_not_in_it() -> None:
    stolen = _point(case="reactive", p99_ms=100.0, steal_share=0.04, clean_share=0.74,
                    clean_p50_ms=32.0, clean_p99_ms=85.0)
    row = compare_point(stolen, [_sim(32.0, 84.0)], None)
    assert not row["within"]  # -16% against every answer: the target still says missed
    assert row["clean_p99_error"] == pytest.approx(84 / 85 - 1) and row["clean_within"]
    assert "**missed**: 0 of 1" in verdict([row])
    line = steal_free_line([row])
    assert line is not None and line.startswith("Diagnostic, not the target")
    assert "1 of 1 points are within 10%" in line
    unmeasured = compare_point(_point(), [_sim(32.0, 80.0)], None)  # an older testbed run
    assert "clean_within" not in unmeasured and steal_free_line([unmeasured]) is None


def test_frontends_needed_keeps_each_shard_under_the_cap() -> None:
    assert frontends_needed(1000.0, 0.6) == 1  # 0.6 cores
    assert frontends_needed(10_000.0, 0.6) == 9  # 6 cores / 0.7
    assert frontends_needed(0.0, 0.6) == 1
    assert frontends_needed(10_000.0, 0.6, max_util=1.0) == 6


def test_shard_plan_splits_replicas_and_load() -> None:
    assert shard_plan(1000, 12, 18, 1) == (667, 1.0)
    assert shard_plan(1000, 12, 18, 10) == (67, 0.1)
    with pytest.raises(ValueError):
        shard_plan(1000, 12, 18, 0)


def test_projection_limits_name_what_was_not_measured() -> None:
    assert projection_limit(0.2, 0.15, 20, 12) is None
    assert "saturated" in str(projection_limit(8.3, 0.15, 20, 12))
    assert "measured up to 15%" in str(projection_limit(0.8, 0.15, 20, 12))
    assert "data replicas per frontend" in str(projection_limit(0.2, 0.15, 667, 12))


def test_replica_overhead_is_transport_plus_the_holds_overshoot() -> None:
    from benchmarks.sim_testbed import replica_overhead_ms

    idle = {"transport_ms_per_task": 0.4, "worker_hold_ms": 30.3, "profile_mean_ms": 30.0}
    assert replica_overhead_ms(idle) == pytest.approx(0.7)
    assert replica_overhead_ms({**idle, "worker_hold_ms": 29.0}) == pytest.approx(0.4)
    assert replica_overhead_ms({"transport_ms_per_task": None, "worker_hold_ms": None}) == 0.0


def test_a_missing_testbed_file_is_a_clear_error(tmp_path) -> None:
    from benchmarks.sim_testbed import main

    with pytest.raises(SystemExit, match="no testbed results at .*nope.json"):
        main(["--testbed", str(tmp_path / "nope.json"), "--results-dir", str(tmp_path)])


@pytest.mark.parametrize(("shuffle", "drawn"), [
    ({"delay_ms": 50.0}, ("constant", 2.0)),  # the committed constant runs name no distribution
    ({"delay_ms": 10.5, "delay_distribution": "exponential"}, ("exponential", 2.0)),
    ({"delay_ms": 3.5, "delay_distribution": "pareto", "tail_index": 3.0}, ("pareto", 3.0)),
])
def test_the_windows_are_drawn_as_the_testbed_drew_its_shuffle_slowdown(
        shuffle: dict, drawn: tuple[str, float]) -> None:
    case = next(c for c in tb.testbed_cases(["parm"], [2], 12, 60.0))
    config = sim_config(case.__dict__, 60.0, Overheads(), {0: [(0.0, 1.0, 0.05)]},
                        shuffle=shuffle)
    assert (config.window_distribution, config.window_tail_index) == drawn


def test_a_testbed_that_ran_no_none_case_is_calibrated_on_the_none_of_its_size() -> None:
    from benchmarks.sim_testbed import none_case

    ran = tb.testbed_cases(["none", "parm"], [2], 12, 60.0)
    with_none = {"cases": [c.__dict__ for c in ran], "deployed": 12, "reactive_ms": 60.0}
    without = {"cases": [c.__dict__ for c in ran[1:]], "deployed": 12, "reactive_ms": 60.0}
    assert none_case(without) == none_case(with_none) == ran[0].__dict__
    assert none_case({**without, "deployed": 24})["instances"] == 24


def _args(**kw: object):
    import argparse

    base = {"cpu_ms": None, "rpc_ms": None, "calibrated_on_idle": True, "idle_timer_ms": 0.2,
            "sim_seeds": 1}
    return argparse.Namespace(**{**base, **kw})


def _runs(*runs: tuple[int, float | None, float | None]) -> list[dict]:
    return [{"rep": rep, "frontend_cpu_us": cpu, "transport_ms_per_task": transport,
             "worker_hold_ms": 31.0} for rep, cpu, transport in runs]


BASE = Overheads(cpu_ms=9.0, latency_ms=0.5, rpc_ms=1.1)


def test_each_repetition_is_replayed_with_its_own_cpu_and_transport() -> None:
    from benchmarks.sim_testbed import run_overheads

    point = _point(repeats=3, frontend_cpu_us=1500.0, transport_ms_per_task=1.2,
                   run_overheads=_runs((0, 1000.0, 1.0), (1, 1500.0, 1.2), (2, 2000.0, 1.4)))
    assert run_overheads(point, 2, BASE, _args()) == Overheads(2.0, 0.5, pytest.approx(1.6))
    assert run_overheads(point, 0, BASE, _args()) == Overheads(1.0, 0.5, pytest.approx(1.2))


def test_runs_are_found_by_their_number_not_their_place() -> None:
    from benchmarks.sim_testbed import replayed_reps, run_overheads

    # repetition 0 was never saved: 1 and 2 keep their own figures
    point = _point(repeats=2, frontend_cpu_us=1500.0,
                   run_overheads=_runs((1, 1000.0, 1.0), (2, 2000.0, 1.4)))
    assert replayed_reps(point, 3) == [1, 2]
    assert replayed_reps(point, 1) == [1]  # --quick: one repetition
    assert run_overheads(point, 2, BASE, _args()) == Overheads(2.0, 0.5, pytest.approx(1.6))
    # a testbed JSON from before per-run overheads: repetitions 0.., the point's figures
    old = _point(repeats=3, frontend_cpu_us=1500.0)
    assert replayed_reps(old, 3) == [0, 1, 2]
    assert run_overheads(old, 1, BASE, _args()) == Overheads(1.5, 0.5, 1.1)


def test_a_run_without_its_own_transport_holds_for_the_idle_figure() -> None:
    from benchmarks.sim_testbed import own_transport, point_rpc_ms, run_overheads

    # a resumed run file: repetition 0 predates transports, repetition 1 has one
    point = _point(repeats=2, frontend_cpu_us=1500.0, transport_ms_per_task=1.4,
                   run_overheads=_runs((0, 1000.0, None), (1, 2000.0, 1.4)))
    assert run_overheads(point, 0, BASE, _args()) == Overheads(1.0, 0.5, 1.1)
    assert not own_transport(point, 0, _args()) and own_transport(point, 1, _args())
    # --rpc-ms (which calibration makes the base figure), or no idle point to take the
    # timer from: the one figure, everywhere
    fixed = Overheads(cpu_ms=9.0, latency_ms=0.5, rpc_ms=0.7)
    assert point_rpc_ms(point, fixed, _args(rpc_ms=0.7), 1) == 0.7
    assert not own_transport(point, 1, _args(rpc_ms=0.7))
    assert point_rpc_ms(point, BASE, _args(calibrated_on_idle=False), 1) == 1.1
    assert run_overheads(point, 1, BASE, _args(cpu_ms=0.3)).cpu_ms == 0.3


def test_validation_replays_every_run_with_that_runs_overheads(monkeypatch, tmp_path) -> None:
    import benchmarks.sim_testbed as st
    from benchmarks.tail import Checkpoint

    replayed: dict[int, Overheads] = {}

    def fake_replay(testbed, case, rate, rep, profile, overheads, sim_seed):
        replayed[rep] = overheads
        return _sim(33.0, 50.0)

    monkeypatch.setattr(st, "_replay", fake_replay)
    case = next(c for c in tb.testbed_cases(["parm"], [2], 12, 60.0))
    point = _point(case=case.name, mode="parm", instances=18, repeats=2,
                   frontend_cpu_us=1500.0, transport_ms_per_task=1.2,
                   run_overheads=_runs((0, 1000.0, 1.0), (2, 2000.0, None)))
    testbed = {**TESTBED, "cases": [case.__dict__], "points": [point]}
    saved = Checkpoint(tmp_path / "sims.jsonl", {"t": 1}, resume=False)
    profile = st.ServiceProfile.from_emulation(st.profile_named("parm-gpu-resnet18"), 1)
    (row,) = st._validate(testbed, profile, BASE, 3, saved, _args())
    assert replayed == {0: Overheads(1.0, 0.5, pytest.approx(1.2)), 2: Overheads(2.0, 0.5, 1.1)}
    assert (row["replayed_runs"], row["own_transport_runs"]) == (2, 1)
    text = st._held_text({"overheads_ms": BASE.__dict__, "cpu_ms": None, "rpc_ms": None,
                          "rows": [row], "idle": {"worker_hold_ms": 30.2,
                                                  "profile_mean_ms": 30.0}})
    assert "each run's own measured transport" in text and "in 1 of the 2 replayed runs" in text
    assert "own measured frontend CPU" in text
