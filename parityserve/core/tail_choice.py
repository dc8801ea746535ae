"""Tail-aware configuration choice, beyond SERF: the cheapest (c, intra) whose p99 meets an
SLO at a given load.

SERF's queueing model (``core/queueing``) predicts mean latency only. Here each allowed
configuration's p99 is predicted by the project's discrete-event simulator
(``core/simulate``), which drives the runtime's own scheduler, fed with the service times the
profiler timed: a task started while k requests run (itself included) draws from the samples
of tuple (k, intra), so interference is the profile's, as in the queueing model, and each
request also spends the profile's ``overhead_s`` outside the queue. Among the
configurations whose simulated p99 meets the SLO, the cheapest is the one with the fewest
cores busy (c·intra), then the lowest p99.

A configuration with λ ≥ c·μ_c is unstable (its queue, and so its p99, grows with the run)
and is not simulated. Pure: randomness comes from the seed, time is simulated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from parityserve.core.profiling import Measurement, profiles_from
from parityserve.core.queueing import Config, configurations
from parityserve.core.simulate import ServiceProfile, SimConfig, simulate

__all__ = ["TailChoice", "TailEstimate", "choose_for_p99", "simulated_tail", "tail_table"]

# No query may expire in the simulation: the deadline is far beyond any latency it reports.
_NO_DEADLINE_S = 1e9
_WARMUP_FRACTION = 0.1  # the simulated queue starts empty: drop its first tenth


@dataclass(frozen=True, slots=True)
class TailEstimate:
    """One configuration's simulated latency at one load (``math.inf`` when unstable)."""

    config: Config
    p99_s: float
    mean_s: float
    n: int  # simulated queries behind the percentile (0 when unstable)

    @property
    def stable(self) -> bool:
        return math.isfinite(self.p99_s)


@dataclass(frozen=True, slots=True)
class TailChoice:
    """``chosen`` is None when no configuration meets the SLO at this load."""

    arrival_rate: float
    slo_p99_s: float
    chosen: TailEstimate | None
    candidates: tuple[TailEstimate, ...]


def _profiles_by_concurrency(measurements: Sequence[Measurement], intra: int
                             ) -> dict[int, ServiceProfile]:
    """Per i, the timed service times of tuple (i, intra) (the mean alone when a document
    kept no samples: deterministic service, as M/D_interf/c assumes)."""
    out = {}
    for m in measurements:
        if m.intra == intra:
            samples = m.samples_s or (m.mean_s,)
            out[m.c] = ServiceProfile(f"c={m.c},intra={intra}",
                                      {1: [s * 1e3 for s in samples]})
    return out


def simulated_tail(measurements: Sequence[Measurement], config: Config, arrival_rate: float,
                   *, queries: int = 5000, seed: int = 0) -> TailEstimate:
    """p99 and mean latency of ``config`` at Poisson rate ``arrival_rate``, simulated."""
    if not (math.isfinite(arrival_rate) and arrival_rate > 0):
        raise ValueError(f"arrival_rate must be a finite number > 0, got {arrival_rate!r}")
    if queries < 100:
        raise ValueError(f"queries must be at least 100 for a p99, got {queries}")
    rates = profiles_from(measurements)[config.intra]
    if arrival_rate >= config.c * rates[config.c - 1]:
        return TailEstimate(config, math.inf, math.inf, 0)
    by_k = _profiles_by_concurrency(measurements, config.intra)
    overhead = next((m.overhead_s for m in measurements if m.config == config), 0.0)
    sim = SimConfig(mode="none", replicas=config.c, parallelism=config.c, max_batch_size=1,
                    slo_s=_NO_DEADLINE_S, frontend_overhead_s=overhead)
    rng = np.random.default_rng([seed, config.c, config.intra])
    arrivals = np.cumsum(rng.exponential(1.0 / arrival_rate, queries))
    result = simulate(sim, by_k[1], arrivals, rng, warmup=int(queries * _WARMUP_FRACTION),
                      by_concurrency=by_k)
    lat = result.measured()
    return TailEstimate(config, float(np.percentile(lat, 99, method="higher")),
                        float(lat.mean()), int(lat.size))


def choose_for_p99(measurements: Sequence[Measurement], arrival_rate: float,
                   slo_p99_s: float, *, cores: int, oversubscribe: bool = False,
                   queries: int = 5000, seed: int = 0) -> TailChoice:
    """The cheapest configuration (fewest cores busy, then lowest p99) whose simulated p99 at
    ``arrival_rate`` is at most ``slo_p99_s``; every candidate's estimate comes with it."""
    if not (math.isfinite(slo_p99_s) and slo_p99_s > 0):
        raise ValueError(f"slo_p99_s must be a finite number > 0, got {slo_p99_s!r}")
    configs = configurations(profiles_from(measurements), cores=cores,
                             oversubscribe=oversubscribe)
    estimates = tuple(simulated_tail(measurements, config, arrival_rate, queries=queries,
                                     seed=seed) for config in configs)
    meeting = [e for e in estimates if e.p99_s <= slo_p99_s]
    chosen = min(meeting, key=lambda e: (e.config.cores, e.p99_s, e.config), default=None)
    return TailChoice(arrival_rate, slo_p99_s, chosen, estimates)


def tail_table(measurements: Sequence[Measurement], levels: Sequence[float], slo_p99_s: float,
               *, cores: int, oversubscribe: bool = False, queries: int = 5000,
               seed: int = 0) -> dict[str, Any]:
    """The profile document's ``tail_aware`` section (JSON): per load level, the cheapest
    configuration meeting the SLO and every candidate's simulated p99 (null when unstable),
    which the tail-aware controller policy reads (``core/tail_policy``)."""
    rows = []
    for rate in levels:
        choice = choose_for_p99(measurements, rate, slo_p99_s, cores=cores,
                                oversubscribe=oversubscribe, queries=queries, seed=seed)
        rows.append({"rate": rate, "chosen": _estimate_doc(choice.chosen),
                     "candidates": [_estimate_doc(e) for e in choice.candidates]})
    return {"slo_p99_ms": slo_p99_s * 1000, "queries": queries, "levels": rows}


def _estimate_doc(e: TailEstimate | None) -> dict[str, Any] | None:
    if e is None:
        return None
    return {"c": e.config.c, "intra": e.config.intra, "cores": e.config.cores,
            "p99_s": _finite(e.p99_s), "mean_s": _finite(e.mean_s), "n": e.n}


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None  # JSON has no infinity
