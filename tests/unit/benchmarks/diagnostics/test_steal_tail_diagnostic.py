"""The steal diagnostic (benchmarks/diagnostics/steal_tail.py): which latency bands met steal."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from benchmarks.diagnostics import steal_tail as diagnostic
from benchmarks.steal import StealSamples
from parityserve.bench.loadgen import LoadResult


def test_each_band_says_how_many_of_its_answers_met_steal() -> None:
    n = 1000
    schedule = np.arange(n) * 0.1  # one query every 100 ms from t = 100 s: none overlap
    latencies = np.linspace(0.020, 0.040, n)
    latencies[[100, 500, 900]] = 0.200  # the three slowest ...
    ok = np.ones(n, dtype=bool)
    ok[5] = False  # a failure counts in no band
    result = LoadResult(latencies_s=latencies, ok=ok, results=[None] * n, errors=Counter(),
                        offered_rate=100.0, duration_s=10.0, started_at=100.0)
    # ... were each in flight while 2 ticks were stolen (a jump just after each one's send)
    times = np.arange(100.0, 201.0, 0.005)
    steal = np.zeros(times.size)
    for i in (100, 500, 900):
        steal[times > 100.0 + schedule[i] + 0.15] += 2
    out = diagnostic.met_steal_by_band(result, schedule,
                                       StealSamples(times, steal, np.arange(times.size) * 2.0))
    assert out["n_above p99.5"] == 5  # the top half percent of 999 answers
    assert out["met_above p99.5"] == pytest.approx(3 / 5)
    assert out["n_up to p50"] + out["n_p50-p99"] + out["n_p99-p99.5"] + 5 == n - 1
    assert out["met_up to p50"] == out["met_p50-p99"] == out["met_p99-p99.5"] == 0.0
