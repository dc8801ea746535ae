"""benchmarks.berrut_group_wait: the simulator sweep on the ParM testbed's setting."""

from __future__ import annotations

import numpy as np

from benchmarks import berrut_group_wait as sweep


def test_shuffle_windows_cover_pairs_of_the_18_slots_with_50_ms() -> None:
    windows = sweep.window_map(18, 10.0, np.random.default_rng(0))
    assert set(windows) <= set(range(18)) and len(windows) >= 2
    for spans in windows.values():
        for start, end, delay in spans:
            assert 0 <= start < 10.0 and 0.6 < end - start < 1.5 and delay == 0.05


def test_a_point_reports_quantiles_and_tasks_per_query() -> None:
    point = sweep.sweep_point("none", 0.0, 100.0, 300, 0)
    assert point["n"] == 300 and point["tasks_per_query"] == 1.0
    assert 30.0 <= point["p50_ms"] <= point["p99_ms"] <= point["p999_ms"]


def test_the_wait_packs_berrut_groups() -> None:
    plain = sweep.sweep_point("berrut", 0.0, 100.0, 600, 0)
    waited = sweep.sweep_point("berrut", 80.0, 100.0, 600, 0)
    assert waited["tasks_per_query"] < plain["tasks_per_query"]
