"""Latency statistics for benchmark reports.

Percentiles use numpy's ``method="higher"``: each one is a latency that some query really
saw, never an interpolation between two samples, so a sparse tail is not smoothed downwards.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

__all__ = [
    "PERCENTILES",
    "enough_samples",
    "median_and_spread",
    "min_samples",
    "percentiles",
]

# Key prefix -> percentile. Keys come out as "<prefix>_ms".
PERCENTILES: dict[str, float] = {"p50": 50.0, "p90": 90.0, "p99": 99.0, "p999": 99.9}


def percentiles(latencies_s: Iterable[float] | np.ndarray) -> dict[str, float]:
    """p50 / p90 / p99 / p99.9 in milliseconds (``method="higher"``); NaN when no samples.

    Non-finite entries (queries that never completed) are dropped: report them as errors.
    """
    lat = _as_floats(latencies_s)
    lat = lat[np.isfinite(lat)]
    if lat.size == 0:
        return {f"{key}_ms": math.nan for key in PERCENTILES}
    values = np.percentile(lat, list(PERCENTILES.values()), method="higher") * 1e3
    return {f"{key}_ms": float(v) for key, v in zip(PERCENTILES, values, strict=True)}


def min_samples(percentile: float) -> int:
    """Fewest samples for which ``percentile`` is more than just the maximum.

    p99 needs 100 samples and p99.9 needs 1000: with fewer, the "tail" is one unlucky query.
    """
    if not 0.0 < percentile < 100.0:
        raise ValueError(f"percentile must be in (0, 100), got {percentile}")
    # round() first: 100 / (100 - 99.9) is 1000.0000000005 in floating point, not 1000.
    return math.ceil(round(100.0 / (100.0 - percentile), 6))


def enough_samples(n: int, percentile: float) -> bool:
    """Whether ``n`` samples are enough to state ``percentile`` honestly."""
    return n >= min_samples(percentile)


def median_and_spread(values: Iterable[float]) -> tuple[float, float, float]:
    """(median, min, max) over repetitions of one measurement."""
    arr = _as_floats(values)
    if arr.size == 0:
        raise ValueError("median_and_spread needs at least one value")
    return float(np.median(arr)), float(arr.min()), float(arr.max())


def _as_floats(values: Iterable[float] | np.ndarray) -> np.ndarray:
    # list() only for one-shot iterables: np.asarray on a generator makes an object scalar.
    if not isinstance(values, np.ndarray | list | tuple):
        values = list(values)
    return np.asarray(values, dtype=float).ravel()
