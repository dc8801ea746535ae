"""The discrete-event simulator (core/simulate.py): small, seeded, deterministic scenarios."""

from __future__ import annotations

import numpy as np
import pytest

from parityserve.core.faults import BurstSpec, FaultSpec
from parityserve.core.simulate import ServiceProfile, SimConfig, simulate
from parityserve.errors import ConfigError

FIVE_MS = ServiceProfile.constant(5.0)


def _poisson(rate: float, n: int, seed: int = 0) -> np.ndarray:
    return np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, n))


def _run(config: SimConfig, arrivals: np.ndarray, profile: ServiceProfile = FIVE_MS,
         seed: int = 1):
    return simulate(config, profile, arrivals, np.random.default_rng(seed))


def test_constant_service_without_faults_latency_is_the_service_time() -> None:
    arrivals = np.arange(50) * 0.010  # one query every 10 ms, 5 ms service: never a queue
    result = _run(SimConfig(replicas=1, slo_s=1.0), arrivals)
    np.testing.assert_allclose(result.latency_s, 0.005)
    assert result.how == ["direct"] * 50


def test_overheads_add_to_latency() -> None:
    arrivals = np.arange(20) * 0.010
    cfg = SimConfig(replicas=1, rpc_overhead_s=0.001, frontend_overhead_s=0.0005)
    np.testing.assert_allclose(_run(cfg, arrivals).latency_s, 0.0065)


def test_frontend_cpu_is_a_single_fifo_server() -> None:
    # 1 ms of frontend CPU per query: ten simultaneous queries reach the queue 1 ms apart;
    # with a replica each, they wait only for the frontend.
    cfg = SimConfig(replicas=10, frontend_query_cpu_s=0.001, slo_s=1.0)
    result = _run(cfg, np.zeros(10))
    np.testing.assert_allclose(np.sort(result.latency_s), 0.001 * np.arange(1, 11) + 0.005)
    assert result.utilisation["frontend"] > 0


def test_a_burst_of_queries_is_batched_by_aimd_and_decide_batch() -> None:
    arrivals = np.zeros(40)  # all at once: batches grow 1, 2, 3, ... as AIMD allows
    result = _run(SimConfig(replicas=1, max_batch_size=8, slo_s=10.0),
                  arrivals, ServiceProfile.constant(1.0, 0.1, 8))
    assert result.counters["batches"] < 40
    assert sorted(result.how) == ["direct"] * 40


def test_delayed_batching_holds_a_partial_batch() -> None:
    # Query 0 goes alone (AIMD starts at 1, so a batch of one is full) and its on-time full
    # batch grows the limit to 2; query 1 then waits the 2 ms delay for a second query.
    arrivals = np.array([0.0, 0.010])
    cfg = SimConfig(replicas=1, max_batch_size=4, max_delay_s=0.002, slo_s=1.0)
    result = _run(cfg, arrivals)
    np.testing.assert_allclose(result.latency_s, [0.005, 0.002 + 0.005])


