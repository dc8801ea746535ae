"""Is the event loop saturated? The signal behind the scheduler's busy hold
(``core/scheduling/machine.py``, ``Scheduler.busy_hold_s``).

A loop is saturated when its thread never waits for I/O: it is either running or ready to run
and waiting for a CPU (behind the workers, ZeroMQ's and grpc's threads on a shared core). Linux
keeps both times per thread in ``/proc/thread-self/schedstat`` (nanoseconds on the CPU, then
nanoseconds runnable on a run queue), so the busy share of a window is (both deltas) / (wall
time). Measured under load with the server on one core (2026-11-28): 0.98-0.99 with 8 or 64
clients in flight, gRPC or HTTP; 0.6-0.7 with one client, whose next request cannot come before
its answer; 0.01 idle.

Read at most once per ``window_s`` of wall time, from whoever asks (the pump), so an idle server
reads nothing and a busy one pays one ``pread`` per window (a few microseconds per 10 ms). The
level is smoothed over windows, so one busy window at low load does not make batches wait.
Where the file is missing (not Linux, or a kernel without scheduler statistics), the thread's
own CPU time stands in: it misses the time spent runnable, so the level reads lower and the
busy hold engages only when the loop alone fills its core.

What it cannot see: a thread waiting for the GIL sleeps, so it reads idle. In a server process
that costs little (grpc's and ZeroMQ's threads hold the GIL briefly); a loop sharing its
process with busy Python threads (a test's clients, an embedding application) reads lower than
it is, 0.87-0.96 under a spinner that never let it wait, in an in-process test.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable

__all__ = ["LoopPressure", "busy_ns"]

SCHEDSTAT = "/proc/thread-self/schedstat"


class _SchedstatReader:
    """The calling thread's (CPU + run-queue) nanoseconds; the file is opened on first use, by
    the thread that reads it, since ``thread-self`` names the opener."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._missing = False

    def __call__(self) -> int:
        if not self._missing:
            try:
                if self._fd is None:
                    self._fd = os.open(SCHEDSTAT, os.O_RDONLY)
                    weakref.finalize(self, os.close, self._fd)
                fields = os.pread(self._fd, 128, 0).split()
                return int(fields[0]) + int(fields[1])
            except (OSError, IndexError, ValueError):
                self._missing = True
        return time.thread_time_ns()


def busy_ns() -> Callable[[], int]:
    """A reader of the calling thread's busy nanoseconds (see the module's docstring)."""
    return _SchedstatReader()


class LoopPressure:
    """``saturated()``: has the loop's thread been busy nearly all the time lately?"""

    def __init__(self, *, threshold: float = 0.9, window_s: float = 0.01,
                 smoothing: float = 0.3, clock: Callable[[], float] = time.monotonic,
                 read: Callable[[], int] | None = None) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        if not window_s > 0.0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        self.threshold = threshold
        self.window_s = window_s
        self.smoothing = smoothing
        self._clock = clock
        self._read = read or busy_ns()
        self._since: float | None = None
        self._busy_at_since = 0
        self.level = 0.0  # the smoothed busy share of wall time, 0..1
        self._saturated = False

    @property
    def last_verdict(self) -> bool:
        """What ``saturated`` last answered, without reading anything (for status pages, which
        may run on another thread than the loop's)."""
        return self._saturated

    def saturated(self) -> bool:
        now = self._clock()
        since = self._since
        if since is not None and now - since < self.window_s:
            return self._saturated
        busy = self._read()
        if since is not None:
            share = min(1.0, (busy - self._busy_at_since) / ((now - since) * 1e9))
            self.level += self.smoothing * (share - self.level)
            self._saturated = self.level >= self.threshold
        self._since, self._busy_at_since = now, busy
        return self._saturated
