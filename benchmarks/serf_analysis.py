"""The arithmetic of ``benchmarks.serf``: load levels, cases, errors and verdicts. Pure.

Kept apart from the measuring code so that the table-driven tests can hold every rule the
report applies (which cases are skipped, how an error is counted, when a predicted best
configuration counts as found) without a server.

Conventions (digest ``../shared/papers/serf-hams-spec.md``, A4 and Part C, SERF items 5-6):
* ``profiles`` maps intra threads to [μ_1, ..., μ_n], per-request rates in requests/s.
* λ_max = max over configurations of c·μ_c (the fastest any configuration drains), and the
  load levels are λ_k = k·λ_max/11 for k = 1..10.
* A case (configuration, λ) with ρ = λ/(c·μ_c) above ``rho_max`` is skipped and counted.
* The error of a case is |predicted − measured| / measured, on mean latency.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from parityserve.core.idle_queueing import IdleInputs, predict_idle_aware
from parityserve.core.profiling import load_levels
from parityserve.core.queueing import (
    Config,
    QueueModel,
    best_config,
    configurations,
    predict_latency,
    reference_table,
)

__all__ = [
    "ABLATIONS",
    "IDLE_AWARE",
    "Case",
    "argmin_verdicts",
    "batch_means_halfwidth",
    "build_cases",
    "capacity",
    "dynamic_summary",
    "dynamic_verdicts",
    "error_summary",
    "fixed_policies",
    "idle_from_profile",
    "lambda_max",
    "phase_rates",
    "phased_schedule",
    "predict_idle",
    "relative_error",
]

# The latency models compared in the report: SERF's Eq. 13 first, then the ablations (Fig. 9).
ABLATIONS: tuple[QueueModel, ...] = ("md-interf", "mm-interf", "md", "mm")
# Our extension beside them (core/idle_queueing): Eq. 13 on back-to-back service rates plus
# the measured penalty of starting after an idle gap. Reported where the profile measured it.
IDLE_AWARE = "md-interf-idle"
LEVELS = 10  # λ_k for k = 1..10, as the digest's procedure (A4, step 3)


@dataclass(frozen=True)
class Case:
    """One (configuration, load level) to measure, with every model's prediction (seconds)."""

    config: Config
    level: int  # k in λ_k = k·λ_max/11
    rate: float
    rho: float
    predicted_s: dict[str, float]

    @property
    def key(self) -> str:
        return f"c{self.config.c}-t{self.config.intra}-k{self.level}"


def capacity(profiles: Mapping[int, Sequence[float]], config: Config) -> float:
    """c·μ_c: the rate the configuration drains at when every slot is busy."""
    return config.c * float(profiles[config.intra][config.c - 1])


def lambda_max(profiles: Mapping[int, Sequence[float]], configs: Sequence[Config]) -> float:
    return max(capacity(profiles, config) for config in configs)


def idle_from_profile(idle: Mapping[str, Any] | None) -> dict[int, IdleInputs] | None:
    """The idle-aware model's inputs per intra from a profile's ``idle`` section (written by
    ``parityserve profile``), or None when the profile has none."""
    if not idle:
        return None
    return {int(intra): IdleInputs.from_dict(doc) for intra, doc in idle.items()}


def predict_idle(inputs: IdleInputs, rate: float, c: int) -> float:
    """The idle-aware mean latency of c slots at ``rate`` (seconds, with the time outside
    the slot)."""
    return predict_idle_aware(rate, inputs.busy_rates[:c], inputs.slot_curve,
                              overhead_s=inputs.overhead_s,
                              overhead_curve=inputs.overhead_curve).latency


def build_cases(profiles: Mapping[int, Sequence[float]], *, cores: int, oversubscribe: bool,
                levels: int = LEVELS, rho_max: float = 0.95,
                overhead: Mapping[Config, float] | None = None,
                idle: Mapping[int, IdleInputs] | None = None
                ) -> tuple[list[Case], list[dict[str, Any]]]:
    """Every stable (configuration, λ_k) with its predictions, and the skipped ones (why).

    ``overhead`` is each configuration's time outside the queue (the profiler's
    ``overhead_s``: the client's round trip beyond the server's slot time), added to every
    model's prediction alike. With ``idle`` (per intra) the idle-aware model's prediction,
    which carries its own time outside the slot, is added as ``IDLE_AWARE``."""
    configs = configurations(profiles, cores=cores, oversubscribe=oversubscribe)
    rates = load_levels(profiles, cores=cores, oversubscribe=oversubscribe, count=levels)
    cases: list[Case] = []
    skipped: list[dict[str, Any]] = []
    for config in configs:
        mu = [float(m) for m in profiles[config.intra][:config.c]]
        for k, rate in enumerate(rates, start=1):
            rho = rate / capacity(profiles, config)
            if rho > rho_max:
                skipped.append({"c": config.c, "intra": config.intra, "level": k,
                                "rate": rate, "rho": rho})
                continue
            extra = (overhead or {}).get(config, 0.0)
            predicted = {model: predict_latency(rate, mu, model).latency + extra
                         for model in ABLATIONS}
            if idle is not None and config.intra in idle:
                predicted[IDLE_AWARE] = predict_idle(idle[config.intra], rate, config.c)
            cases.append(Case(config, k, rate, rho, predicted))
    return cases, skipped


