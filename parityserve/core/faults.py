"""Fault-injection decisions for one replica: how long to stall, when to crash or hang,
which outputs to corrupt.

The worker process applies these decisions (sleeps, exits, corrupts its reply); keeping
the decisions here, driven by a caller's clock and random generator, makes every fault
scenario reproducible from a seed and testable without processes.

The plan splits its generator into independent streams (base delays, burst timeline,
corruption), so that, for example, the burst timeline depends only on the seed and the
start time, not on how many batches happened to be served or corrupted.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
import numpy.typing as npt

from parityserve.errors import ConfigError

__all__ = [
    "BurstSpec",
    "DelayDistribution",
    "FaultAction",
    "FaultPlan",
    "FaultSpec",
    "FaultStats",
    "WrongKind",
    "check_delay_shape",
    "draw_delay",
    "lomax_draw",
]

DelayDistribution = Literal["constant", "exponential", "uniform", "pareto"]
WrongKind = Literal["noise", "labels"]


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _build(cls: type[Any], d: Mapping[str, Any], what: str, **overrides: Any) -> Any:
    """Construct a spec dataclass from a mapping with exactly its field names."""
    unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
    _require(not unknown, f"unknown {what} settings: {', '.join(map(str, unknown))}")
    try:
        return cls(**{**d, **overrides})
    except TypeError as exc:  # a wrong value type surfaces as a failed comparison
        raise ConfigError(f"invalid {what} settings {dict(d)!r}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class BurstSpec:
    """Bursts of extra delay: off for an exponential gap with mean ``every_ms``, then on
    for ``duration_ms``, during which each batch is delayed ``delay_ms`` more. Over a long
    run a fraction ``duration / (every + duration)`` of the time is in a burst."""

    every_ms: float
    duration_ms: float
    delay_ms: float

    def __post_init__(self) -> None:
        for name in ("every_ms", "duration_ms", "delay_ms"):
            value = getattr(self, name)
            _require(value > 0 and math.isfinite(value), f"burst {name} must be > 0, got {value}")

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> BurstSpec:
        result: BurstSpec = _build(cls, d, "burst")
        return result


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """What to inject into one replica; mirrors ``parityserve.config.FaultConfig``."""

    delay_ms: float = 0.0
    delay_distribution: DelayDistribution = "constant"
    delay_tail_index: float = 2.0
    burst: BurstSpec | None = None
    wrong_probability: float = 0.0
    wrong_kind: WrongKind = "noise"
    noise_sigma: float = 1.0
    crash_after_batches: int | None = None
    hang_after_batches: int | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        _require(self.delay_ms >= 0, f"delay_ms must be >= 0, got {self.delay_ms}")
        check_delay_shape(self.delay_distribution, self.delay_tail_index)
        _check_choice("wrong_kind", self.wrong_kind, WrongKind)
        p = self.wrong_probability
        _require(0 <= p <= 1, f"wrong_probability must be in [0, 1], got {p}")
        _require(self.noise_sigma >= 0, f"noise_sigma must be >= 0, got {self.noise_sigma}")
        for name in ("crash_after_batches", "hang_after_batches"):
            n = getattr(self, name)
            _require(n is None or n >= 0, f"{name} must be >= 0 or None, got {n}")

    @property
    def is_noop(self) -> bool:
        """True when the spec injects nothing at all (the seed alone changes nothing)."""
        return dataclasses.replace(self, seed=None) == FaultSpec()

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> FaultSpec:
        """Build from ``FaultConfig.model_dump()``: the same keys, ``burst`` a dict or None."""
        burst = d.get("burst")
        if isinstance(burst, Mapping):
            burst = BurstSpec.from_mapping(burst)
        result: FaultSpec = _build(cls, d, "fault", burst=burst)
        return result


def _check_choice(name: str, value: object, options: object) -> None:
    allowed = get_args(options)
    _require(value in allowed, f"{name} must be one of {allowed}, got {value!r}")


@dataclass(frozen=True, slots=True)
class FaultAction:
    """What the worker must do for one batch. ``batch_index`` is 1 for the first batch."""

    delay_s: float
    crash: bool
    hang: bool
    batch_index: int


@dataclass(frozen=True, slots=True)
class FaultStats:
    """A snapshot of a ``FaultPlan``."""

    batches: int
    delayed: int
    bursts_seen: int
    corrupted_rows: int


class _BurstClock:
    """The burst timeline, generated lazily: only the current (or next) window is kept."""

    # Past this many mean cycles of idleness, jump ahead instead of walking every window.
    _JUMP_CYCLES = 1000

    def __init__(self, spec: BurstSpec, rng: np.random.Generator, start: float) -> None:
        self._gap_s = spec.every_ms / 1000.0
        self._len_s = spec.duration_ms / 1000.0
        self._rng = rng
        self.started = 0  # bursts begun at or before the latest time asked about
        self._open_window(start + self._draw_gap())

    def in_burst(self, now: float) -> bool:
        """Whether ``now`` is inside a burst. Times should not go backwards: an earlier
        time is judged against the current window only."""
        if now - self._end > self._JUMP_CYCLES * (self._gap_s + self._len_s):
            self._jump(now)
        while now >= self._end:
            self._count_window()
            self._open_window(self._end + self._draw_gap())
        if now >= self._start:
            self._count_window()
        return self._start <= now < self._end

    def _draw_gap(self) -> float:
        return float(self._rng.exponential(self._gap_s))

    def _open_window(self, start: float) -> None:
        self._start, self._end, self._counted = start, start + self._len_s, False

    def _count_window(self) -> None:
        if not self._counted:
            self.started += 1
            self._counted = True

    def _jump(self, now: float) -> None:
        # Long after the last window the process is stationary: in a burst with chance
        # duration/(every+duration) at a uniform age, else off with an Exp(every) wait left
        # (memorylessness). The skipped bursts are counted by their expected number.
        cycle = self._gap_s + self._len_s
        self.started += int((now - self._end) / cycle)
        if self._rng.random() < self._len_s / cycle:
            self._open_window(now - self._rng.uniform(0.0, self._len_s))
        else:
            self._open_window(now + self._draw_gap())


class FaultPlan:
    """The fault schedule of one replica, from its spec, a generator and a start time."""

    def __init__(self, spec: FaultSpec, rng: np.random.Generator, start: float) -> None:
        self.spec = spec
        delay_rng, burst_rng, self._corrupt_rng = rng.spawn(3)
        self._delay_rng = delay_rng
        self._bursts = None if spec.burst is None else _BurstClock(spec.burst, burst_rng, start)
        self._batches = 0
        self._delayed = 0
        self._corrupted_rows = 0

    def next_batch(self, now: float) -> FaultAction:
        """Decide the faults of the next batch, served at time ``now`` (seconds)."""
        self._batches += 1
        delay_ms = self._base_delay_ms() + self._burst_delay_ms(now)
        self._delayed += delay_ms > 0
        return FaultAction(
            delay_s=delay_ms / 1000.0,
            crash=_due(self.spec.crash_after_batches, self._batches),
            hang=_due(self.spec.hang_after_batches, self._batches),
            batch_index=self._batches,
        )

    def in_burst(self, now: float) -> bool:
        return self._bursts is not None and self._bursts.in_burst(now)

    def corrupt(
        self, outputs: npt.NDArray[Any], *, num_classes: int | None = None
    ) -> tuple[npt.NDArray[Any], npt.NDArray[np.bool_]]:
        """Corrupt each row (query) with probability ``wrong_probability``.

        Returns a new array and the mask of corrupted rows; ``outputs`` is never modified.
        A row that cannot be made wrong (a single-class score row) is left out of the mask.
        ``num_classes`` widens the label range of 1-D label outputs, whose class count
        cannot be read off the array.
        """
        out = np.array(outputs, copy=True)
        _require_rows(out)
        mask = self._pick_rows(len(out))
        if mask.any():
            mask = _apply(out, mask, self.spec, self._corrupt_rng, num_classes)
        self._corrupted_rows += int(mask.sum())
        return out, mask

    def statistics(self) -> FaultStats:
        seen = 0 if self._bursts is None else self._bursts.started
        return FaultStats(self._batches, self._delayed, seen, self._corrupted_rows)

    def _base_delay_ms(self) -> float:
        spec = self.spec
        return draw_delay(self._delay_rng, spec.delay_ms, spec.delay_distribution,
                          spec.delay_tail_index)

    def _burst_delay_ms(self, now: float) -> float:
        burst = self.spec.burst
        return burst.delay_ms if burst is not None and self.in_burst(now) else 0.0

    def _pick_rows(self, n: int) -> npt.NDArray[np.bool_]:
        p = self.spec.wrong_probability
        if p == 0:  # the common, fault-free case draws nothing
            return np.zeros(n, dtype=bool)
        return self._corrupt_rng.random(n) < p


def check_delay_shape(distribution: str, tail_index: float, *, prefix: str = "delay") -> None:
    """Raise ConfigError unless ``distribution`` is a known DelayDistribution and
    ``tail_index`` gives a finite mean: the one rule for what ``draw_delay`` may be asked,
    for fault specs (``delay_*``) and the simulator's delay windows (``window_*``)."""
    _check_choice(f"{prefix}_distribution", distribution, DelayDistribution)
    _require(tail_index > 1 and math.isfinite(tail_index),
             f"{prefix}_tail_index must be > 1 (a finite mean), got {tail_index}")


