"""SERF's model with idle penalties (core/idle_queueing.py), our extension.

Oracles: numerical integration for the curve's moments, Eq. 13 itself when there is no
penalty, Welch's first-customer queue against a discrete-event simulation of the same queue
at c = 1, and the approximation for c > 1 against that simulation within a stated bound.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parityserve.core.idle_queueing import (
    IdleCurve,
    IdleInputs,
    Spaced,
    idle_inputs,
    predict_idle_aware,
)
from parityserve.core.queueing import predict_latency
from tests.unit.core.queue_des import fifo_latencies_idle

FAST = settings(max_examples=60, deadline=None)
# A penalty shaped as measured on this project's VM for ResNet-20 (1 thread): 2.7 ms back to
# back, about +0.3 ms after 1 ms idle, +1 ms after 5 ms, +2 ms from 10 ms on.
MEASURED_LIKE = IdleCurve((0.001, 0.005, 0.010), (0.0003, 0.001, 0.002))
BUSY_S = 0.0027


def _des_mean(rate: float, busy: list[float], curve: IdleCurve, n: int = 120_000,
              seed: int = 1) -> float:
    times = np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, n))
    lat = fifo_latencies_idle(times, busy, curve.at)
    return float(lat[n // 10:].mean())


curves = st.lists(st.tuples(st.floats(1e-4, 0.1), st.floats(-1e-3, 5e-3)), min_size=1,
                  max_size=5, unique_by=lambda p: round(p[0], 9)).map(
    lambda pts: IdleCurve(*map(tuple, zip(*sorted(pts), strict=True))))


@FAST
@given(curve=curves, rate=st.floats(0.5, 2000))
def test_moments_match_numerical_integration(curve: IdleCurve, rate: float) -> None:
    u = (np.arange(200_000) + 0.5) / 200_000  # G = -ln(1-u)/λ: u uniform on (0, 1)
    gaps = -np.log1p(-u) / rate
    values = np.array([curve.at(g) for g in gaps[::50]])  # every 50th node: still 4,000
    first, second = curve.moments(rate)
    assert first == pytest.approx(values.mean(), abs=2e-5 + 0.01 * abs(values).max())
    assert second == pytest.approx((values ** 2).mean(), abs=2e-7 + 0.01 * (values ** 2).max())


def test_curve_is_linear_between_points_and_flat_beyond() -> None:
    curve = IdleCurve((0.002, 0.01), (0.001, 0.003))
    assert curve.at(0.0) == 0.0
    assert curve.at(0.001) == pytest.approx(0.0005)
    assert curve.at(0.006) == pytest.approx(0.002)
    assert curve.at(1.0) == 0.003
    assert curve.moments(0.0) == (0.003, 0.003 ** 2)  # no arrivals: every gap is infinite


@pytest.mark.parametrize(("gaps", "extras", "why"), [
    ((), (), "at least one"), ((0.01,), (0.1, 0.2), "as many"), ((0.0,), (0.1,), "> 0"),
    ((0.02, 0.01), (0.1, 0.2), "increase"), ((0.01,), (math.nan,), "finite")])
def test_bad_curves_are_refused(gaps: tuple[float, ...], extras: tuple[float, ...],
                                why: str) -> None:
    with pytest.raises(ValueError, match=why):
        IdleCurve(gaps, extras)


@FAST
@given(mu=st.lists(st.floats(1.0, 1e3), min_size=1, max_size=4), load=st.floats(0.01, 0.95))
def test_no_penalty_is_eq13(mu: list[float], load: float) -> None:
    mu = sorted(mu, reverse=True)  # interference never speeds a request up
    rate = load * len(mu) * mu[-1]
    got = predict_idle_aware(rate, mu, IdleCurve.flat())
    assert got.latency == pytest.approx(predict_latency(rate, mu, "md-interf").latency,
                                        rel=1e-9)


@pytest.mark.parametrize(("load", "tolerance"),
                         [(0.05, 0.02), (0.2, 0.02), (0.4, 0.02), (0.6, 0.02), (0.8, 0.04)])
def test_welch_at_one_slot_matches_simulation(load: float, tolerance: float) -> None:
    """Exact up to the simulation's own error, which grows with the load (at 0.8, three
    seeds of 600,000 arrivals gave 0.99-1.02x)."""
    rate = load / BUSY_S
    predicted = predict_idle_aware(rate, [1 / BUSY_S], MEASURED_LIKE).latency
    assert predicted == pytest.approx(_des_mean(rate, [BUSY_S], MEASURED_LIKE),
                                      rel=tolerance)


@pytest.mark.parametrize("c", [2, 3, 4])
@pytest.mark.parametrize("load", [0.1, 0.3, 0.5, 0.7, 0.85])
def test_approximation_for_several_slots_is_within_10_percent(c: int, load: float) -> None:
    """The stated bound of the c > 1 approximation, on an interference profile (each slot
    slower by 15% per request beside it) and the measured-like penalty. Measured: 0.91-1.05x
    the simulation; the lowest at c = 4, ρ = 0.3, where the slots the scheduler fills last
    sit idle longer than Exp(λ) and pay more than the model's mean penalty."""
    busy = [BUSY_S * (1 + 0.15 * i) for i in range(c)]
    rate = load * c / busy[-1]
    predicted = predict_idle_aware(rate, [1 / s for s in busy], MEASURED_LIKE).latency
    assert predicted == pytest.approx(_des_mean(rate, busy, MEASURED_LIKE), rel=0.10)