def relative_error(predicted: float, measured: float) -> float:
    """|predicted − measured| / measured (digest Part C, SERF item 5); inf for an infinite
    prediction, NaN when nothing was measured."""
    if not measured > 0 or math.isnan(measured):
        return math.nan
    return abs(predicted - measured) / measured


def error_summary(errors: Sequence[float]) -> dict[str, float | int]:
    """Mean, p90 and p95 of the relative errors (as fractions) over the finite ones, and n."""
    values = np.asarray([e for e in errors if math.isfinite(e)], dtype=float)
    if values.size == 0:
        return {"n": 0, "mean": math.nan, "p90": math.nan, "p95": math.nan}
    return {"n": int(values.size), "mean": float(values.mean()),
            "p90": float(np.percentile(values, 90)), "p95": float(np.percentile(values, 95))}


def batch_means_halfwidth(latencies_s: Sequence[float] | np.ndarray, batches: int = 20) -> float:
    """The 95% half-width of a run's mean latency by the method of batch means.

    Why batch means: successive latencies in a queue are correlated, so the naive standard
    error understates the spread; means of ``batches`` consecutive blocks are close to
    independent. With fewer samples than blocks it returns inf (no claim made)."""
    lat = np.asarray(latencies_s, dtype=float)
    lat = lat[np.isfinite(lat)]
    if lat.size < 2 * batches:
        return math.inf
    means = np.array([block.mean() for block in np.array_split(lat, batches)])
    t95 = 2.093  # Student's t, 19 degrees of freedom (20 batches), two-sided 95 %
    return float(t95 * means.std(ddof=1) / math.sqrt(batches))


