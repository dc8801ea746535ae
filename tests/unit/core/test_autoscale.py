"""The queue-length baseline (core/autoscale.py): Ray Serve's default autoscaling policy.

Each scenario feeds one observation a second and lists the moments the replica count changes.
With ``look_back_period_s = 1`` the average at t is the observation at t - 1 (each one holds
until the next), so a load step at t is first seen at t + 1.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from parityserve.core import autoscale
from parityserve.core.autoscale import (
    Observation,
    QueueLengthConfig,
    average_ongoing,
    desired_replicas,
    initial_state,
    observe,
)

Segment = tuple[int, int, float]  # [start, end) seconds at this many ongoing requests

# Target 2 per replica, 1 to 8 replicas, starting at 2: 4 ongoing requests is steady.
BASE: dict[str, Any] = {"target_ongoing_requests": 2.0, "min_replicas": 1, "max_replicas": 8,
                        "initial_replicas": 2, "upscale_delay_s": 30.0,
                        "downscale_delay_s": 600.0, "look_back_period_s": 1.0}


def changes(config: QueueLengthConfig, *segments: Segment) -> list[tuple[int, int]]:
    """(time, replicas) at each observation after which the replica count changed."""
    state = initial_state(config)
    seen = []
    for start, end, ongoing in segments:
        for t in range(start, end):
            before = state.replicas
            state = observe(config, state, Observation(float(t), ongoing))
            if state.replicas != before:
                seen.append((t, state.replicas))
    return seen


def test_public_names() -> None:
    assert sorted(autoscale.__all__) == sorted([
        "Observation", "QueueLengthConfig", "QueueLengthState", "average_ongoing",
        "desired_replicas", "initial_state", "observe"])


def test_defaults_are_ray_serves() -> None:
    config = QueueLengthConfig()
    assert (config.target_ongoing_requests, config.min_replicas, config.max_replicas) == (2, 1, 1)
    assert (config.upscale_delay_s, config.downscale_delay_s, config.look_back_period_s) == (
        30.0, 600.0, 30.0)
    assert (config.upscale_gain, config.downscale_gain) == (1.0, 1.0)
    assert initial_state(config).replicas == 1


SCENARIOS: list[tuple[str, dict[str, Any], list[Segment], list[tuple[int, int]]]] = [
    ("steady load at the target", {}, [(0, 2000, 4)], []),
    ("burst shorter than the upscale delay", {}, [(0, 100, 4), (100, 120, 16), (120, 900, 4)],
     []),
    # seen at 101, wanted for 30 s: 16 / (2 per replica) = 8 replicas at 131
    ("sustained burst", {}, [(0, 100, 4), (100, 300, 16)], [(131, 8)]),
    ("sustained moderate rise", {}, [(0, 100, 4), (100, 300, 10)], [(131, 5)]),
    # 8 replicas at 16; the drop to 4 is seen at 101 and applied 600 s later: 2 replicas
    ("drop, after the downscale delay", {"initial_replicas": 8},
     [(0, 100, 16), (100, 1000, 4)], [(701, 2)]),
    ("dip shorter than the downscale delay", {"initial_replicas": 8},
     [(0, 100, 16), (100, 650, 4), (650, 1500, 16)], []),
    # the first observation is the average: wanted from t = 0
    ("clamped to max_replicas", {}, [(0, 100, 1000)], [(30, 8)]),
    ("clamped to min_replicas", {"initial_replicas": 8}, [(0, 700, 1)], [(600, 1)]),
    ("zero load goes to min_replicas", {"initial_replicas": 4}, [(0, 700, 0)], [(600, 1)]),
    ("zero load stops at a higher floor", {"initial_replicas": 4, "min_replicas": 2},
     [(0, 700, 0)], [(600, 2)]),
    # up wanted 0-20, down 21-40, up again from 41: the upscale wait starts over at 41
    ("a change of direction restarts the wait", {"initial_replicas": 4},
     [(0, 20, 20), (20, 40, 2), (40, 200, 20)], [(71, 8)]),
    ("no delays: every change at once", {"upscale_delay_s": 0.0, "downscale_delay_s": 0.0},
     [(0, 10, 4), (10, 20, 12), (20, 30, 2)], [(11, 6), (21, 1)]),
    # gain 0.5 halves each step's distance: 2 → ceil(2·2.5) = 5 → ceil(5·1.3) = 7 → 8
    ("upscale smoothing climbs in steps", {"upscale_smoothing_factor": 0.5},
     [(0, 200, 16)], [(30, 5), (61, 7), (92, 8)]),
]


@pytest.mark.parametrize(("overrides", "segments", "expected"),
                         [case[1:] for case in SCENARIOS], ids=[case[0] for case in SCENARIOS])
def test_scenarios(overrides: dict[str, Any], segments: list[Segment],
                   expected: list[tuple[int, int]]) -> None:
    assert changes(QueueLengthConfig(**(BASE | overrides)), *segments) == expected


def test_the_look_back_window_stretches_a_short_burst() -> None:
    # With Ray's default 30 s window, a 20 s burst keeps the average above the target for
    # about 50 s: long enough to pass the 30 s upscale delay. A real Ray property, kept.
    config = QueueLengthConfig(**(BASE | {"look_back_period_s": 30.0}))
    first = changes(config, (0, 100, 4), (100, 120, 16), (120, 300, 4))[0]
    assert first == (131, 6)  # average over [101, 131]: (19·16 + 11·4)/30 = 11.6


def test_state_shows_the_decision_inputs() -> None:
    config = QueueLengthConfig(**BASE)
    state = initial_state(config)
    for t in range(5):
        state = observe(config, state, Observation(float(t), 12.0))
    assert (state.replicas, state.average, state.desired) == (2, 12.0, 6)
    assert (state.pending, state.pending_since_s) == (1, 0.0)
    assert [obs.time_s for obs in state.window] == [3.0, 4.0]  # what the 1 s window needs


@pytest.mark.parametrize(("replicas", "ongoing", "overrides", "expected"), [
    (2, 4, {}, 2),            # at the target
    (2, 8, {}, 4),            # twice the target: twice the replicas
    (2, 5, {}, 3),            # ceil(2·1.25)
    (4, 7, {}, 4),            # ceil(4·0.875) = 4
    (4, 6, {}, 3),
    (4, 0, {}, 1),            # clamped to min_replicas
    (2, 1000, {}, 8),         # clamped to max_replicas
    (2, 16, {"upscale_smoothing_factor": 0.5}, 5),     # ceil(2·(1 + 3·0.5))
    (2, 16, {"smoothing_factor": 0.5}, 5),             # the shared factor, too
    (8, 8, {"downscale_smoothing_factor": 0.5}, 6),    # ceil(8·(1 - 0.5·0.5))
    (4, 6, {"downscale_smoothing_factor": 0.5}, 3),    # smoothing stuck at 4: one step down
    (2, 16, {"upscale_smoothing_factor": 2.0, "smoothing_factor": 0.1}, 8),  # own factor wins
])
def test_the_proportional_rule(replicas: int, ongoing: float, overrides: dict[str, Any],
                               expected: int) -> None:
    config = QueueLengthConfig(**(BASE | overrides))
    assert desired_replicas(config, replicas, ongoing) == expected


@pytest.mark.parametrize(("points", "now", "look_back", "expected"), [
    ([(0, 10)], 0.0, 30.0, 10.0),                 # no width yet: the newest value
    ([(0, 10), (1, 20)], 1.0, 30.0, 10.0),        # the newest holds from now on
    ([(0, 10), (1, 20)], 2.0, 30.0, 15.0),
    ([(0, 10), (10, 20)], 15.0, 10.0, 15.0),      # [5, 10) at 10, [10, 15) at 20
    ([(0, 10), (10, 20)], 40.0, 10.0, 20.0),      # only the value in force since 10
])
def test_the_time_weighted_average(points: list[tuple[float, float]], now: float,
                                   look_back: float, expected: float) -> None:
    window = tuple(Observation(t, value) for t, value in points)
    assert average_ongoing(window, now, look_back) == pytest.approx(expected)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"target_ongoing_requests": 0}, "target_ongoing_requests must be > 0"),
    ({"min_replicas": 0}, "min_replicas must be an integer >= 1"),
    ({"max_replicas": 0}, r"max_replicas must be an integer >= min_replicas \(1\)"),
    ({"initial_replicas": 9}, r"initial_replicas must lie in \[min_replicas, max_replicas\]"),
    ({"upscale_delay_s": -1.0}, "upscale_delay_s must be >= 0"),
    ({"downscale_delay_s": math.nan}, "downscale_delay_s must be >= 0"),
    ({"look_back_period_s": 0.0}, "look_back_period_s must be > 0"),
    ({"smoothing_factor": 0.0}, "smoothing_factor must be > 0"),
    ({"downscale_smoothing_factor": -0.5}, "downscale_smoothing_factor must be > 0"),
])
def test_bad_config_raises_a_clear_value_error(overrides: dict[str, Any],
                                               message: str) -> None:
    with pytest.raises(ValueError, match=message):
        QueueLengthConfig(**(BASE | overrides))


def test_bad_observations_raise_a_clear_value_error() -> None:
    with pytest.raises(ValueError, match="ongoing_requests must be >= 0"):
        Observation(0.0, -1.0)
    with pytest.raises(ValueError, match="time_s must be finite"):
        Observation(math.inf, 1.0)
    config = QueueLengthConfig(**BASE)
    state = observe(config, initial_state(config), Observation(5.0, 1.0))
    with pytest.raises(ValueError, match="observation at 4.0 is older than the last one"):
        observe(config, state, Observation(4.0, 1.0))
