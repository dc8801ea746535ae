"""The ``queue-length`` baseline: Ray Serve's default autoscaler, as a pure state machine.

This is what users have today (issue 18, item 5), kept beside SERF so that both run in the
same code. It mirrors the behaviour documented for Ray Serve 2.32 and later (the
"Advanced Ray Serve Autoscaling" guide, ``AutoscalingConfig`` and
``replica_queue_length_autoscaling_policy``; 2.32 is where ``target_ongoing_requests``'s
default became 2):

* **Metric.** Ongoing requests (queued plus running) summed over the replicas, averaged over
  the last ``look_back_period_s`` seconds, time-weighted: each observation holds until the next
  one (a right-continuous step function, as the guide describes the controller's aggregation).
  The newest observation therefore weighs in from the next one on: one sampling period of lag,
  as in Ray. Before the window has any width, the newest value is the average.
* **Proportional rule** (``desired_replicas``). error = average / (target · replicas); the
  smoothing ("gain") factor scales the distance to 1, ``upscale_smoothing_factor`` when
  error ≥ 1, else ``downscale_smoothing_factor`` (each defaults to ``smoothing_factor``; newer
  Ray releases call them ``upscaling_factor``/``downscaling_factor``):
  desired = ceil(replicas · (1 + (error - 1) · gain)). If smoothing alone keeps a downscale
  from moving (ceil(replicas · error) < replicas but desired = replicas), desired drops by
  one. Then desired is clamped to [min_replicas, max_replicas].
* **Delays (hysteresis).** A change is applied only after the rule has wanted to move in the
  same direction *consistently* for ``upscale_delay_s`` (up) or ``downscale_delay_s`` (down);
  wanting the other direction, or no change, restarts the wait. When the wait is over, the
  replica count becomes the newest desired value. Ray counts control-loop ticks
  (delay / 0.1 s of them); this counts seconds between timestamped observations, the same rule
  without a fixed tick.

Departures from Ray, on purpose: no scale to zero (``min_replicas`` ≥ 1, since parityserve's
c, the requests run at once, is at least 1, so ``downscale_to_zero_delay_s`` and the cold-start
path do not apply); the running replica count is the policy's own (changing c restarts
nothing, so there are no pending replicas); the aggregation function is the default mean.

Pure: the caller passes each observation with its timestamp; nothing reads a clock.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from typing import Literal

__all__ = ["Observation", "QueueLengthConfig", "QueueLengthState", "average_ongoing",
           "desired_replicas", "initial_state", "observe"]

Direction = Literal[-1, 0, 1]


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _finite(value: float) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(
        value)


def _whole(value: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class QueueLengthConfig:
    """Ray Serve's ``autoscaling_config`` fields that the default policy reads, with its
    documented defaults (Ray 2.32+)."""

    target_ongoing_requests: float = 2.0
    min_replicas: int = 1
    max_replicas: int = 1
    initial_replicas: int | None = None  # None: start at min_replicas
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    look_back_period_s: float = 30.0
    smoothing_factor: float = 1.0
    upscale_smoothing_factor: float | None = None  # None: smoothing_factor
    downscale_smoothing_factor: float | None = None

    def __post_init__(self) -> None:
        _require(_finite(self.target_ongoing_requests) and self.target_ongoing_requests > 0,
                 f"target_ongoing_requests must be > 0, got {self.target_ongoing_requests!r}")
        _require(_whole(self.min_replicas) and self.min_replicas >= 1,
                 f"min_replicas must be an integer >= 1 (parityserve does not scale to "
                 f"zero), got {self.min_replicas!r}")
        _require(_whole(self.max_replicas) and self.max_replicas >= self.min_replicas,
                 f"max_replicas must be an integer >= min_replicas ({self.min_replicas}), "
                 f"got {self.max_replicas!r}")
        start = self.initial_replicas
        _require(start is None or (_whole(start)
                                   and self.min_replicas <= start <= self.max_replicas),
                 f"initial_replicas must lie in [min_replicas, max_replicas], got {start!r}")
        for name in ("upscale_delay_s", "downscale_delay_s"):
            value = getattr(self, name)
            _require(_finite(value) and value >= 0, f"{name} must be >= 0, got {value!r}")
        _require(_finite(self.look_back_period_s) and self.look_back_period_s > 0,
                 f"look_back_period_s must be > 0, got {self.look_back_period_s!r}")
        for name in ("smoothing_factor", "upscale_smoothing_factor",
                     "downscale_smoothing_factor"):
            value = getattr(self, name)
            _require(value is None or (_finite(value) and value > 0),
                     f"{name} must be > 0, got {value!r}")

    @property
    def upscale_gain(self) -> float:
        factor = self.upscale_smoothing_factor
        return self.smoothing_factor if factor is None else factor

    @property
    def downscale_gain(self) -> float:
        factor = self.downscale_smoothing_factor
        return self.smoothing_factor if factor is None else factor


@dataclass(frozen=True, slots=True)
class Observation:
    """Ongoing requests (queued + running, over all replicas) seen at ``time_s``."""

    time_s: float
    ongoing_requests: float

    def __post_init__(self) -> None:
        _require(_finite(self.time_s), f"time_s must be finite, got {self.time_s!r}")
        _require(_finite(self.ongoing_requests) and self.ongoing_requests >= 0,
                 f"ongoing_requests must be >= 0, got {self.ongoing_requests!r}")


@dataclass(frozen=True, slots=True)
class QueueLengthState:
    """Where the policy stands. ``replicas`` is its output: the replica count to run now.

    ``average`` and ``desired`` are the last decision's inputs, kept to be shown;
    ``pending`` is the direction the rule has wanted since ``pending_since_s`` (0: none).
    """

    replicas: int
    window: tuple[Observation, ...] = ()
    average: float = 0.0
    desired: int = 0
    pending: Direction = 0
    pending_since_s: float = 0.0


def initial_state(config: QueueLengthConfig) -> QueueLengthState:
    replicas = config.initial_replicas or config.min_replicas
    return QueueLengthState(replicas=replicas, desired=replicas)


def desired_replicas(config: QueueLengthConfig, replicas: int, ongoing_requests: float) -> int:
    """Ray's proportional rule, before any delay (see the module docstring)."""
    error = ongoing_requests / (config.target_ongoing_requests * replicas)
    gain = config.upscale_gain if error >= 1 else config.downscale_gain
    desired = math.ceil(replicas * (1 + (error - 1) * gain))
    if math.ceil(replicas * error) < replicas and desired == replicas:
        desired -= 1  # smoothing must slow a downscale, not stop it
    return max(config.min_replicas, min(config.max_replicas, desired))


