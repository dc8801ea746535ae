"""Tail-aware choice: the simulator's interference hook against the reference queue, and the
cheapest configuration whose simulated p99 meets an SLO."""

from __future__ import annotations

import math

import numpy as np
import pytest

from parityserve.core.profiling import Measurement
from parityserve.core.queueing import Config, md_interf_c
from parityserve.core.simulate import ServiceProfile, SimConfig, simulate
from parityserve.core.tail_choice import choose_for_p99, simulated_tail
from tests.unit.core.queue_des import fifo_latencies


def _m(c: int, intra: int, mean_s: float, samples: tuple[float, ...] | None = None
       ) -> Measurement:
    return Measurement(c, intra, 10, mean_s, 1.0 / mean_s, mean_s, mean_s, 0,
                       samples if samples is not None else (mean_s,))


@pytest.mark.parametrize(("times", "rate"), [
    ((0.010, 0.020), 60.0),          # strong interference
    ((0.010, 0.012, 0.015), 150.0),
    ((0.004,), 200.0),               # c = 1: M/D/1
])
def test_the_simulator_with_interference_is_the_reference_queue_query_by_query(
        times, rate) -> None:
    """Deterministic service fixed by the concurrency at the start: the simulator driving the
    real scheduler and tests/unit/core/queue_des.py give every query the same latency."""
    rng = np.random.default_rng(7)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, 3000))
    by_k = {k: ServiceProfile.constant(t * 1e3) for k, t in enumerate(times, start=1)}
    c = len(times)
    result = simulate(SimConfig(replicas=c, parallelism=c, max_batch_size=1, slo_s=1e9),
                      by_k[1], arrivals, np.random.default_rng(0), by_concurrency=by_k)
    np.testing.assert_allclose(result.latency_s, fifo_latencies(arrivals, list(times)),
                               rtol=1e-9, atol=1e-12)


def test_parity_tasks_and_no_hook_keep_the_single_profile() -> None:
    arrivals = np.arange(1, 50) * 0.05  # no overlap: every query runs alone
    result = simulate(SimConfig(replicas=2, max_batch_size=1, slo_s=1e9),
                      ServiceProfile.constant(3.0), arrivals, np.random.default_rng(0))
    np.testing.assert_allclose(result.latency_s, 0.003)


def test_the_simulated_mean_agrees_with_the_queueing_model() -> None:
    ms = [_m(1, 1, 0.010), _m(2, 1, 0.014)]
    estimate = simulated_tail(ms, Config(2, 1), 100.0, queries=20_000, seed=1)
    predicted = md_interf_c(100.0, [100.0, 1 / 0.014]).latency
    assert estimate.mean_s == pytest.approx(predicted, rel=0.03)
    assert estimate.p99_s > estimate.mean_s and estimate.n == 18_000


# Profile: one thread takes 10 ms, two threads 6 ms; two requests at once 12 ms each.
PROFILE = [_m(1, 1, 0.010), _m(2, 1, 0.012), _m(1, 2, 0.006)]


def test_the_cheapest_configuration_that_meets_the_slo_wins() -> None:
    # At 20/s every configuration meets 40 ms; (1, 1) uses one core.
    choice = choose_for_p99(PROFILE, 20.0, 0.040, cores=2, queries=3000)
    assert choice.chosen is not None and choice.chosen.config == Config(1, 1)
    assert {e.config for e in choice.candidates} == {Config(1, 1), Config(2, 1), Config(1, 2)}
    # (1, 2) has the lower p99, but costs two cores
    lowest = min(choice.candidates, key=lambda e: e.p99_s)
    assert lowest.config == Config(1, 2) and lowest.p99_s < choice.chosen.p99_s


def test_a_tighter_slo_costs_more_cores() -> None:
    # 5/s, p99 <= 11.5 ms: (1, 1) waits too often behind 10 ms; (2, 1) runs two at 12 ms
    choice = choose_for_p99(PROFILE, 5.0, 0.0115, cores=2, queries=3000)
    assert choice.chosen is not None and choice.chosen.config == Config(1, 2)


def test_an_unstable_configuration_is_not_simulated_and_never_chosen() -> None:
    # 110/s: (1, 1) can serve only 100/s
    choice = choose_for_p99(PROFILE, 110.0, 1.0, cores=2, queries=3000)
    unstable = next(e for e in choice.candidates if e.config == Config(1, 1))
    assert not unstable.stable and unstable.n == 0 and math.isinf(unstable.mean_s)
    assert choice.chosen is not None and choice.chosen.config != Config(1, 1)


def test_no_configuration_meets_an_impossible_slo() -> None:
    choice = choose_for_p99(PROFILE, 20.0, 0.001, cores=2, queries=1000)
    assert choice.chosen is None and len(choice.candidates) == 3


def test_the_same_seed_gives_the_same_answer() -> None:
    a = simulated_tail(PROFILE, Config(2, 1), 120.0, queries=2000, seed=3)
    assert a == simulated_tail(PROFILE, Config(2, 1), 120.0, queries=2000, seed=3)


def test_the_overhead_outside_the_queue_adds_to_every_query() -> None:
    plain = [_m(1, 1, 0.010)]
    slow = [Measurement(1, 1, 10, 0.010, 100.0, 0.010, 0.010, 0, (0.010,), overhead_s=0.002)]
    a = simulated_tail(plain, Config(1, 1), 30.0, queries=2000)
    b = simulated_tail(slow, Config(1, 1), 30.0, queries=2000)
    assert b.mean_s == pytest.approx(a.mean_s + 0.002) and b.p99_s == pytest.approx(
        a.p99_s + 0.002)


def test_measured_samples_spread_the_tail() -> None:
    spread = [_m(1, 1, 0.010, (0.005, 0.005, 0.005, 0.025))]
    fixed = [_m(1, 1, 0.010)]
    assert simulated_tail(spread, Config(1, 1), 30.0, queries=4000).p99_s > \
        simulated_tail(fixed, Config(1, 1), 30.0, queries=4000).p99_s


@pytest.mark.parametrize(("rate", "slo", "queries", "match"), [
    (0.0, 0.1, 1000, "arrival_rate"), (math.inf, 0.1, 1000, "arrival_rate"),
    (10.0, 0.0, 1000, "slo_p99_s"), (10.0, 0.1, 50, "queries")])
def test_bad_inputs_are_refused(rate, slo, queries, match) -> None:
    with pytest.raises(ValueError, match=match):
        choose_for_p99(PROFILE, rate, slo, cores=2, queries=queries)
