"""The pure rules of the SERF benchmark's tail-aware part (benchmarks/serf_tail_analysis)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.serf_tail_analysis import (
    SLO_HEADROOM,
    auto_slo_ms,
    cores_by_phase,
    tail_phase_row,
    tail_summary,
)

TABLE = {"levels": [
    {"rate": 100.0, "candidates": [{"c": 1, "intra": 1, "p99_s": 0.004},
                                   {"c": 2, "intra": 1, "p99_s": 0.003}]},
    {"rate": 300.0, "candidates": [{"c": 1, "intra": 1, "p99_s": None},
                                   {"c": 2, "intra": 1, "p99_s": 0.010}]}]}


@pytest.mark.parametrize(("rate", "slo"), [(50.0, 3.0), (100.0, 3.0), (200.0, 10.0),
                                           (900.0, 10.0)])
def test_the_automatic_slo_is_headroom_over_the_best_p99_at_the_next_level_up(
        rate: float, slo: float) -> None:
    assert auto_slo_ms(TABLE, rate) == pytest.approx(SLO_HEADROOM * slo)


def test_no_stable_configuration_leaves_no_slo_to_set() -> None:
    table = {"levels": [{"rate": 1.0, "candidates": [{"c": 1, "intra": 1, "p99_s": None}]}]}
    with pytest.raises(ValueError, match="no configuration is stable at 1/s"):
        auto_slo_ms(table, 1.0)


def test_cores_are_time_weighted_within_each_phase() -> None:
    # 1 core until 5 s, 2 until 15 s, 1 after: phase [0, 10) is half 1, half 2 = 1.5
    samples = [(0.2, 1), (5.0, 2), (15.0, 1)]
    assert cores_by_phase(samples, [0.0, 10.0, 20.0], 10.0) == pytest.approx(
        [1.5, 1.5, 1.0], abs=0.01)
    assert all(math.isnan(v) for v in cores_by_phase([], [0.0], 10.0))


def test_a_phase_row_counts_errors_as_misses() -> None:
    lat = np.array([0.001] * 90 + [0.050] * 8)  # 90 within 10 ms, 8 over, 2 errors
    row = tail_phase_row(lat, errors=2, slo_ms=10.0, mean_cores=1.5)
    assert row["n"] == 98 and row["attainment"] == pytest.approx(0.90)
    assert row["p50_ms"] == pytest.approx(1.0) and row["p99_ms"] == pytest.approx(50.0)
    assert row["p99_meets_slo"] is False and row["mean_cores"] == 1.5
    empty = tail_phase_row(np.array([]), errors=0, slo_ms=10.0, mean_cores=1.0)
    assert empty["n"] == 0 and math.isnan(empty["attainment"]) and not empty["p99_meets_slo"]


def test_the_summary_takes_medians_per_phase_and_weights_the_whole_run() -> None:
    def run(att: float, cores: float, switches: int) -> dict:
        phase = {"n": 100, "errors": 0, "attainment": att, "p50_ms": 1.0, "p99_ms": 5.0,
                 "p999_ms": 9.0, "mean_cores": cores}
        return {"phases": [phase, {**phase, "attainment": 1.0, "mean_cores": 1.0}],
                "switches": switches}

    (row,) = tail_summary({"serf-tail": [run(0.9, 2.0, 2), run(0.95, 2.0, 4)]})
    assert row["repeats"] == 2 and row["switches"] == 3.0
    assert row["phase0_attainment"] == pytest.approx(0.925) and row["phase0_n"] == 200
    assert row["overall_attainment"] == pytest.approx(np.median([0.95, 0.975]))
    assert row["overall_cores"] == pytest.approx(1.5)
    assert tail_summary({"queue-length": []}) == []
