"""SERF's latency model with an idle penalty: a request that starts on a server that has
been idle computes slower than one that follows another back to back. Our extension, beside
the paper's Eq. 13 (``core/queueing``), never instead of it.

Why it exists: on this project's 2-core VM the median ResNet-20 forward pass took 2.64 ms
when calls followed each other and 3.2-3.4 ms (1.21-1.27x) after 5-50 ms of sleep, in one
process with no server involved (``python -m benchmarks.serf_noise``, part ``cold``). SERF
profiles μ_i in a closed loop, where a server is never idle for long; sparse open-loop arrivals
mostly find it idle. Eq. 13 then under-predicts at low load, while under sustained load
(back-to-back service) the closed-loop profile over-predicts. The model below takes both from
measurements:

* ``busy_rates``: μ_i^busy, the per-request rate with i running and one more queued, so
  each slot starts its next request as soon as it frees (no idle gap).
* ``slot_curve``: the extra slot time Δ(g) of a request that starts after its server was idle
  for g, measured at c = 1 for a few gaps (``IdleCurve``: piecewise linear through (0, 0) and
  the measured points, flat beyond the last).
* ``overhead_curve``: the same for the time outside the slot (client, HTTP, frontend), as a
  function of the time since the previous arrival.

The queue, c = 1, exactly: an M/G/1 queue whose first customer of a busy period has its own
service time (Welch 1964). The idle period of M/G/1 is Exp(λ), so the first customer's
service is S0 = 1/μ + Δ(G) with G ~ Exp(λ). With PASTA, P0 = (1 − λ/μ) / (1 + λ·E[Δ]), and
by the work-conservation argument W_q = λ·(P0·E[S0²] + (1 − P0)/μ²) / (2·(1 − λ/μ)).

c > 1, an approximation: every service time is inflated by q·E[Δ(G)], where q is the
probability of starting on an idle slot, solved as a fixed point q = 1 − P_wait(q), and the
inflated rates go through Eq. 13. G ~ Exp(λ) is exact for the slot the scheduler fills
first (it takes every arrival while idle) and optimistic for the others, which sit idle
longer. Against a discrete-event simulation of the same queue
(``tests/unit/core/test_idle_queueing.py``) Welch's form is exact at c = 1, and the approximation
is within 10% for c = 2..4 at ρ ≤ 0.85 (0.91-1.05x; Eq. 13 alone is 0.61-0.91x there).

Pure arithmetic: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from parityserve.core.queueing import Prediction, predict_latency

__all__ = ["IdleCurve", "IdleInputs", "IdlePrediction", "Spaced", "idle_inputs",
           "predict_idle_aware"]

_BISECTIONS = 60  # q in [0, 1] to about 1e-18: far below any measurement's precision


@dataclass(frozen=True, slots=True)
class IdleCurve:
    """Extra time after an idle gap: Δ(0) = 0, linear between the measured (gap, extra)
    points, and the last extra beyond the last gap. Extras may be negative (noise, or a
    machine that runs faster after a pause); they are used as measured."""

    gaps_s: tuple[float, ...]
    extra_s: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.gaps_s) != len(self.extra_s) or not self.gaps_s:
            raise ValueError(f"an idle curve needs as many extras as gaps, at least one "
                             f"(got {len(self.gaps_s)} gaps, {len(self.extra_s)} extras)")
        if any(not (math.isfinite(g) and g > 0) for g in self.gaps_s):
            raise ValueError(f"idle gaps must be finite and > 0, got {self.gaps_s}")
        if any(b <= a for a, b in zip(self.gaps_s, self.gaps_s[1:], strict=False)):
            raise ValueError(f"idle gaps must increase, got {self.gaps_s}")
        if any(not math.isfinite(e) for e in self.extra_s):
            raise ValueError(f"idle extras must be finite, got {self.extra_s}")

    @classmethod
    def flat(cls) -> IdleCurve:
        """No penalty at any gap."""
        return cls((1.0,), (0.0,))

    def _pieces(self) -> list[tuple[float, float, float, float]]:
        """(a, Δ(a), b, Δ(b)) of each linear piece, from (0, 0) to the last measured point."""
        knots = ((0.0, 0.0), *zip(self.gaps_s, self.extra_s, strict=True))
        return [(a, da, b, db) for (a, da), (b, db) in zip(knots, knots[1:], strict=False)]

    def at(self, gap_s: float) -> float:
        """Δ(gap) by the rule above."""
        for a, da, b, db in self._pieces():
            if gap_s <= b:
                return da + (db - da) * (max(gap_s, a) - a) / (b - a)
        return self.extra_s[-1]

    def moments(self, rate: float) -> tuple[float, float]:
        """(E[Δ(G)], E[Δ(G)²]) for G ~ Exp(``rate``), in closed form per linear piece
        (rate 0: G is infinite, so the last extra)."""
        if not (math.isfinite(rate) and rate >= 0):
            raise ValueError(f"rate must be a finite number >= 0, got {rate!r}")
        if rate == 0:
            return self.extra_s[-1], self.extra_s[-1] ** 2
        first = second = 0.0
        for a, da, b, db in self._pieces():
            slope = (db - da) / (b - a)
            alpha = da - slope * a  # Δ(g) = alpha + slope·g on [a, b]
            p, m1, m2 = _exp_piece(rate, a, b)
            first += alpha * p + slope * m1
            second += alpha * alpha * p + 2 * alpha * slope * m1 + slope * slope * m2
        tail = math.exp(-rate * self.gaps_s[-1])
        first += self.extra_s[-1] * tail
        second += self.extra_s[-1] ** 2 * tail
        return first, second


def _exp_piece(rate: float, a: float, b: float) -> tuple[float, float, float]:
    """∫_a^b g^k·λe^{-λg} dg for k = 0, 1, 2."""
    ea, eb = math.exp(-rate * a), math.exp(-rate * b)
    inv = 1.0 / rate
    p = ea - eb
    m1 = (a + inv) * ea - (b + inv) * eb
    m2 = (a * a + 2 * a * inv + 2 * inv * inv) * ea - (b * b + 2 * b * inv + 2 * inv * inv) * eb
    return p, m1, m2


@dataclass(frozen=True, slots=True)
class IdlePrediction:
    """Mean latency with idle penalties: ``latency`` = the queue's W + ``overhead``.

    ``idle_start`` is the probability that a request starts on an idle slot (P0 at c = 1,
    the fixed point q beyond), ``slot_extra`` the mean extra slot time of such a request,
    ``overhead`` the mean time outside the slot (the closed-loop overhead plus its idle
    extra). ``queue`` is the Eq. 13 prediction behind it (for c > 1: on the inflated rates).
    """

    latency: float
    queue_latency: float
    overhead: float
    idle_start: float
    slot_extra: float
    stable: bool
    queue: Prediction | None


def predict_idle_aware(arrival_rate: float, busy_rates: Sequence[float], slot_curve: IdleCurve,
                       *, overhead_s: float = 0.0,
                       overhead_curve: IdleCurve | None = None) -> IdlePrediction:
    """Mean latency of c = len(``busy_rates``) slots at Poisson rate λ with idle penalties
    (see the module docstring). ``overhead_s`` is the time outside the slot when arrivals
    follow each other closely; ``overhead_curve`` its extra after a gap since the previous
    arrival. Raises ValueError for a bad rate or an empty rate list."""
    if not (math.isfinite(arrival_rate) and arrival_rate >= 0):
        raise ValueError(f"arrival_rate must be a finite number >= 0, got {arrival_rate!r}")
    rates = tuple(float(r) for r in busy_rates)
    if not rates or any(not (math.isfinite(r) and r > 0) for r in rates):
        raise ValueError(f"busy_rates must be finite rates > 0, one per slot, got {rates}")
    delta, delta_sq = slot_curve.moments(arrival_rate)
    outside = overhead_s + (overhead_curve.moments(arrival_rate)[0] if overhead_curve else 0.0)
    if len(rates) == 1:
        return _welch(arrival_rate, rates[0], delta, delta_sq, outside)
    return _inflated(arrival_rate, rates, delta, outside)


def _unstable(outside: float, delta: float) -> IdlePrediction:
    return IdlePrediction(math.inf, math.inf, outside, 0.0, delta, False, None)


def _welch(rate: float, mu: float, delta: float, delta_sq: float,
           outside: float) -> IdlePrediction:
    """M/G/1 with an exceptional first service (Welch 1964), deterministic otherwise."""
    s = 1.0 / mu
    rho = rate * s
    if rho >= 1.0:
        return _unstable(outside, delta)
    p0 = (1.0 - rho) / (1.0 + rate * delta)
    if p0 <= 0.0:  # a negative mean extra so large that the first service is negative
        raise ValueError(f"idle curve gives a first service of {s + delta:.3g} s; the "
                         "measured extras are not consistent with the busy rate")
    first_sq = s * s + 2 * s * delta + delta_sq
    wait = rate * (p0 * first_sq + (1.0 - p0) * s * s) / (2.0 * (1.0 - rho))
    queue = wait + p0 * (s + delta) + (1.0 - p0) * s
    return IdlePrediction(queue + outside, queue, outside, p0, delta, True, None)


def _inflated(rate: float, rates: tuple[float, ...], delta: float,
              outside: float) -> IdlePrediction:
    """Eq. 13 on rates whose service times grow by q·E[Δ], q = 1 − P_wait at the fixed
    point (found by bisection: the gap q − (1 − P_wait(q)) grows with q)."""
    def solve(q: float) -> Prediction | None:
        inflated = [1.0 / (1.0 / r + q * delta) for r in rates]
        if any(not (math.isfinite(r) and r > 0) for r in inflated):
            return None
        return predict_latency(rate, inflated, "md-interf")

    low, high = 0.0, 1.0
    for _ in range(_BISECTIONS):
        q = 0.5 * (low + high)
        found = solve(q)
        idle = 0.0 if found is None or not found.stable else 1.0 - found.wait_probability
        low, high = (low, q) if q > idle else (q, high)
    best = solve(low)
    if best is None or not best.stable:
        return _unstable(outside, delta)
    return IdlePrediction(best.latency + outside, best.latency, outside, low, delta, True, best)


# ---------------------------------------------------------------- from a profile


@dataclass(frozen=True, slots=True)
class Spaced:
    """One spaced run at c = 1: each request sent ``sleep_s`` after the previous answer;
    the means of its slot time (dispatch to result, at the frontend) and of its round trip
    at the client."""

    sleep_s: float
    slot_s: float
    client_s: float


@dataclass(frozen=True, slots=True)
class IdleInputs:
    """What ``predict_idle_aware`` needs for one thread count, derived from a profile."""

    busy_rates: tuple[float, ...]
    slot_curve: IdleCurve
    overhead_curve: IdleCurve
    overhead_s: float

    def to_dict(self) -> dict[str, Any]:
        """The JSON form a profile's ``idle`` section keeps per intra (``from_dict`` reads
        it back; the profiler adds its raw measurements beside these keys)."""
        return {"busy_rates": list(self.busy_rates), "overhead_s": self.overhead_s,
                "slot_curve": asdict(self.slot_curve),
                "overhead_curve": asdict(self.overhead_curve)}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> IdleInputs:
        def curve(part: Mapping[str, Any]) -> IdleCurve:
            return IdleCurve(tuple(part["gaps_s"]), tuple(part["extra_s"]))

        return cls(tuple(float(r) for r in doc["busy_rates"]), curve(doc["slot_curve"]),
                   curve(doc["overhead_curve"]), float(doc["overhead_s"]))


def idle_inputs(busy_slot_s: Sequence[float], closed_slot_s: float, closed_overhead_s: float,
                spaced: Sequence[Spaced]) -> IdleInputs:
    """The curves from the profiler's measurements (``bench/profiler``), for one intra.

    ``busy_slot_s[i-1]``: the mean slot time with i running and one more queued (no gap);
    ``closed_slot_s`` / ``closed_overhead_s``: SERF's own closed-loop run at c = 1, where a
    slot idles while the answer travels back and the next request comes in, i.e. for the
    overhead. So the slot curve's points are (overhead, closed − busy) and, per spaced run,
    (sleep + overhead, slot − busy). The overhead curve is keyed by the time between arrivals
    (a closed loop's is its round trip, the reference: extra 0), per spaced run
    (sleep + round trip, outside − the closed loop's outside). Points whose gap does not
    grow are dropped (a spaced run that came back faster than a shorter one's)."""
    if not busy_slot_s or any(not (math.isfinite(s) and s > 0) for s in busy_slot_s):
        raise ValueError(f"busy slot times must be finite and > 0, got {list(busy_slot_s)}")
    busy = busy_slot_s[0]
    slot = [(closed_overhead_s, closed_slot_s - busy)]
    slot += [(run.sleep_s + closed_overhead_s, run.slot_s - busy) for run in spaced]
    outside = [(closed_slot_s + closed_overhead_s, 0.0)]
    outside += [(run.sleep_s + run.client_s, run.client_s - run.slot_s - closed_overhead_s)
                for run in spaced]
    return IdleInputs(tuple(1.0 / s for s in busy_slot_s), _curve(slot), _curve(outside),
                      closed_overhead_s)


def _curve(points: Sequence[tuple[float, float]]) -> IdleCurve:
    kept: list[tuple[float, float]] = []
    for gap, extra in sorted(points):
        if gap > 0 and (not kept or gap > kept[-1][0]):
            kept.append((gap, extra))
    if not kept:
        return IdleCurve.flat()
    gaps, extras = zip(*kept, strict=True)
    return IdleCurve(tuple(gaps), tuple(extras))
