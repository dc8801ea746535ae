"""The arithmetic of ``benchmarks.serf_noise``: which cases, in which order, and how one run
of a case "predicts" another. Pure.

Conventions:
* A case is ``serf_analysis.Case`` (configuration, load level k, λ, Eq. 13's prediction);
  a repetition r of it is one open-loop run whose mean latency is m_r.
* The **oracle error** of a case is |m_r − m_s| / m_s over every ordered pair of distinct
  repetitions: how far the best possible predictor of one run, another run of the very same
  case, lands. It is ``serf_analysis.relative_error`` with m_r as the prediction.
* The issue's target (mean ≤ 3%, p90 ≤ 8%, p95 ≤ 10% relative error) is read off the same
  summary (``serf_analysis.error_summary``) for the oracle as for Eq. 13.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from itertools import permutations
from typing import Any

import numpy as np

from benchmarks.serf_analysis import IDLE_AWARE, Case, error_summary, relative_error
from parityserve.bench.stats import percentiles
from parityserve.core.queueing import Config

IDLE_KEY = f"{IDLE_AWARE}_ms"  # a case row's idle-aware prediction, where its profile had one

__all__ = [
    "CONFIGS",
    "FULL_LEVELS",
    "QUICK_LEVELS",
    "TARGETS",
    "RHO_BANDS",
    "case_summary",
    "cold_plan",
    "drift",
    "estimate_seconds",
    "fingerprint",
    "gap_summary",
    "measurement_order",
    "meets",
    "model_summary",
    "oracle_errors",
    "parse_configs",
    "poisson_seed",
    "run_key",
    "select_cases",
    "spread",
]

# (c, intra) measured again and again: the 1-core and 2-core faithful ones and one past 2.
CONFIGS: tuple[Config, ...] = (Config(1, 1), Config(2, 1), Config(1, 2), Config(3, 1))
FULL_LEVELS: tuple[int, ...] = (1, 3, 5, 7, 9)  # every other λ_k of serf's 10
QUICK_LEVELS: tuple[int, ...] = (1, 5, 9)
TARGETS: dict[str, float] = {"mean": 0.03, "p90": 0.08, "p95": 0.10}  # issue 18
# Utilisation bands the summary is also split by: where near saturation a run's mean is
# ruled by a few long busy periods, so no two runs agree, and below it they might.
RHO_BANDS: tuple[tuple[float, float], ...] = ((0.0, 0.5), (0.5, 0.8), (0.8, 1.0))
# Settings that do not change one measured run: which models, parts or repetitions an
# invocation asks for, and the cold part's own settings (the key holds the case and the
# repetition, so more repetitions or another subset extend a saved run file).
_NOT_IN_FINGERPRINT = frozenset({
    "models", "parts", "quick", "repeats", "configs", "pick_levels", "gaps_ms",
    "cold_calls", "cold_per_visit", "func", "verbose", "resume", "results_dir", "data_dir"})


def parse_configs(text: str) -> tuple[Config, ...]:
    """``"1/1,2/1"`` (c/intra pairs) as configurations; a clear error for anything else."""
    configs = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        c, sep, intra = part.partition("/")
        if not (sep and c.strip().isdigit() and intra.strip().isdigit()):
            raise ValueError(f"bad configuration {part!r}: write c/intra, e.g. 2/1")
        if int(c) < 1 or int(intra) < 1:
            raise ValueError(f"bad configuration {part!r}: c and intra must be >= 1")
        configs.append(Config(int(c), int(intra)))
    if not configs:
        raise ValueError(f"no configuration in {text!r}")
    return tuple(configs)


def select_cases(cases: Iterable[Case], configs: Sequence[Config], levels: Sequence[int]
                 ) -> tuple[list[Case], list[dict[str, Any]]]:
    """The cases of ``configs`` at ``levels``, by (level, configuration), and the wanted
    (configuration, level) pairs that have no case (unstable or not profiled), with why."""
    by_pair = {(case.config, case.level): case for case in cases}
    chosen = sorted((by_pair[p] for p in by_pair if p[0] in configs and p[1] in levels),
                    key=lambda case: (case.level, case.config))
    missing = [{"c": config.c, "intra": config.intra, "level": level,
                "why": "unstable (ρ > 0.95) or not profiled"}
               for config in configs for level in levels if (config, level) not in by_pair]
    return chosen, missing


def run_key(case_key: str, rep: int) -> str:
    """The saved line of one repetition of one case, e.g. ``c2-t1-k3-r0``."""
    return f"{case_key}-r{rep}"


def fingerprint(model: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """What a saved repetition depends on: the model, queries per run, load levels, seed and
    the profiling settings (the profile is saved in the same file and reused with it)."""
    return {"model": model,
            **{k: v for k, v in settings.items() if k not in _NOT_IN_FINGERPRINT}}


def measurement_order(cases: Sequence[Case], repeats: int, seed: int
                      ) -> list[tuple[int, Case]]:
    """(repetition, case) in the order measured: repetition is the outer loop, and within
    each the cases are shuffled (a seeded generator per repetition), so slow drift of the
    machine hits every case alike and no case always follows the same one."""
    order = []
    for rep in range(repeats):
        shuffled = np.random.default_rng([seed, 17, rep]).permutation(len(cases))
        order += [(rep, cases[int(i)]) for i in shuffled]
    return order


def poisson_seed(seed: int, case: Case, rep: int) -> list[int]:
    """The arrival schedule's seed: serf's per case, with the repetition added."""
    return [seed, case.level, case.config.c, case.config.intra, 1000 + rep]


def estimate_seconds(cases: Sequence[Case], queries: int, repeats: int,
                     per_run_overhead_s: float) -> float:
    """Expected wall time of the measuring: each run sends ``queries`` at its λ, plus a fixed
    cost per run (reconfiguring, the warm-up queries, the last answers)."""
    return repeats * sum(queries / case.rate + per_run_overhead_s for case in cases)


def oracle_errors(means: Sequence[float]) -> list[float]:
    """|m_r − m_s| / m_s for every ordered pair of distinct repetitions (r, s)."""
    return [relative_error(m_r, m_s) for m_r, m_s in permutations(means, 2)]


def spread(means: Sequence[float]) -> float:
    """(max − min) / mean of the repetitions' means; NaN without a finite mean."""
    values = [m for m in means if math.isfinite(m)]
    if not values or float(np.mean(values)) <= 0:
        return math.nan
    return (max(values) - min(values)) / float(np.mean(values))


