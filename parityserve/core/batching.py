"""Adaptive batching, as in Clipper (NSDI'17, section 4.3).

Two independent decisions live here:

* ``AIMDController`` picks the largest batch a replica may take. Bigger batches raise
  throughput, but past some size the batch no longer finishes within the latency SLO.
  Additive increase / multiplicative decrease probes for that size online and backs off
  quickly when the model slows down (a noisy neighbour, a burst of network traffic).
* ``decide_batch`` is *delayed batching*: under light load a queue rarely holds a full
  batch, so waiting a few milliseconds for more queries can buy a much better batch.
  It is a pure function of the queue's state and the clock, so the dispatcher's loop
  stays trivial and the rule can be tested with a table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from parityserve.errors import ConfigError

__all__ = ["AIMDController", "AIMDStats", "BatchDecision", "decide_batch"]


@dataclass(frozen=True, slots=True)
class AIMDStats:
    """A snapshot of an ``AIMDController``."""

    max_batch_size: int
    ceiling: int
    slo_s: float
    increases: int
    backoffs: int


class AIMDController:
    """Additive-increase / multiplicative-decrease search for the largest on-time batch.

    ``observe`` is fed the size and service latency of every finished batch. A batch over
    the SLO shrinks the limit by ``backoff``; a *full* batch that made the SLO grows it by
    ``additive_step``. A batch that was not full says nothing about whether a larger one
    would be on time, so it leaves the limit alone.
    """

    def __init__(
        self,
        ceiling: int,
        slo_s: float,
        *,
        additive_step: int = 1,
        backoff: float = 0.9,
        initial: int = 1,
    ) -> None:
        _check_ceiling(ceiling)
        _check_slo(slo_s)
        if additive_step < 1:
            raise ConfigError(f"AIMD additive_step must be >= 1, got {additive_step}")
        if not 0.0 < backoff < 1.0:
            raise ConfigError(f"AIMD backoff must be in (0, 1), got {backoff}")
        if not 1 <= initial <= ceiling:
            raise ConfigError(f"AIMD initial size must be in [1, {ceiling}], got {initial}")
        self._ceiling = ceiling
        self._slo_s = slo_s
        self._step = additive_step
        self._backoff = backoff
        self._size = initial
        self._increases = 0
        self._backoffs = 0

    @property
    def max_batch_size(self) -> int:
        """The largest batch a replica should take now; always in ``[1, ceiling]``."""
        return self._size

    def observe(self, batch_size: int, latency_s: float) -> None:
        """Update the limit from one finished batch."""
        if latency_s > self._slo_s:
            self._shrink()
        elif batch_size >= self._size and self._size < self._ceiling:
            self._size = min(self._ceiling, self._size + self._step)
            self._increases += 1

    def set_slo(self, slo_s: float) -> None:
        """Change the latency target; the limit adapts through later observations."""
        _check_slo(slo_s)
        self._slo_s = slo_s

    def set_ceiling(self, ceiling: int) -> None:
        """Change the hard upper bound, clamping the current limit into it."""
        _check_ceiling(ceiling)
        self._ceiling = ceiling
        self._size = min(self._size, ceiling)

    def statistics(self) -> AIMDStats:
        return AIMDStats(self._size, self._ceiling, self._slo_s, self._increases, self._backoffs)

    def _shrink(self) -> None:
        # A back-off must free at least one slot, or a small, slow batch size would never
        # shrink. floor(size * backoff) < size already holds for backoff < 1; the min() keeps
        # that guarantee explicit and safe from float rounding of the product.
        if self._size > 1:
            self._size = max(1, min(self._size - 1, math.floor(self._size * self._backoff)))
        self._backoffs += 1


def _check_ceiling(ceiling: int) -> None:
    if ceiling < 1:
        raise ConfigError(f"AIMD ceiling (max_batch_size) must be >= 1, got {ceiling}")


def _check_slo(slo_s: float) -> None:
    if not slo_s > 0.0:
        raise ConfigError(f"latency SLO must be > 0 seconds, got {slo_s}")


@dataclass(frozen=True, slots=True)
class BatchDecision:
    """What the dispatcher should do now.

    ``dispatch`` with ``size`` queries, or wait: until ``wake_at`` (a time on the caller's
    clock) when a partial batch is being held back, or until the next arrival when
    ``wake_at`` is None.
    """

    dispatch: bool
    size: int
    wake_at: float | None


_IDLE = BatchDecision(dispatch=False, size=0, wake_at=None)


def decide_batch(
    queue_len: int,
    oldest_enqueued_at: float | None,
    now: float,
    max_batch: int,
    max_delay_s: float,
) -> BatchDecision:
    """Delayed batching: send a full batch at once, and a partial one only after it has
    waited ``max_delay_s`` (measured from its oldest query) for more queries to arrive."""
    _check_batch_args(queue_len, max_batch, max_delay_s)
    if queue_len == 0:
        return _IDLE
    if oldest_enqueued_at is None:
        raise ValueError("a non-empty queue must report when its oldest entry was enqueued")
    # Compare against the same sum we hand out as ``wake_at``: a caller that wakes exactly
    # at wake_at must then dispatch, whatever the float rounding of ``now - oldest``.
    due = oldest_enqueued_at + max_delay_s
    if queue_len >= max_batch or max_delay_s == 0.0 or now >= due:
        return BatchDecision(dispatch=True, size=min(queue_len, max_batch), wake_at=None)
    return BatchDecision(dispatch=False, size=0, wake_at=due)


def _check_batch_args(queue_len: int, max_batch: int, max_delay_s: float) -> None:
    if queue_len < 0:
        raise ValueError(f"queue_len must be >= 0, got {queue_len}")
    if max_batch < 1:
        raise ConfigError(f"max_batch must be >= 1, got {max_batch}")
    if not max_delay_s >= 0.0:
        raise ConfigError(f"max_delay_s must be >= 0, got {max_delay_s}")
