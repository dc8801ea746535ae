"""The discrete-event simulator (core/simulate.py): small, seeded, deterministic scenarios."""

from __future__ import annotations

import numpy as np
import pytest

from parityserve.core.emulation import ServiceProfile as EmulatedProfile
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


def _window_waits(distribution: str, n: int = 4000, seed: int = 1, **kw: float) -> np.ndarray:
    """What a window of mean 10 ms added to each of ``n`` lone batches (5 ms service, no
    queueing: arrivals 1 s apart)."""
    cfg = SimConfig(replicas=1, slo_s=100.0, window_distribution=distribution,
                    delay_windows={0: [(0.0, float("inf"), 0.010)]}, **kw)
    return _run(cfg, np.arange(n) * 1.0, seed=seed).latency_s - 0.005


def test_a_windows_delay_is_drawn_per_batch_with_the_windows_mean() -> None:
    constant = _window_waits("constant", n=50)
    np.testing.assert_allclose(constant, 0.010)
    exponential = _window_waits("exponential")
    assert exponential.std() > 0.008  # each batch its own draw, not one per window
    assert exponential.mean() == pytest.approx(0.010, rel=0.06)
    assert np.median(exponential) == pytest.approx(0.010 * np.log(2), rel=0.08)
    pareto = _window_waits("pareto", window_tail_index=3.0)
    assert pareto.mean() == pytest.approx(0.010, rel=0.15)
    # Heavier than the exponential of the same mean far out: P(D > 6 mean) is (1 + 6/2)^-3
    # = 1.6% for Lomax with a = 3 against e^-6 = 0.25%.
    assert (pareto > 0.060).mean() > 3 * (exponential > 0.060).mean()


def test_drawn_windows_replay_with_the_seed_and_leave_other_streams_alone() -> None:
    first, again = _window_waits("exponential", n=200), _window_waits("exponential", n=200)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, _window_waits("exponential", n=200, seed=2))
    # The waits come from a stream of their own (the seed's third child), so the service
    # times a run draws are the same whatever its windows draw.
    profile = ServiceProfile.from_emulation(EmulatedProfile("t", 5.0, 0.0, source="t", cv=0.3))
    arrivals = np.arange(300) * 1.0
    windows = {0: [(0.0, float("inf"), 0.010)]}
    constant = _run(SimConfig(replicas=1, slo_s=100.0, delay_windows=windows), arrivals,
                    profile).latency_s
    drawn = _run(SimConfig(replicas=1, slo_s=100.0, delay_windows=windows,
                           window_distribution="exponential"), arrivals, profile).latency_s
    stream = np.random.default_rng(1).spawn(3)[2]
    expected = np.array([stream.exponential(0.010) for _ in arrivals])
    np.testing.assert_allclose(drawn - constant + 0.010, expected, atol=1e-12)


@pytest.mark.parametrize(("settings", "match"), [
    ({"window_distribution": "gamma"}, "window_distribution must be one of .*got 'gamma'"),
    ({"window_distribution": "pareto", "window_tail_index": 1.0}, "window_tail_index must be > 1"),
])
def test_bad_window_settings_are_refused(settings: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        SimConfig(**settings)


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


def test_the_clients_cpu_competes_for_shared_cores_only() -> None:
    one = np.zeros(1)
    shared = _run(SimConfig(host_cores=1.0, slo_s=1.0, client_query_cpu_s=0.005), one)
    np.testing.assert_allclose(shared.latency_s, [0.010])  # the worker got half the core
    two_cores = _run(SimConfig(host_cores=2.0, slo_s=1.0, client_query_cpu_s=0.005), one)
    np.testing.assert_allclose(two_cores.latency_s, [0.005])
    unshared = _run(SimConfig(slo_s=1.0, client_query_cpu_s=0.005), one)  # a core each
    np.testing.assert_allclose(unshared.latency_s, [0.005])


@pytest.mark.parametrize("mode", ["berrut", "systematic-berrut"])
def test_berrut_group_wait_fills_groups_under_light_load(mode: str) -> None:
    # 100 q/s on 5 ms batches: a group formed the moment a replica is idle holds about one
    # query and costs K + S tasks; a 20 ms group wait packs several queries into each.
    arrivals = _poisson(100.0, 2000)
    runs = {}
    for wait in (0.0, 0.020):
        cfg = SimConfig(mode=mode, replicas=3, K=2, S=1, max_batch_size=8, slo_s=1.0,
                        berrut_group_wait_s=wait)
        runs[wait] = _run(cfg, arrivals)
    per_query = {w: (r.counters["tasks_coded"] + r.counters["tasks_data"]) / arrivals.size
                 for w, r in runs.items()}
    assert per_query[0.020] < 0.6 * per_query[0.0]
    # No query waits for its group longer than the wait: the bound is wait + one service.
    assert float(np.max(runs[0.020].latency_s)) <= 0.020 + 0.005 + 1e-9
    assert len(runs[0.020].how) == arrivals.size and "expired" not in runs[0.020].how


def test_berrut_group_wait_must_not_be_negative() -> None:
    with pytest.raises(ConfigError, match="berrut_group_wait_s"):
        SimConfig(mode="berrut", replicas=3, berrut_group_wait_s=-0.001)


def test_profile_from_an_emulated_accelerator_keeps_its_mean_and_spread() -> None:
    from parityserve.core.emulation import ServiceProfile as Emulated

    emulated = Emulated("gpu", base_ms=19.5, per_query_ms=10.5, cv=0.05, source="test")
    profile = ServiceProfile.from_emulation(emulated, max_batch=2, points=4000)
    for rows in (1, 2):
        samples = np.asarray(profile.samples_ms[rows])
        assert samples.mean() == pytest.approx(emulated.mean_ms(rows), rel=1e-3)
        assert samples.std() / samples.mean() == pytest.approx(0.05, rel=0.02)
    assert profile.median_ms(1) < 30.0  # a lognormal's median sits under its mean
    flat = ServiceProfile.from_emulation(
        Emulated("c", base_ms=5.0, per_query_ms=0.0, distribution="constant", source="t"))
    assert set(flat.samples_ms[1]) == {5.0} and flat.sizes == [1]
    with pytest.raises(ConfigError):
        ServiceProfile.from_emulation(emulated, points=0)
