"""A graph member's own account of its silences (issue 41).

The frontend suspects a member that said nothing for ``heartbeat_timeout_ms``, and all it can
log then is how long the silence was and the member's thread states. On the 4-node Ray rig a
healthy member (every thread asleep) was suspected 6 times in 50 node crashes, and from the
frontend's side nothing said why. This watch runs in the member: a thread that wakes every
heartbeat interval and, when the process has sent nothing for ``report_after_s``, writes one
line to the member's stderr with

- how long it has been quiet, and how late the watch itself woke (a watch woken 200 ms late
  says the process was starved of CPU; one woken on time, a process blocked on something);
- each thread's state letter (``/proc/self/task``);
- the main thread's innermost frames: what it is waiting on;

and, when it speaks again, one more line with the whole silence. It costs one wake-up per
heartbeat interval and writes nothing while the member is not quiet.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Callable

__all__ = ["StallWatch", "cpu_ticks", "thread_states"]

FRAMES = 4  # of the main thread's stack, innermost last


def _stat_fields(path: str) -> list[bytes] | None:
    """The fields of a ``/proc`` ``stat`` file after the command name, the state letter first
    (the name may hold spaces or ')'); None when the file cannot be read (the process gone)."""
    try:
        with open(path, "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2:].split()


def thread_states(pid: int | str) -> str:
    """The state letter of each thread of ``pid`` (or ``"self"``), sorted (``"RSS"``: one
    runnable, two asleep); empty when the process is gone."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return ""
    letters = []
    for tid in threads:
        fields = _stat_fields(f"/proc/{pid}/task/{tid}/stat")
        if fields:
            letters.append(fields[0][:1].decode("ascii", "replace"))
    return "".join(sorted(letters))


def cpu_ticks(pid: int) -> int | None:
    """The user and system CPU time process ``pid`` has used, in clock ticks (None: gone)."""
    fields = _stat_fields(f"/proc/{pid}/stat")
    try:  # counted from the state letter (0): utime is 11, stime 12
        return int(fields[11]) + int(fields[12]) if fields is not None else None
    except (IndexError, ValueError):
        return None


class StallWatch:
    """Reports a silence of the process it runs in: ``last_sent()`` is when it last sent
    anything. ``check`` is the decision, clock and writer injected (unit-tested); ``start``
    runs it on a daemon thread."""

    def __init__(self, name: str, last_sent: Callable[[], float], every_s: float,
                 report_after_s: float, *, clock: Callable[[], float] = time.monotonic,
                 write: Callable[[str], object] | None = None,
                 where: Callable[[], str] | None = None) -> None:
        self.name, self.last_sent = name, last_sent
        self.every_s, self.report_after_s = every_s, report_after_s
        self.clock = clock
        self.write = write or _stderr
        self.where = where or _main_thread_frames
        self._reported: float | None = None  # the ``last_sent`` of the silence reported
        self._stop = threading.Event()
        self._worst_late_s = 0.0  # the watch's own latest wake-up during that silence

    def check(self, now: float, late_s: float) -> None:
        """One look: ``late_s`` is how much later than asked this wake-up came."""
        sent = self.last_sent()
        if self._reported is not None and sent != self._reported:
            self.write(f"{self.name}: spoke again after {(sent - self._reported) * 1e3:.0f} ms "
                       f"of silence (the watch woke at most {self._worst_late_s * 1e3:.0f} ms "
                       "late meanwhile)")
            self._reported = None
        quiet = now - sent
        if self._reported is not None:
            self._worst_late_s = max(self._worst_late_s, late_s)
        elif sent > 0 and quiet >= self.report_after_s:
            self._reported, self._worst_late_s = sent, late_s
            self.write(f"{self.name}: quiet for {quiet * 1e3:.0f} ms (the watch woke "
                       f"{late_s * 1e3:.0f} ms late; threads {thread_states('self')}); "
                       f"main thread at: {self.where()}")

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, daemon=True, name="stall-watch")
        thread.start()
        return thread

    def stop(self) -> None:
        """End the thread at its next wake-up (a member's watch lives as long as it does)."""
        self._stop.set()

    def _run(self) -> None:
        due = self.clock() + self.every_s
        while not self._stop.wait(max(0.0, due - self.clock())):
            now = self.clock()
            self.check(now, max(0.0, now - due))
            due = now + self.every_s


def _stderr(line: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"{stamp} WARNING stall-watch {line}", file=sys.stderr, flush=True)


def _main_thread_frames() -> str:
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    if frame is None:
        return "(gone)"
    stack = traceback.extract_stack(frame)[-FRAMES:]
    return " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}"
                       for f in reversed(stack))