def case_summary(reps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One case over its repetitions (rows of ``serf._case_row`` plus ``rep`` and the kept
    latencies in µs): each repetition's mean, their mean and spread, the oracle errors, Eq.
    13's error against each repetition, and percentiles of the pooled latencies."""
    first = reps[0]
    means = [float(r["measured_ms"]) for r in reps]
    predicted = float(first["predicted_ms"])
    pooled = np.concatenate([np.asarray(r.get("latencies_us", []), dtype=float)
                             for r in reps]) / 1e6
    oracle = oracle_errors(means)
    mean = float(np.mean(means))
    return {
        "config": first["config"], "c": first["c"], "intra": first["intra"],
        "level": first["level"], "rate": first["rate"], "rho": first["rho"],
        "repeats": len(reps), "means_ms": means, "mean_ms": mean, "spread": spread(means),
        "oracle_errors": oracle, "oracle_max": max(oracle, default=math.nan),
        "predicted_ms": predicted,
        "eq13_errors": [relative_error(predicted, m) for m in means],
        "eq13_error_of_mean": relative_error(predicted, mean),
        **({"idle_predicted_ms": float(first[IDLE_KEY]),
            "idle_errors": [relative_error(float(first[IDLE_KEY]), m) for m in means]}
           if IDLE_KEY in first else {}),
        "n_per_rep": [int(r["n"]) for r in reps], "errors": sum(int(r["errors"]) for r in reps),
        "n_pooled": int(pooled.size), **percentiles(pooled)}


def model_summary(cases: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Over every case of a model: the oracle errors of all pairs and Eq. 13's errors
    against every repetition, each as mean, p90 and p95, with whether each meets the
    issue's target; and the same per utilisation band (ρ in (lo, hi])."""
    oracle = error_summary([e for case in cases for e in case["oracle_errors"]])
    eq13 = error_summary([e for case in cases for e in case["eq13_errors"]])
    bands = []
    for lo, hi in RHO_BANDS:
        group = [case for case in cases if lo < float(case["rho"]) <= hi]
        bands.append({"lo": lo, "hi": hi, "cases": len(group),
                      "oracle": error_summary([e for c in group for e in c["oracle_errors"]]),
                      "eq13": error_summary([e for c in group for e in c["eq13_errors"]]),
                      **({"idle": error_summary([e for c in group for e in c["idle_errors"]])}
                         if all("idle_errors" in c for c in group) else {})})
    idle = ({"idle": error_summary([e for case in cases for e in case["idle_errors"]]),
             "idle_unstable": sum(1 for case in cases for e in case["idle_errors"]
                                  if math.isinf(e))}
            if cases and all("idle_errors" in case for case in cases) else {})
    return {"oracle": oracle, "eq13": eq13, **idle, "targets": dict(TARGETS),
            "oracle_meets": meets(oracle), "eq13_meets": meets(eq13), "by_rho": bands}


def meets(summary: Mapping[str, Any], targets: Mapping[str, float] = TARGETS
          ) -> dict[str, bool | None]:
    """Per statistic, whether it is within its target (None when there is nothing)."""
    out: dict[str, bool | None] = {}
    for key, limit in targets.items():
        value = float(summary.get(key, math.nan))
        out[key] = None if math.isnan(value) else value <= limit
    return out


def cold_plan(gaps_ms: Sequence[float], calls_per_gap: int, per_visit: int,
              rng: np.random.Generator) -> list[float]:
    """The gap before each timed call, in order: rounds that each visit every gap once in a
    shuffled order, ``per_visit`` calls a visit, until every gap has ``calls_per_gap`` (the
    last round may visit with fewer)."""
    if calls_per_gap < 1 or per_visit < 1:
        raise ValueError(f"need calls_per_gap >= 1 and per_visit >= 1, got {calls_per_gap}, "
                         f"{per_visit}")
    plan: list[float] = []
    done = 0
    while done < calls_per_gap:
        take = min(per_visit, calls_per_gap - done)
        for i in rng.permutation(len(gaps_ms)):
            plan += [float(gaps_ms[i])] * take
        done += take
    return plan


def gap_summary(plan: Sequence[float], times_s: Sequence[float],
                slept_s: Sequence[float] | None = None) -> list[dict[str, Any]]:
    """Per gap (ms, ascending), from each call's gap, time and time slept before it (in
    ``plan`` order): n, the median and mean time in ms, their ratios to the smallest gap's
    (g = 0, back to back), and the mean time actually slept."""
    slept = list(slept_s) if slept_s is not None else [math.nan] * len(plan)
    rows = []
    for gap in sorted(set(plan)):
        picked = [i for i, g in enumerate(plan) if g == gap]
        values = np.asarray([times_s[i] for i in picked], dtype=float) * 1e3
        asleep = np.asarray([slept[i] for i in picked], dtype=float) * 1e3
        rows.append({"gap_ms": float(gap), "n": int(values.size),
                     "median_ms": float(np.median(values)),
                     "mean_ms": float(values.mean()), "slept_ms": float(asleep.mean())})
    base = rows[0] if rows else {}
    for row in rows:
        for key in ("median", "mean"):
            ref = float(base[f"{key}_ms"])
            row[f"{key}_ratio"] = row[f"{key}_ms"] / ref if ref > 0 else math.nan
    return rows


def drift(plan: Sequence[float], times_s: Sequence[float], gap: float = 0.0
          ) -> dict[str, Any]:
    """How the machine's own speed moves during a series: the median time (ms) of each visit
    of ``gap`` (a run of consecutive calls after that gap, in ``plan`` order), and the
    slowest visit over the fastest. Visits are seconds apart, so this is drift, not the
    wake-up cost."""
    medians: list[float] = []
    block: list[float] = []
    for i, (g, t) in enumerate(zip(plan, times_s, strict=True)):
        if g == gap:
            block.append(t)
        if block and (g != gap or i == len(plan) - 1):
            medians.append(float(np.median(block)) * 1e3)
            block = []
    if not medians:
        return {"visits": 0, "visit_medians_ms": [], "min_ms": math.nan,
                "max_ms": math.nan, "max_over_min": math.nan}
    return {"visits": len(medians), "visit_medians_ms": medians, "min_ms": min(medians),
            "max_ms": max(medians), "max_over_min": max(medians) / min(medians)}