def _in_window(window: tuple[Observation, ...], start: float) -> tuple[Observation, ...]:
    """The observations after ``start``, plus the last one at or before it: the value in
    force when the window opens."""
    inside = [i for i, obs in enumerate(window) if obs.time_s > start]
    first = inside[0] if inside else len(window)
    return window[max(0, first - 1):]


def average_ongoing(window: tuple[Observation, ...], now: float, look_back_s: float) -> float:
    """Time-weighted mean over [now - look_back_s, now] of the step function the
    observations draw (each holds until the next); the newest value while that has no width."""
    _require(bool(window), "average_ongoing needs at least one observation")
    start = max(now - look_back_s, window[0].time_s)
    if now <= start:
        return window[-1].ongoing_requests
    edges = [max(obs.time_s, start) for obs in window[1:]] + [now]
    total, left = 0.0, start
    for obs, right in zip(window, edges, strict=True):
        total += obs.ongoing_requests * (right - left)
        left = right
    return total / (now - start)


def _direction(desired: int, replicas: int) -> Direction:
    return 1 if desired > replicas else -1 if desired < replicas else 0


def _delay(config: QueueLengthConfig, direction: Direction) -> float:
    return config.upscale_delay_s if direction > 0 else config.downscale_delay_s


def _apply_delay(config: QueueLengthConfig, state: QueueLengthState,
                 now: float) -> QueueLengthState:
    """Scale only once the rule has wanted this direction for the whole delay."""
    direction = _direction(state.desired, state.replicas)
    if direction == 0:
        return replace(state, pending=0)
    since = state.pending_since_s if state.pending == direction else now
    if now - since >= _delay(config, direction):
        return replace(state, replicas=state.desired, pending=0)
    return replace(state, pending=direction, pending_since_s=since)


def observe(config: QueueLengthConfig, state: QueueLengthState,
            observation: Observation) -> QueueLengthState:
    """One step: record ``observation`` and return the new state; its ``replicas`` is the
    count to run from ``observation.time_s`` on. Observations must come in time order."""
    now = observation.time_s
    if state.window:
        _require(now >= state.window[-1].time_s,
                 f"observation at {now} is older than the last one at "
                 f"{state.window[-1].time_s}")
    window = _in_window(state.window + (observation,), now - config.look_back_period_s)
    average = average_ongoing(window, now, config.look_back_period_s)
    desired = desired_replicas(config, state.replicas, average)
    updated = replace(state, window=window, average=average, desired=desired)
    return _apply_delay(config, updated, now)
