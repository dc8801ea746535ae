"""The demo's verdict judges one named tail percentile, chosen by the answer count alone."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from parityserve.bench.loadgen import LoadResult
from parityserve.demo import judged_percentile, tail_samples, verdict


def _summary(ok: int, p99: float, p999: float) -> dict[str, Any]:
    return {"ok": ok, "p99_ms": p99, "p999_ms": p999}


def test_p999_is_judged_from_1000_answers_and_p99_below() -> None:
    assert judged_percentile(5000) == judged_percentile(1000) == 99.9
    assert judged_percentile(999) == judged_percentile(100) == 99.0


def test_a_better_p99_does_not_hide_a_worse_p999() -> None:
    # The fresh-clone run that motivated this: p99 152 -> 6.7 ms but p99.9 153 -> 181 ms.
    line = verdict(_summary(5000, 152.2, 153.3), _summary(5000, 6.7, 181.2))
    assert line.startswith("Judged on the p99.9: ParM did not cut it, 153.3 ms -> 181.2 ms")
    assert "cut it 2" not in line and "22.7x" not in line


def test_a_cut_p999_is_reported_with_its_ratio_and_the_answers_behind_it() -> None:
    line = verdict(_summary(5000, 152.0, 160.0), _summary(5000, 7.0, 40.0))
    assert line.startswith("Judged on the p99.9: ParM cut it 4.0x, 160.0 ms -> 40.0 ms")
    assert "5,000 answers per deployment, about 5 at or above the p99.9" in line


def test_too_few_answers_for_p999_judges_p99_and_says_so() -> None:
    # p99.9 would look better for ParM here; with 600 answers it is not judged.
    line = verdict(_summary(600, 10.0, 200.0), _summary(600, 20.0, 30.0))
    assert line.startswith("Judged on the p99: ParM did not cut it, 10.0 ms -> 20.0 ms")


def test_the_smaller_answer_count_picks_the_percentile() -> None:
    line = verdict(_summary(5000, 50.0, 100.0), _summary(900, 40.0, 60.0))
    assert line.startswith("Judged on the p99: ParM cut it 1.2x")


def test_tail_samples_counts_the_answers_at_or_above_the_percentile() -> None:
    latencies = np.arange(1, 5001, dtype=float) / 1e3  # 1..5000 ms, all answered
    ok = np.ones(5000, dtype=bool)
    ok[-1] = False  # a failed query is not an answer
    result = LoadResult(latencies_s=latencies, ok=ok, results=[None] * 5000, errors=Counter(),
                        offered_rate=100.0, duration_s=50.0, send_lag_s=np.zeros(5000))
    assert tail_samples(result, 99.9) == 5  # 4995..4999 ms
    assert tail_samples(result, 99.0) == 50
