"""The before/after harness (benchmarks/diagnostics/ab_overhead.py): what it reads from a
`bench overhead` report and how it summarises interleaved rounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.diagnostics import ab_overhead as diagnostic


def _point(system: str, rate: float | None, p50: float, qps: float) -> dict:
    return {"system": system, "rate": rate, "n": 2000, "p50_ms": p50, "p99_ms": 2 * p50,
            "p999_ms": 3 * p50, "throughput_qps": qps}


def test_points_take_the_lowest_finite_rate_and_the_saturation_row() -> None:
    # The shape `bench overhead` writes: paced points, and the saturation runs under "peak"
    # with no rate (null in the JSON).
    model = {"points": [_point("bare", 400, 9, 400), _point("bare", 100, 1.0, 100),
                        _point("parityserve", 100, 2.0, 100),
                        _point("parityserve", 400, 9, 400)],
             "peak": {"bare": _point("bare", None, 50, 3000),
                      "parityserve": _point("parityserve", None, 80, 1500)}}
    found = diagnostic._points(model)
    assert found["parityserve"] == {"rate": 100, "n": 2000, "p50_ms": 2.0, "p99_ms": 4.0,
                                    "p999_ms": 6.0, "peak_qps": 1500, "peak_n": 2000}
    assert found["bare"]["peak_qps"] == 3000 and found["bare"]["p50_ms"] == 1.0


def test_summary_is_the_median_of_rounds_and_the_after_over_before_ratio() -> None:
    def run(qps: float, p50: float) -> dict:
        row = {"rate": 100, "n": 2000, "p50_ms": p50, "p99_ms": 1, "p999_ms": 1,
               "peak_qps": qps, "peak_n": 3000}
        return {"mlp": {"parityserve": row, "bare": row}}

    runs = {"before-0": run(1000, 2.0), "after-0": run(950, 2.2), "before-1": run(1100, 2.1),
            "after-1": run(1000, 2.0), "before-2": run(900, 5.0), "after-2": run(2000, 2.1)}
    row = diagnostic.summarise(runs, ["mlp"])["mlp/parityserve"]
    assert row["before_peak_qps"] == 1000 and row["after_peak_qps"] == 1000
    assert row["peak_ratio"] == pytest.approx(1.0)
    assert row["p50_ratio"] == pytest.approx(2.1 / 2.1)
    assert row["before_rounds"] == row["after_rounds"] == 3


def test_a_tree_given_as_a_directory_is_used_as_is(tmp_path: Path) -> None:
    with diagnostic._tree(str(tmp_path)) as tree:
        assert tree == tmp_path.resolve()
