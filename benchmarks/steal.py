"""Hypervisor steal: CPU time the host took from this virtual machine while a benchmark ran.

Why a benchmark needs it: on a shared VM the host sometimes runs another guest on our
physical cores. Every process here stops at once, for 10-30 ms at a time, and no serving
design can hide that (a redundant copy is frozen too). On the 2-core development VM, in the
EMULATED ParM testbed with nothing slowed at 150 q/s, in a spell when 3.3% of the CPU time was
stolen, 88% of the answers above p99.5 had been in flight during a steal, against 8% of those
under p50 (``benchmarks/diagnostics/steal_tail.py``, ``benchmarks/results/steal-tail/``).
A tail measured here is partly the host's.

``StealSampler`` reads Linux's cumulative counters (``/proc/stat``, first line: the ``steal``
field, in USER_HZ ticks of 10 ms) every few milliseconds in a thread, so a run can say how
much was stolen, how many stalls there were, and which queries were in flight during one.
Where the file or the field is missing (not Linux, or an old kernel) it measures nothing and
says so: every figure is None, never a made-up zero.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from parityserve.bench.stats import percentiles

__all__ = ["StealSampler", "StealSamples", "read_ticks", "steal_free"]

PROC_STAT = Path("/proc/stat")
_STEAL_FIELD = 8  # "cpu user nice system idle iowait irq softirq steal ...": index of steal
# A stall: one sampling interval in which at least this many ticks (10 ms each) were stolen.
# At a 5 ms interval, two ticks means the host held the CPUs for 20 ms or more in one go.
STALL_TICKS = 2


def read_ticks(path: Path = PROC_STAT) -> tuple[int, int] | None:
    """(stolen ticks, all ticks) since boot, summed over CPUs; None where not measurable."""
    try:
        with path.open() as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) <= _STEAL_FIELD or fields[0] != "cpu":
        return None
    try:
        ticks = [int(x) for x in fields[1:_STEAL_FIELD + 1]]
    except ValueError:
        return None
    return ticks[-1], sum(ticks)


@dataclass(frozen=True)
class StealSamples:
    """Samples of the cumulative counters: ``times`` (``time.perf_counter``, ascending),
    ``steal`` and ``total`` (ticks since boot). Pure arithmetic over them."""

    times: np.ndarray
    steal: np.ndarray
    total: np.ndarray

    @property
    def measured(self) -> bool:
        return self.times.size >= 2

    def share(self) -> float | None:
        """Stolen ticks over all ticks between the first sample and the last."""
        if not self.measured:
            return None
        spent = float(self.total[-1] - self.total[0])
        return float(self.steal[-1] - self.steal[0]) / spent if spent > 0 else 0.0

    def stalls(self, min_ticks: int = STALL_TICKS) -> int | None:
        """How many sampling intervals lost at least ``min_ticks`` ticks to the host."""
        if not self.measured:
            return None
        return int(np.count_nonzero(np.diff(self.steal) >= min_ticks))

    def during(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray | None:
        """Ticks stolen while each interval [start, end] was open, read from the last sample
        at or before its start to the first at or after its end (so a little wider than the
        interval, never narrower)."""
        if not self.measured:
            return None
        starts, ends = np.asarray(starts, dtype=float), np.asarray(ends, dtype=float)
        before = np.clip(np.searchsorted(self.times, starts, side="right") - 1, 0, None)
        after = np.clip(np.searchsorted(self.times, ends, side="left"), 0, self.times.size - 1)
        return np.asarray(self.steal[after] - self.steal[before], dtype=np.int64)

    def summary(self) -> dict[str, Any]:
        return {"steal_share": self.share(), "steal_stalls": self.stalls(),
                "steal_samples": int(self.times.size)}


class StealSampler:
    """``with StealSampler() as s: ...`` samples the counters in a daemon thread; then
    ``s.samples()``. Each sample costs an open and a one-line read (about 20 us), so the
    default 5 ms interval takes well under 1% of a core from the load generator."""

    def __init__(self, interval_s: float = 0.005, path: Path = PROC_STAT) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.interval_s = interval_s
        self.path = path
        self._rows: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> StealSampler:
        if read_ticks(self.path) is None:
            return self  # nothing to sample here: samples() says unmeasured
        self._sample()
        self._thread = threading.Thread(target=self._run, name="steal-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        ticks = read_ticks(self.path)
        if ticks is not None:
            self._rows.append((time.perf_counter(), *ticks))

    def samples(self) -> StealSamples:
        rows = np.array(self._rows, dtype=float).reshape(-1, 3)
        return StealSamples(rows[:, 0], rows[:, 1], rows[:, 2])


def steal_free(latencies_s: np.ndarray, ok: np.ndarray, sends: np.ndarray,
               samples: StealSamples) -> dict[str, Any]:
    """The answered queries in flight while the host stole nothing: how many, their share of
    the answered ones, and their p50 / p99 / p99.9 (ms), under ``clean_*`` keys.

    A diagnostic, never a headline: a query that lasts longer is more likely to meet a steal
    by chance, so this drops long queries a little more often than short ones whatever made
    them long. That thins a slow baseline's tail more than a fast mode's, so a ratio between
    the two is, if anything, understated here. All None where steal was not measured.
    """
    ok = np.asarray(ok, dtype=bool)
    ticks = samples.during(sends, sends + np.asarray(latencies_s, dtype=float))
    if ticks is None:
        return {"clean_n": None, "clean_share": None, "clean_p50_ms": None,
                "clean_p99_ms": None, "clean_p999_ms": None}
    keep = ok & (ticks == 0)
    q = percentiles(np.asarray(latencies_s, dtype=float)[keep])
    answered = int(ok.sum())
    return {"clean_n": int(keep.sum()), "clean_share": int(keep.sum()) / answered if answered
            else None, "clean_p50_ms": q["p50_ms"], "clean_p99_ms": q["p99_ms"],
            "clean_p999_ms": q["p999_ms"]}