def _slowed(mode: str, **kw: object) -> SimConfig:
    faults = {"0": FaultSpec(delay_ms=50.0)}
    return SimConfig(mode=mode, replicas=3 if mode != "none" else 2, faults=faults,
                     slo_s=2.0, max_batch_size=4, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode, kw", [("parm", {"k": 2}), ("replication", {"d": 2})])
def test_one_slow_replica_redundancy_cuts_the_tail(mode: str, kw: dict) -> None:
    arrivals = _poisson(60, 1500)
    base = _run(_slowed("none"), arrivals).summary()
    coded = _run(_slowed(mode, **kw), arrivals).summary()
    assert coded["p99_ms"] < 0.6 * base["p99_ms"], (coded["p99_ms"], base["p99_ms"])
    if mode == "parm":
        assert coded["answered"].get("parm-subtraction", 0) > 0
        assert coded["counters"]["tasks_parity"] > 0


def test_reactive_reissues_after_the_timeout() -> None:
    # Replica 0 takes 100 ms; the re-issue after 20 ms goes to idle replica 1 (5 ms).
    cfg = SimConfig(mode="reactive", replicas=2, reactive_timeout_s=0.020,
                    faults={"0": FaultSpec(delay_ms=95.0)}, slo_s=1.0)
    result = _run(cfg, np.array([0.0]))
    assert result.counters["reissues"] == 1
    np.testing.assert_allclose(result.latency_s[0], 0.025)
    # Fast enough: no re-issue at all.
    fast = _run(SimConfig(mode="reactive", replicas=2, reactive_timeout_s=0.020),
                np.array([0.0]))
    assert fast.counters["reissues"] == 0


def test_parm_decodes_when_a_data_batch_is_slow() -> None:
    # Two queries, two data replicas (0 slow) and one parity replica: the group of two
    # batches closes when full; query 0's answer is rebuilt from batch 1 and the parity.
    cfg = SimConfig(mode="parm", replicas=2, k=2, faults={"0": FaultSpec(delay_ms=100.0)},
                    slo_s=1.0)
    result = _run(cfg, np.array([0.0, 0.0]))
    assert result.how[0] == "parm-subtraction"
    np.testing.assert_allclose(result.latency_s, 0.005)


def test_parm_grace_delays_the_decode() -> None:
    cfg = SimConfig(mode="parm", replicas=2, k=2, parity_timeout_s=0.030,
                    faults={"0": FaultSpec(delay_ms=100.0)}, slo_s=1.0)
    result = _run(cfg, np.array([0.0, 0.0]))
    np.testing.assert_allclose(result.latency_s[0], 0.030)


@pytest.mark.parametrize("mode", ["none", "equal-resources", "replication", "reactive", "parm",
                                  "berrut", "systematic-berrut"])
def test_every_query_gets_exactly_one_answer_and_reruns_are_identical(mode: str) -> None:
    kw: dict = {"reactive_timeout_s": 0.01} if mode == "reactive" else {}
    burst = FaultSpec(burst=BurstSpec(every_ms=100, duration_ms=20, delay_ms=30))
    cfg = SimConfig(mode=mode, replicas=4, faults={"all": burst}, slo_s=0.5,
                    max_batch_size=8, **kw)
    arrivals = _poisson(400, 800, seed=3)
    profile = ServiceProfile("p", {1: [4.0, 5.0, 6.0], 8: [8.0, 10.0, 14.0]})
    a = _run(cfg, arrivals, profile)
    b = _run(cfg, arrivals, profile)
    assert len(a.how) == len(arrivals) and a.latency_s.shape == arrivals.shape
    assert all(h for h in a.how)  # answered (or a default at the deadline), exactly once
    assert np.isfinite(a.latency_s).all() and (a.latency_s > 0).all()
    assert (a.latency_s <= cfg.slo_s + 1e-12).all()
    np.testing.assert_array_equal(a.latency_s, b.latency_s)
    assert a.how == b.how and a.counters == b.counters


def test_queries_past_their_deadline_are_answered_by_default() -> None:
    arrivals = np.zeros(30)
    cfg = SimConfig(replicas=1, max_batch_size=1, slo_s=0.050)
    result = _run(cfg, arrivals)
    assert result.how.count("direct") == 10  # 5 ms each, 50 ms deadline
    assert set(result.how[10:]) <= {"expired", "late"}
    np.testing.assert_allclose(result.latency_s[10:], 0.050)


def test_profile_interpolates_and_extrapolates() -> None:
    p = ServiceProfile("p", {1: [1.0], 4: [4.0], 8: [6.0]})
    assert p.quantile_ms(2, 0.5) == pytest.approx(2.0)
    assert p.quantile_ms(6, 0.5) == pytest.approx(5.0)
    assert p.quantile_ms(16, 0.5) == pytest.approx(10.0)  # 0.5 ms per row past 8
    again = ServiceProfile.from_mapping(p.to_mapping())
    assert again.samples_ms == p.samples_ms


def test_config_checks() -> None:
    with pytest.raises(ConfigError):
        SimConfig(mode="reactive")
    with pytest.raises(ConfigError):
        SimConfig(mode="berrut", replicas=2, K=2, S=1)
    with pytest.raises(ConfigError):
        SimConfig(mode="nope")
    assert SimConfig(mode="parm", replicas=12, k=2).instances() == 18
    assert SimConfig(mode="equal-resources", replicas=12).instances() == 18


def test_delay_windows_slow_batches_that_start_inside_them() -> None:
    cfg = SimConfig(replicas=1, slo_s=1.0, delay_windows={0: [(0.010, 0.020, 0.030)]})
    result = _run(cfg, np.array([0.0, 0.015, 0.100]))
    np.testing.assert_allclose(result.latency_s, [0.005, 0.035, 0.005])


def test_cli_and_bench_helpers() -> None:
    from parityserve.bench.simulate import _tail_models, real_rows, sim_config
    from parityserve.cli import build_parser

    args = build_parser().parse_args(["bench", "simulate", "--quick", "--no-project"])
    assert args.quick and args.no_project and callable(args.func)
    doc = {"x": [{"mode": "parm", "p50_ms": 1.0, "p99_ms": 2.0, "rate": 10},
                 {"system": "raw", "p50_ms": 1.0, "p99_ms": 2.0}]}
    assert [r["mode"] for r in real_rows(doc)] == ["parm"]
    tail = {"models": {"mlp": {"points": [], "cases": [], "burst": {},
                               "inner": {"points": [], "cases": [], "burst": {}}}}}
    assert [sorted(t) for t in _tail_models(tail)] == [["burst", "cases", "inner", "points"]]
    assert list(_tail_models(doc)) == []
    burst = BurstSpec(every_ms=100, duration_ms=10, delay_ms=5)
    assert sim_config("none", 12, burst=burst).instances() == 12
    for mode in ("equal-resources", "replication", "parm", "berrut", "systematic-berrut"):
        assert sim_config(mode, 12, burst=burst).instances() == 18, mode
    assert sim_config("reactive", 12, burst=None, reactive_ms=5).reactive_timeout_s == 0.005


def test_host_cores_share_cpu_between_co_located_workers() -> None:
    arrivals = np.zeros(2)
    one_core = _run(SimConfig(replicas=2, host_cores=1.0, slo_s=1.0), arrivals)
    np.testing.assert_allclose(one_core.latency_s, [0.010, 0.010])  # half a core each
    two_cores = _run(SimConfig(replicas=2, host_cores=2.0, slo_s=1.0), arrivals)
    np.testing.assert_allclose(two_cores.latency_s, [0.005, 0.005])
    # Fault delays are sleeps: they take no CPU from the other worker.
    slept = _run(SimConfig(replicas=2, host_cores=1.0, slo_s=1.0,
                           faults={"0": FaultSpec(delay_ms=20.0)}), arrivals)
    np.testing.assert_allclose(sorted(slept.latency_s), [0.010, 0.030])


def test_cpu_fit_splits_background_from_the_marginal_cost_per_query() -> None:
    from parityserve.bench.simulate import fit_cpu_cost

    # 100 ms/s of background plus 0.5 ms per query, measured as ms per query at each rate
    rates = [100.0, 200.0, 400.0]
    fit = fit_cpu_cost(rates, [100 / r + 0.5 for r in rates])
    assert fit["background_ms_per_s"] == pytest.approx(100.0)
    assert fit["per_query_ms"] == pytest.approx(0.5)
    # noise that would make the background negative: the line goes through the origin
    noisy = fit_cpu_cost([100.0, 200.0], [0.4, 0.6])
    assert noisy["background_ms_per_s"] == 0.0
    assert noisy["per_query_ms"] == pytest.approx((100 * 40 + 200 * 120) / (100**2 + 200**2))
    # one load cannot split the two: all of it is charged per query
    assert fit_cpu_cost([150.0, 150.0], [1.0, 2.0]) == {"background_ms_per_s": 0.0,
                                                       "per_query_ms": 1.5}


@pytest.mark.parametrize(("rates", "costs"), [([], []), ([100.0], [1.0, 2.0]),
                                              ([0.0, 100.0], [1.0, 1.0]),
                                              ([100.0, 200.0], [1.0, float("nan")])])
def test_cpu_fit_refuses_what_it_cannot_fit(rates: list[float], costs: list[float]) -> None:
    from parityserve.bench.simulate import fit_cpu_cost

    with pytest.raises(ValueError):
        fit_cpu_cost(rates, costs)


def test_transport_is_the_round_trip_beyond_the_workers_own_time() -> None:
    from parityserve.bench.simulate import transport_ms_per_task

    before = [{"rid": "a", "round_trip_s": 1.0, "worker_s": 0.5, "served": 10}]
    after = [{"rid": "a", "round_trip_s": 1.3, "worker_s": 0.7, "served": 110},
             {"rid": "b", "round_trip_s": 0.2, "worker_s": 0.1, "served": 100}]  # new replica
    # (0.3 - 0.2) + (0.2 - 0.1) s over 200 tasks
    assert transport_ms_per_task(before, after) == pytest.approx(1.0)
    assert transport_ms_per_task(after, after) is None  # nothing finished in between


def test_calibration_takes_transport_measured_and_leaves_the_rest_outside_any_queue(
    tmp_path,
) -> None:
    import json

    from parityserve.bench import simulate as bench_sim
    from parityserve.cli import build_parser

    profile = {"model": "x", "samples_ms": {"1": [1.0]}, "cpu_samples_ms": {"1": [0.8]}}
    (tmp_path / "simulate-profile-mlp.json").write_text(json.dumps(profile))
    args = build_parser().parse_args(["bench", "simulate", "--results-dir", str(tmp_path),
                                      "--host-cores", "2", "--max-batch", "1"])

    def real(rate: float, cpu_ms: float) -> dict[str, float]:
        return {"p50_ms": 5.0, "p99_ms": 9.0, "frontend_cpu_ms_per_query": cpu_ms,
                "worker_cpu_ms_per_query": 1.0, "client_cpu_ms_per_query": 0.3,
                "transport_ms_per_task": 0.25}

    calibs = {150.0: real(150.0, 100 / 150 + 0.4), 600.0: real(600.0, 100 / 600 + 0.4)}
    overhead, sims = bench_sim._calibrate(args, bench_sim.load_profile(
        tmp_path / "simulate-profile-mlp.json"), calibs, 150.0, 3000)
    assert overhead["rpc"] == 0.25  # measured, not the p50 residual
    assert overhead["query_cpu"] + overhead["task_cpu"] == pytest.approx(0.4)  # marginal only
    assert overhead["cpu_fit"]["background_ms_per_s"] == pytest.approx(100.0)
    assert overhead["worker_cpu"] == pytest.approx(0.2) and overhead["host_cores"] == 2.0
    assert overhead["client_cpu"] == 0.3
    assert overhead["frontend"] > 2.0  # client and HTTP: latency that holds no replica
    assert sims[150.0]["p50_ms"] == pytest.approx(5.0, rel=0.05)  # calibrated to the real p50
    assert set(sims) == {150.0, 600.0}


def test_the_clients_cpu_competes_for_shared_cores_only() -> None:
    one = np.zeros(1)
    shared = _run(SimConfig(host_cores=1.0, slo_s=1.0, client_query_cpu_s=0.005), one)
    np.testing.assert_allclose(shared.latency_s, [0.010])  # the worker got half the core
    two_cores = _run(SimConfig(host_cores=2.0, slo_s=1.0, client_query_cpu_s=0.005), one)
    np.testing.assert_allclose(two_cores.latency_s, [0.005])
    unshared = _run(SimConfig(slo_s=1.0, client_query_cpu_s=0.005), one)  # a core each
    np.testing.assert_allclose(unshared.latency_s, [0.005])


def test_run_spread_is_range_over_median() -> None:
    from parityserve.bench.simulate import run_spread

    assert run_spread([4.0, 5.0, 6.0]) == pytest.approx(0.4)
    assert run_spread([3.0]) is None  # one run has no spread
    assert run_spread(None) is None


def test_compare_takes_the_spread_from_a_points_runs() -> None:
    """A stored tail point keeps its per-run figures: the validation row shows their spread,
    which says whether the real run itself can be checked to 10%."""
    from parityserve.bench.simulate import _compare

    real = {"p50_ms": 4.0, "p99_ms": 30.0, "p50_ms_runs": [4.0, 4.4, 3.6],
            "p99_ms_runs": [30.0, 30.0, 30.0]}
    row = _compare("tail.json none", "none", 2, 200.0, real, {"p50_ms": 4.2, "p99_ms": 31.0})
    assert row["real_p50_spread"] == pytest.approx(0.2)
    assert row["real_p99_spread"] == 0.0
    assert row["within_10pct"]


def test_validation_names_when_stored_runs_were_measured() -> None:
    from parityserve.bench.simulate import _references_note

    note = _references_note({"references": {"tail-mlp.json": "2026-11-21T10:23:46+00:00",
                                            "old.json": None}})
    assert "`tail-mlp.json` on 2026-11-21T10:23:46+00:00" in note
    assert "`old.json` on an unknown date" in note
    assert _references_note({}) == ""