def argmin_verdicts(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per load level: the predicted best configuration, the measured best, and whether the
    prediction counts as found.

    ``rows`` are measured cases with ``level``, ``config`` (a label), ``predicted_ms``,
    ``measured_ms`` and ``halfwidth_ms``. Found: the same configuration, or the predicted
    one's measured mean lies within the measured best's spread (both runs' 95% half-widths
    added, since either mean could be off by its own)."""
    by_level: dict[int, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_level.setdefault(int(row["level"]), []).append(row)
    verdicts = []
    for level in sorted(by_level):
        group = [r for r in by_level[level] if math.isfinite(float(r["measured_ms"]))]
        if not group:
            continue
        predicted = min(group, key=lambda r: (float(r["predicted_ms"]), r["config"]))
        measured = min(group, key=lambda r: (float(r["measured_ms"]), r["config"]))
        slack = float(predicted["halfwidth_ms"]) + float(measured["halfwidth_ms"])
        gap = float(predicted["measured_ms"]) - float(measured["measured_ms"])
        verdicts.append({
            "level": level, "rate": float(group[0]["rate"]), "candidates": len(group),
            "predicted_best": predicted["config"], "measured_best": measured["config"],
            "gap_ms": gap, "spread_ms": slack,
            "found": predicted["config"] == measured["config"] or gap <= slack})
    return verdicts


def phase_rates(lam_max: float, fractions: Sequence[float]) -> list[float]:
    """The dynamic-load phases' arrival rates (moderate, low, moderate as fractions)."""
    if any(not 0 < f < 1 for f in fractions):
        raise ValueError(f"phase load fractions must be in (0, 1), got {list(fractions)}")
    return [f * lam_max for f in fractions]


def phased_schedule(rates: Sequence[float], seconds: float, rng: np.random.Generator, *,
                    lead_in_s: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Poisson send times through consecutive phases of ``seconds`` each at ``rates``, and
    the phase each send belongs to (-1 for the lead-in: ``lead_in_s`` at the first rate
    before phase 0, not to be measured). A phase's arrivals never spill into the next."""
    if seconds <= 0 or lead_in_s < 0 or any(r <= 0 for r in rates):
        raise ValueError(f"need seconds > 0, lead_in_s >= 0 and positive rates, got "
                         f"{seconds}, {lead_in_s}, {list(rates)}")
    spans = ([(-1, rates[0], lead_in_s)] if lead_in_s > 0 else []) + [
        (i, rate, seconds) for i, rate in enumerate(rates)]
    times: list[np.ndarray] = []
    phases: list[np.ndarray] = []
    start = 0.0
    for i, rate, width in spans:
        expected = rate * width
        gaps = rng.exponential(1.0 / rate, int(expected + 10 * math.sqrt(expected) + 20))
        at = np.cumsum(gaps)
        at = at[at < width]
        times.append(start + at)
        phases.append(np.full(at.size, i))
        start += width
    return np.concatenate(times), np.concatenate(phases)


def fixed_policies(profiles: Mapping[int, Sequence[float]], cores: int, rates: Sequence[float],
                   *, oversubscribe: bool) -> dict[str, Config]:
    """Three distinct fixed configurations, as in the paper's Fig. 13: the best for the low
    phase, the best for the moderate phase (the first phase's rate), and another. When one
    configuration is best for both, it is named ``fixed-low-and-moderate`` and two others
    are taken, so the comparison always spans three. The others are the stable
    configurations at the moderate rate, the predicted worst first (the range's far end)."""
    moderate, low = rates[0], min(rates)
    best_low = best_config(low, profiles, cores=cores, oversubscribe=oversubscribe).config
    best_mod = best_config(moderate, profiles, cores=cores, oversubscribe=oversubscribe).config
    (row,) = reference_table([moderate], profiles, cores=cores, oversubscribe=oversubscribe)
    others = sorted((ch for ch in row.candidates if ch.config not in (best_low, best_mod)
                     and ch.prediction.stable),
                    key=lambda ch: (-ch.prediction.latency, ch.config))
    if best_low == best_mod:
        chosen = {"fixed-low-and-moderate": best_low}
        names = ["fixed-other", "fixed-other-2"]
    else:
        chosen = {"fixed-low": best_low, "fixed-moderate": best_mod}
        names = ["fixed-other"]
    chosen.update({name: ch.config for name, ch in zip(names, others, strict=False)})
    return chosen


def dynamic_summary(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Per policy and phase: medians over repetitions of mean and tail latency, the samples
    behind them, and the policy's whole-run mean (query-weighted)."""
    out = []
    for policy, reps in runs.items():
        if not reps:
            continue
        phases = len(reps[0]["phases"])
        row: dict[str, Any] = {"policy": policy, "repeats": len(reps),
                               "switches": float(np.median([r["switches"] for r in reps]))}
        for i in range(phases):
            got = [r["phases"][i] for r in reps]
            for key in ("mean_ms", "p50_ms", "p99_ms", "p999_ms"):
                row[f"phase{i}_{key}"] = float(np.median([g[key] for g in got]))
            row[f"phase{i}_n"] = int(sum(g["n"] for g in got))
        totals = [sum(p["mean_ms"] * p["n"] for p in r["phases"]) / max(1, sum(p["n"] for p in
                  r["phases"])) for r in reps]
        row["overall_mean_ms"] = float(np.median(totals))
        out.append(row)
    return out


def dynamic_verdicts(summary: Sequence[Mapping[str, Any]], phases: int,
                     candidate: str = "serf", tolerance: float = 0.05) -> dict[str, Any]:
    """SERF within ``tolerance`` of the best fixed configuration in every phase, and better
    than every single fixed configuration over the whole run (the issue's target)."""
    rows = {r["policy"]: r for r in summary}
    fixed = [r for name, r in rows.items() if name.startswith("fixed-")]
    if candidate not in rows or not fixed:
        return {"complete": False}
    mine = rows[candidate]
    per_phase = []
    for i in range(phases):
        best = min(float(r[f"phase{i}_mean_ms"]) for r in fixed)
        ratio = float(mine[f"phase{i}_mean_ms"]) / best if best > 0 else math.nan
        per_phase.append({"phase": i, "ratio_to_best_fixed": ratio,
                          "within": ratio <= 1.0 + tolerance})
    beats = all(float(mine["overall_mean_ms"]) < float(r["overall_mean_ms"]) for r in fixed)
    return {"complete": True, "phases": per_phase, "beats_every_fixed_overall": beats,
            "met": all(p["within"] for p in per_phase) and beats}
