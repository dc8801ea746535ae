"""Pure helpers of ``python -m benchmarks.selection``: stream plan, error curves, tables, plots."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks import selection_report
from benchmarks.selection_models import pool_cifar, pool_mnist
from benchmarks.selection_report import (
    best_model,
    cumulative_error,
    downsample,
    exploration_cost,
    fig8_rows,
    fig8_verdict,
    fig9_row,
    fig9_summary,
    fig9_verdicts,
    group_bounds,
    phase_oracle,
    plot_fig8,
    plot_fig9,
    stream_plan,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_public_names() -> None:
    assert sorted(selection_report.__all__) == [
        "best_model", "cumulative_error", "downsample", "exploration_cost", "fig8_rows",
        "fig8_verdict", "fig9_row", "fig9_summary", "fig9_verdicts", "group_bounds",
        "phase_oracle", "plot_fig8", "plot_fig9", "stream_plan",
    ]


# ---- stream plan and groups ----------------------------------------------------------------
def test_stream_plan_is_a_seeded_shuffle_per_pass() -> None:
    index, variant, repeats = stream_plan(10, 25, seed=3)
    assert index.shape == (25,)
    assert sorted(index[:10]) == list(range(10)) and sorted(index[10:20]) == list(range(10))
    assert list(index[:10]) != list(range(10))  # shuffled
    assert list(variant) == [0] * 25  # one version only
    assert repeats
    again, _, _ = stream_plan(10, 25, seed=3)
    assert np.array_equal(index, again)
    other, _, _ = stream_plan(10, 25, seed=4)
    assert not np.array_equal(index, other)


def test_stream_plan_uses_a_new_version_per_pass_while_there_are_versions() -> None:
    _, variant, repeats = stream_plan(4, 10, seed=0, variants=2)
    assert list(variant) == [0, 0, 0, 0, 1, 1, 1, 1, 1, 1]
    assert repeats  # three passes, two versions
    _, variant, repeats = stream_plan(4, 8, seed=0, variants=2)
    assert list(variant) == [0] * 4 + [1] * 4 and not repeats


def test_stream_plan_of_one_pass_does_not_repeat() -> None:
    index, _, repeats = stream_plan(100, 100, seed=0)
    assert len(set(index.tolist())) == 100 and not repeats
    assert stream_plan(5, 0, seed=0)[0].size == 0


def test_stream_plan_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        stream_plan(0, 5, seed=0)


@pytest.mark.parametrize(
    ("n", "size", "cuts", "expected"),
    [
        (10, 4, (), [(0, 4), (4, 8), (8, 10)]),
        (10, 4, (5,), [(0, 4), (4, 5), (5, 9), (9, 10)]),
        (10, 4, (4, 8), [(0, 4), (4, 8), (8, 10)]),
        (10, 16, (3, 7), [(0, 3), (3, 7), (7, 10)]),
        (10, 4, (0, 10, 25), [(0, 4), (4, 8), (8, 10)]),  # cuts at the ends change nothing
        (0, 4, (), []),
    ],
)
def test_group_bounds_never_straddle_a_cut(n: int, size: int, cuts: tuple[int, ...],
                                           expected: list[tuple[int, int]]) -> None:
    assert group_bounds(n, size, cuts) == expected


def test_group_bounds_rejects_empty_groups() -> None:
    with pytest.raises(ValueError):
        group_bounds(10, 0)


# ---- errors --------------------------------------------------------------------------------
def test_cumulative_error_is_mistakes_over_queries_so_far() -> None:
    np.testing.assert_allclose(cumulative_error([1, 0, 0, 1]), [1.0, 0.5, 1 / 3, 0.5])
    assert cumulative_error([]).size == 0


def test_cumulative_error_counts_a_missing_answer_as_a_mistake() -> None:
    np.testing.assert_allclose(cumulative_error([0, math.nan]), [0.0, 0.5])


def test_best_model_has_the_lowest_mean_loss() -> None:
    losses = np.array([[1, 0, 1], [0, 0, 1], [1, 1, 0]], dtype=float)
    assert best_model(losses, ["a", "b", "c"]) == "b"
    # a model that never answered is not "best" by default
    losses = np.array([[math.nan, 1.0], [math.nan, 0.0]])
    assert best_model(losses, ["silent", "talks"]) == "talks"
    with pytest.raises(ValueError):
        best_model(np.zeros((0, 2)), ["a", "b"])


def test_fig8_rows_split_the_error_around_the_window() -> None:
    wrong = {"m": np.array([0, 0, 1, 1, 0, 0], dtype=float),
             "p": np.array([1, 0, 0, 1, math.nan, 0], dtype=float)}
    rows = fig8_rows(wrong, (2, 4), {"m": "a model"})
    m, p = rows
    assert m["curve"] == "m" and m["kind"] == "a model" and p["kind"] == ""
    assert m["final_cumulative_error"] == pytest.approx(2 / 6)
    assert (m["error_before"], m["error_degraded"], m["error_after"]) == (0.0, 1.0, 0.0)
    assert p["final_cumulative_error"] == pytest.approx(3 / 6)
    assert p["missing"] == 1 and p["error_after"] == pytest.approx(0.5)


def test_fig8_rows_with_an_empty_window_or_stream() -> None:
    rows = fig8_rows({"m": np.array([1.0, 0.0])}, (2, 2))
    assert rows[0]["error_degraded"] is None and rows[0]["error_after"] is None
    rows = fig8_rows({"m": np.zeros(0)}, (0, 0))
    assert rows[0]["final_cumulative_error"] is None


def test_fig8_verdict_compares_each_policy_with_the_best_static_model() -> None:
    rows = [{"curve": "a", "final_cumulative_error": 0.30},
            {"curve": "b", "final_cumulative_error": 0.20},
            {"curve": "Exp3", "final_cumulative_error": 0.25},
            {"curve": "Exp4", "final_cumulative_error": 0.15}]
    v = fig8_verdict(rows, ["Exp3", "Exp4"], ["a", "b"])
    assert v["best_static"] == "b" and v["best_static_error"] == 0.20
    assert not v["policies"]["Exp3"]["below_every_static"]
    assert v["policies"]["Exp4"]["below_every_static"]
    assert v["policies"]["Exp4"]["margin"] == pytest.approx(0.05)


def test_downsample_keeps_the_ends_and_bounds_the_size() -> None:
    curve = np.arange(1000, dtype=float)
    x, y = downsample(curve, 50)
    assert len(x) <= 50 and x[0] == 1 and x[-1] == 1000 and y[-1] == 999.0
    assert downsample(np.array([0.5]), 50) == ([1], [0.5])
    assert downsample(np.zeros(0)) == ([], [])


# ---- figure 9 ------------------------------------------------------------------------------
def test_fig9_row_summarises_a_point() -> None:
    lat = np.array([0.010, 0.020, 0.030, 5.0])
    ok = np.array([True, True, True, False])
    row = fig9_row(3, "deadline", 20.0, lat, ok, np.array([3, 2, 3, np.nan]),
                   np.array([True, True, False, False]))
    assert row["n"] == 4 and row["failed"] == 1
    assert row["accuracy"] == 0.5  # the failed request counts as wrong
    assert row["p99_ms"] == pytest.approx(30.0)  # failures are not latencies
    assert row["mean_answered"] == pytest.approx(8 / 3)
    assert row["all_answered"] == pytest.approx(0.5)


def test_fig9_verdicts_compare_deadline_with_waiting() -> None:
    rows = [{"ensemble": 2, "mode": "deadline", "p99_ms": 25.0, "accuracy": 0.90,
             "mean_answered": 1.5},
            {"ensemble": 2, "mode": "wait for all", "p99_ms": 100.0, "accuracy": 0.92,
             "mean_answered": 2.0},
            {"ensemble": 3, "mode": "deadline", "p99_ms": 25.0, "accuracy": 0.90,
             "mean_answered": 2.5}]
    (line,) = fig9_verdicts(rows)  # size 3 has no "wait for all" point
    assert line.startswith("2 models: p99 25.0 ms") and "(4.0x)" in line
    assert "-2.00 points" in line and "1.50 of 2" in line


def _point(k: int, mode: str, p99: float, acc: float) -> dict[str, object]:
    return {"ensemble": k, "mode": mode, "p99_ms": p99, "accuracy": acc,
            "slo_ms": 20.0 if mode == "deadline" else 1000.0}


def test_fig9_summary_states_the_three_claims() -> None:
    rows = [_point(2, "deadline", 24.0, 0.90), _point(2, "wait for all", 60.0, 0.92),
            _point(3, "deadline", 26.0, 0.91), _point(3, "wait for all", 90.0, 0.91),
            _point(4, "deadline", 25.0, 0.90)]  # size 4 lacks a "wait" point: left out
    s = fig9_summary(rows)
    assert s["sizes"] == [2, 3] and s["slo_ms"] == 20.0
    assert s["deadline_p99_over_slo_ms"] == pytest.approx(6.0)
    assert s["wait_p99_grows"]
    assert s["tail_cut"] == pytest.approx([2.5, 90 / 26])
    assert s["accuracy_cost_points"] == pytest.approx([2.0, 0.0])
    flat = [_point(2, "deadline", 24.0, 0.9), _point(2, "wait for all", 60.0, 0.9),
            _point(3, "deadline", 24.0, 0.9), _point(3, "wait for all", 59.0, 0.9)]
    assert not fig9_summary(flat)["wait_p99_grows"]
    assert fig9_summary([]) == {}


# ---- features and plots --------------------------------------------------------------------
def test_pooling_features_average_blocks() -> None:
    x = np.arange(2 * 3 * 32 * 32, dtype=np.float32).reshape(2, 3, 32, 32)
    f = pool_cifar(x, factor=4)
    assert f.shape == (2, 3 * 8 * 8)
    assert f[0, 0] == pytest.approx(x[0, 0, :4, :4].mean())
    m = pool_mnist(np.ones((5, 784)), factor=7)
    assert m.shape == (5, 16) and np.all(m == 1.0)


def test_plots_write_png_files(tmp_path: Path) -> None:
    curves = {"a": cumulative_error([0, 1, 0, 0]), "Exp3": cumulative_error([0, 0, 1, 0])}
    shares = {"Exp3": np.array([0.5, 0.4, 0.1, 0.2])}
    p8 = plot_fig8(curves, (1, 3), shares, tmp_path / "f8.png", "fig 8")
    rows = [{"ensemble": k, "mode": m, "accuracy": 0.9, "p99_ms": 20.0 + k, "slo_ms": 20.0}
            for k in (2, 3) for m in ("deadline", "wait for all")]
    p9 = plot_fig9(rows, tmp_path / "sub" / "f9.png", "fig 9")
    for path in (p8, p9):
        assert path.read_bytes()[:8] == PNG_MAGIC


def _phase_rows() -> list[dict]:
    # "a" is best before and after the window but broken in it; "b" is steady.
    return [
        {"curve": "a", "final_cumulative_error": 0.35, "error_before": 0.1,
         "error_degraded": 1.0, "error_after": 0.1},
        {"curve": "b", "final_cumulative_error": 0.2, "error_before": 0.2,
         "error_degraded": 0.2, "error_after": 0.2},
        {"curve": "Exp3", "final_cumulative_error": 0.05, "error_before": 0.0,
         "error_degraded": 0.0, "error_after": 0.0},
    ]


def test_phase_oracle_takes_the_best_static_model_of_each_phase() -> None:
    oracle = phase_oracle(_phase_rows(), ["a", "b"], (25, 50), 100)
    assert oracle["best_by_phase"] == {"error_before": "a", "error_degraded": "b",
                                       "error_after": "a"}
    # 25 queries at 0.1, 25 at 0.2, 50 at 0.1; the policy rows never count as static.
    assert oracle["error"] == pytest.approx(0.125)
    assert oracle["headroom"] == pytest.approx(0.2 - 0.125)
    assert oracle["headroom_queries"] == 8


def test_phase_oracle_skips_empty_phases() -> None:
    oracle = phase_oracle(_phase_rows(), ["a", "b"], (100, 100), 100)
    assert oracle["best_by_phase"] == {"error_before": "a"}
    assert oracle["error"] == pytest.approx(0.1)


def test_exploration_cost_is_gamma_times_the_mean_gap_per_phase() -> None:
    # Mean minus best: 0.05 before, 0.4 in the window, 0.05 after.
    cost = exploration_cost(_phase_rows(), ["a", "b"], (25, 50), 100, gamma=0.1)
    assert cost == pytest.approx(0.1 * (25 * 0.05 + 25 * 0.4 + 50 * 0.05) / 100)
    assert exploration_cost(_phase_rows(), ["a", "b"], (25, 50), 100, gamma=0.0) == 0.0


def test_fig8_headroom_says_when_a_bandit_cannot_win() -> None:
    from benchmarks.selection import _fig8_headroom

    def report(gap: float) -> dict:
        rows = [{"curve": "a", "final_cumulative_error": 0.5, "error_before": 0.1,
                 "error_degraded": 1.0, "error_after": 0.1},
                {"curve": "b", "final_cumulative_error": 0.1 + gap, "error_before": 0.1 + gap,
                 "error_degraded": 0.1 + gap, "error_after": 0.1 + gap}]
        return {"rows": rows, "degraded_window": [5000, 10000], "queries": 20000,
                "policies": {"exp3": {"gamma": 0.02}}, "models": [{"name": "a"}, {"name": "b"}]}

    close, far = _fig8_headroom(report(0.001)), _fig8_headroom(report(0.1))
    assert "out of reach for any bandit" in close
    assert "out of reach" not in far and "(1500 queries) below the best static" in far
