"""Pure rules of the SERF benchmark's tail-aware part (issue 18, "tail-aware mode"): the SLO
it is held to, the cores a policy kept busy, and per phase the SLO attainment, against the
queue-length baseline. No I/O, so each rule is unit-tested (tests/benchmarks)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["SLO_HEADROOM", "auto_slo_ms", "cores_by_phase", "tail_phase_row", "tail_summary"]

# The automatic SLO: this many times the lowest simulated p99 any configuration reaches at
# the moderate phase's rate. Tight enough that the cheapest configuration misses it there
# (so cores must be spent), loose enough that the best one meets it with room.
SLO_HEADROOM = 1.5


def auto_slo_ms(table: Mapping[str, Any], rate: float) -> float:
    """``SLO_HEADROOM`` x the lowest finite simulated p99 at the first level of ``table`` (a
    ``tail_aware`` section) at or above ``rate``; ValueError when no configuration is
    stable there."""
    levels = sorted(table["levels"], key=lambda level: float(level["rate"]))
    level = next((lv for lv in levels if float(lv["rate"]) >= rate), levels[-1])
    p99s = [float(c["p99_s"]) for c in level["candidates"] if c.get("p99_s") is not None]
    if not p99s:
        raise ValueError(f"no configuration is stable at {level['rate']:.3g}/s")
    return SLO_HEADROOM * min(p99s) * 1000


def cores_by_phase(samples: Sequence[tuple[float, int]], starts: Sequence[float],
                   seconds: float) -> list[float]:
    """Time-weighted mean cores busy (c·intra) in each phase [start, start + seconds), from
    ``samples`` of (time, cores) taken as the run went (each holds until the next; the
    first holds back to the run's start). NaN for a phase with no sample in or before it."""
    if not samples:
        return [math.nan for _ in starts]
    times = np.array([t for t, _ in samples], dtype=float)
    values = np.array([v for _, v in samples], dtype=float)
    out = []
    for start in starts:
        end = start + seconds
        grid = np.linspace(start, end, 401)[:-1] + seconds / 800  # midpoints of 400 steps
        index = np.searchsorted(times, grid, side="right") - 1
        out.append(float(values[np.maximum(index, 0)].mean()))
    return out


def tail_phase_row(latencies_s: np.ndarray, errors: int, slo_ms: float,
                   mean_cores: float) -> dict[str, Any]:
    """One phase of one run: the samples, how many met the SLO, its percentiles."""
    lat_ms = np.asarray(latencies_s, dtype=float) * 1000
    n = int(lat_ms.size)
    met = int((lat_ms <= slo_ms).sum())
    p = (np.percentile(lat_ms, [50, 99, 99.9], method="higher") if n
         else [math.nan] * 3)
    return {"n": n, "errors": errors, "attainment": met / (n + errors) if n + errors else
            math.nan, "p50_ms": float(p[0]), "p99_ms": float(p[1]), "p999_ms": float(p[2]),
            "p99_meets_slo": bool(n and p[1] <= slo_ms), "mean_cores": mean_cores}


def tail_summary(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Per policy and phase, medians over repetitions (samples summed), and over the whole
    run the query-weighted attainment and the time-weighted cores (phases are equally
    long)."""
    out = []
    for policy, reps in runs.items():
        if not reps:
            continue
        row: dict[str, Any] = {"policy": policy, "repeats": len(reps),
                               "switches": float(np.median([r["switches"] for r in reps]))}
        for i in range(len(reps[0]["phases"])):
            got = [r["phases"][i] for r in reps]
            for key in ("attainment", "p50_ms", "p99_ms", "p999_ms", "mean_cores"):
                row[f"phase{i}_{key}"] = float(np.median([g[key] for g in got]))
            row[f"phase{i}_n"] = int(sum(g["n"] for g in got))
        row["overall_attainment"] = float(np.median([
            sum(p["attainment"] * (p["n"] + p["errors"]) for p in r["phases"])
            / max(1, sum(p["n"] + p["errors"] for p in r["phases"])) for r in reps]))
        row["overall_cores"] = float(np.median([np.mean([p["mean_cores"] for p in r["phases"]])
                                                for r in reps]))
        out.append(row)
    return out
