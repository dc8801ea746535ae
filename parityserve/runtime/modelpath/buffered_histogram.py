"""A Prometheus histogram that counts its observations in bulk.

Why not ``prometheus_client.Histogram``: its ``observe`` takes a lock and walks the buckets
in Python, a few microseconds each, and the hot routes observe two or three times per query
(request latency, queue time). Here an observation is a list append; the values are folded
into the bucket counts with numpy when the list fills up and whenever the registry is
collected (a scrape of ``/metrics``), so a scrape always sees every observation made before
it. The exposition is the same as the library's: ``_bucket{le=...}``, ``_count``, ``_sum``.

Observations and collection must come from one thread (the frontend's event loop), which is
where parityserve makes both.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["BufferedHistogram"]

_FOLD_AT = 4096  # observations held before folding: bounds the memory a series can hold


class _Series:
    __slots__ = ("_bounds", "_pending", "counts", "total")

    def __init__(self, bounds: np.ndarray) -> None:
        self._bounds = bounds
        self._pending: list[float] = []
        self.counts = np.zeros(len(bounds) + 1, dtype=np.int64)  # the last: above every bound
        self.total = 0.0

    def observe(self, value: float) -> None:
        self._pending.append(value)
        if len(self._pending) >= _FOLD_AT:
            self.fold()

    def fold(self) -> None:
        if not self._pending:
            return
        values = np.asarray(self._pending, dtype=np.float64)
        self._pending.clear()
        # bucket i counts values <= bounds[i]: the first bound not below the value
        where = np.searchsorted(self._bounds, values, side="left")
        self.counts += np.bincount(where, minlength=len(self.counts))
        self.total += float(values.sum())


class BufferedHistogram(Collector):
    """``Histogram(name, documentation, labelnames, buckets=..., registry=...)``, with
    ``labels(*values).observe(value)`` as the library's."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], *,
                 buckets: Sequence[float], registry: CollectorRegistry) -> None:
        bounds = sorted(float(b) for b in buckets if b != float("inf"))
        if not bounds:
            raise ValueError(f"histogram {name!r} needs at least one finite bucket bound")
        self._name, self._doc = name, documentation
        self._labelnames = tuple(labelnames)
        self._bounds = np.array(bounds)
        self._le = [floatToGoString(b) for b in bounds] + ["+Inf"]
        self._series: dict[tuple[str, ...], _Series] = {}
        registry.register(self)

    def labels(self, *values: str) -> _Series:
        if len(values) != len(self._labelnames):
            raise ValueError(f"histogram {self._name!r} takes labels {self._labelnames}, "
                             f"got {values}")
        key = tuple(str(v) for v in values)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = _Series(self._bounds)
        return series

    def describe(self) -> list[HistogramMetricFamily]:
        return [HistogramMetricFamily(self._name, self._doc, labels=self._labelnames)]

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._doc, labels=self._labelnames)
        for values, series in self._series.items():
            series.fold()
            cumulative = np.cumsum(series.counts)
            family.add_metric(list(values), list(zip(self._le, cumulative.tolist(),
                                                     strict=True)), series.total)
        yield family