def test_penalty_moves_the_prediction_where_eq13_cannot() -> None:
    """Sparse arrivals pay nearly the whole penalty; a busy queue nearly none of it."""
    mu = 1 / BUSY_S
    sparse = predict_idle_aware(1.0, [mu], MEASURED_LIKE)
    assert sparse.latency == pytest.approx(BUSY_S + 0.002, rel=0.01)
    assert sparse.idle_start == pytest.approx(1.0, abs=0.01)
    assert sparse.slot_extra == pytest.approx(0.002, rel=0.02)  # gaps of about a second
    assert sparse.queue_latency == pytest.approx(sparse.latency - sparse.overhead)
    busy = predict_idle_aware(0.95 * mu, [mu], MEASURED_LIKE)
    assert busy.idle_start < 0.05


def test_overhead_curve_follows_the_arrival_gap() -> None:
    outside = IdleCurve((0.01,), (0.0005,))
    got = predict_idle_aware(1.0, [1 / BUSY_S], IdleCurve.flat(), overhead_s=0.0004,
                             overhead_curve=outside)
    assert got.overhead == pytest.approx(0.0004 + 0.0005, rel=0.01)


def test_unstable_and_bad_inputs() -> None:
    assert math.isinf(predict_idle_aware(500.0, [400.0], MEASURED_LIKE).latency)
    assert not predict_idle_aware(900.0, [400.0, 400.0], MEASURED_LIKE).stable
    with pytest.raises(ValueError, match="busy_rates"):
        predict_idle_aware(1.0, [], MEASURED_LIKE)
    with pytest.raises(ValueError, match="arrival_rate"):
        predict_idle_aware(-1.0, [1.0], MEASURED_LIKE)


def test_inputs_from_a_profile() -> None:
    """Busy 2.7 ms; SERF's closed loop 3.0 ms slot with 0.5 ms outside; spaced runs slower."""
    spaced = [Spaced(0.005, 0.0040, 0.0047), Spaced(0.020, 0.0047, 0.0056)]
    got = idle_inputs([0.0027, 0.0030], 0.0030, 0.0005, spaced)
    assert got.busy_rates == pytest.approx((1 / 0.0027, 1 / 0.0030))
    assert got.slot_curve.gaps_s == pytest.approx((0.0005, 0.0055, 0.0205))
    assert got.slot_curve.extra_s == pytest.approx((0.0003, 0.0013, 0.0020))
    assert got.overhead_curve.gaps_s == pytest.approx((0.0035, 0.0097, 0.0256))
    assert got.overhead_curve.extra_s == pytest.approx((0.0, 0.0002, 0.0004))
    assert got.overhead_s == 0.0005


def test_inputs_drop_points_whose_gap_does_not_grow() -> None:
    spaced = [Spaced(0.010, 0.004, 0.005), Spaced(0.010, 0.005, 0.006)]
    got = idle_inputs([0.003], 0.003, 0.0005, spaced)
    assert len(got.slot_curve.gaps_s) == 2  # the closed loop's point and the first 10 ms run
    with pytest.raises(ValueError, match="busy slot"):
        idle_inputs([], 0.003, 0.0005, spaced)


def test_inputs_round_trip_through_their_json_form() -> None:
    got = idle_inputs([0.0027, 0.0030], 0.0030, 0.0005, [Spaced(0.005, 0.0040, 0.0047)])
    assert IdleInputs.from_dict(got.to_dict()) == got


def test_extras_that_would_make_a_first_service_negative_are_refused() -> None:
    """1 ms of service and a measured extra of -10 ms: the curve and the busy rate cannot
    both be right, and the model says so rather than predicting from them."""
    with pytest.raises(ValueError, match="not consistent with the busy rate"):
        predict_idle_aware(200.0, [1000.0], IdleCurve((0.001,), (-0.010,)))