def draw_delay(rng: np.random.Generator, mean: float, distribution: DelayDistribution,
               tail_index: float = 2.0) -> float:
    """One delay with this mean (any unit): what a fault adds to a batch, in the shape its
    distribution names. A constant (or zero) delay draws nothing, so a constant plan's
    random stream is untouched."""
    if mean == 0 or distribution == "constant":
        return mean
    if distribution == "exponential":
        return float(rng.exponential(mean))
    if distribution == "pareto":
        return lomax_draw(rng, mean, tail_index)
    return float(rng.uniform(0.0, 2.0 * mean))


def lomax_draw(rng: np.random.Generator, mean: float, tail_index: float) -> float:
    """One heavy-tailed delay: Lomax (Pareto II, starting at 0), P(D > d) = (1 + d/s)^-a.

    Why this shape: a delay from a congested link is mostly small with rare long ones
    (queues in a shared switch, a retransmission timeout), a power-law tail; an exponential
    one falls off far faster. The scale s = mean (a - 1) keeps the configured mean, so the
    tail index alone sets how heavy the tail is: smaller is heavier, a <= 2 has no variance.
    numpy's ``pareto`` draws exactly this with s = 1.
    """
    return float(mean * (tail_index - 1.0) * rng.pareto(tail_index))


def _due(after: int | None, batch_number: int) -> bool:
    """True from batch ``after + 1`` on: ``after`` batches are served normally first."""
    return after is not None and batch_number > after


def _require_rows(out: npt.NDArray[Any]) -> None:
    if out.ndim == 0:
        raise ValueError("outputs must have a batch dimension (one row per query)")
    if not (np.issubdtype(out.dtype, np.number) or out.dtype == np.bool_):
        raise TypeError(f"cannot corrupt outputs of dtype {out.dtype}")


def _apply(
    out: npt.NDArray[Any],
    mask: npt.NDArray[np.bool_],
    spec: FaultSpec,
    rng: np.random.Generator,
    num_classes: int | None,
) -> npt.NDArray[np.bool_]:
    """Corrupt the masked rows of ``out`` in place; return the rows that changed."""
    if spec.wrong_kind == "noise" and np.issubdtype(out.dtype, np.inexact):
        noise = rng.normal(0.0, spec.noise_sigma, size=out[mask].shape)
        out[mask] += noise.astype(out.dtype)
        return mask
    # Labels, and "noise" on integer outputs, where noise can only mean a wrong label.
    if out.ndim == 1:
        _relabel(out, mask, rng, num_classes)
        return mask
    return _move_argmaxes(out.reshape(len(out), -1), mask, rng)


def _relabel(
    out: npt.NDArray[Any],
    mask: npt.NDArray[np.bool_],
    rng: np.random.Generator,
    num_classes: int | None,
) -> None:
    """Give each masked 1-D label a uniformly random *different* label in [0, classes)."""
    top = 2 if out.dtype == np.bool_ else max(num_classes or 0, int(out.max()) + 1, 2)
    old = out[mask].astype(np.float64)
    draw = rng.integers(0, top - 1, size=old.shape)
    # Skip over the old label: uniform over the other classes, never the same one.
    out[mask] = (draw + (draw >= old)).astype(out.dtype)


def _move_argmaxes(
    rows: npt.NDArray[Any], mask: npt.NDArray[np.bool_], rng: np.random.Generator
) -> npt.NDArray[np.bool_]:
    """Swap each masked row's top score onto a uniformly random other class."""
    changed = np.zeros_like(mask)
    for i in np.flatnonzero(mask):
        changed[i] = _move_argmax(rows[i], rng)
    return changed


def _move_argmax(row: npt.NDArray[Any], rng: np.random.Generator) -> bool:
    """Make ``row``'s argmax a different class, in place; False if that is impossible."""
    if row.size < 2:
        return False
    old = int(np.argmax(row))
    target = int(rng.integers(0, row.size - 1))
    target += target >= old
    row[[old, target]] = row[[target, old]]  # a swap keeps the row a valid score vector
    if int(np.argmax(row)) == old:  # the target tied with the maximum: lift it above
        _lift(row, target, row[old])
    return int(np.argmax(row)) != old


def _lift(row: npt.NDArray[Any], i: int, top: Any) -> None:
    """Raise ``row[i]`` just above ``top`` where the dtype has room (not bool/complex)."""
    if np.issubdtype(row.dtype, np.floating):
        row[i] = np.nextafter(top, np.inf, dtype=row.dtype)
    elif np.issubdtype(row.dtype, np.integer) and top < np.iinfo(row.dtype).max:
        row[i] = top + 1
