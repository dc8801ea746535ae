"""``runtime/modelpath/loop_pressure.py``: the busy share of the loop's thread, smoothed over
windows, read from a fake clock and a fake busy counter; then the real reader on this thread."""

from __future__ import annotations

import time

import pytest

from parityserve.runtime.modelpath import loop_pressure
from parityserve.runtime.modelpath.loop_pressure import LoopPressure


class Thread:
    """A fake thread: wall time and busy nanoseconds advance together, as told."""

    def __init__(self) -> None:
        self.now = 100.0
        self.busy = 0

    def run(self, seconds: float, busy_share: float) -> None:
        self.now += seconds
        self.busy += int(seconds * busy_share * 1e9)


def pressure(thread: Thread, **kwargs: float) -> LoopPressure:
    return LoopPressure(clock=lambda: thread.now, read=lambda: thread.busy, **kwargs)


def test_a_loop_busy_all_the_time_becomes_saturated_after_some_windows() -> None:
    thread = Thread()
    gauge = pressure(thread)
    assert not gauge.saturated()  # the first reading only starts a window
    verdicts = []
    for _ in range(20):
        thread.run(0.01, 1.0)
        verdicts.append(gauge.saturated())
    assert verdicts[0] is False and verdicts[-1] is True  # smoothed: not at the first window
    assert gauge.level > 0.95 and gauge.last_verdict


def test_one_client_at_a_time_never_saturates_it() -> None:
    thread = Thread()
    gauge = pressure(thread)
    gauge.saturated()
    for step in range(200):  # 0.6-0.7 busy, as measured with one client; one window at 1.0
        thread.run(0.01, 1.0 if step == 150 else 0.65)
        assert not gauge.saturated()


def test_readings_within_a_window_reuse_the_last_verdict() -> None:
    thread = Thread()
    reads = []

    def read() -> int:
        reads.append(thread.now)
        return thread.busy

    gauge = LoopPressure(clock=lambda: thread.now, read=read)
    gauge.saturated()
    thread.run(0.004, 1.0)
    gauge.saturated()
    thread.run(0.004, 1.0)
    gauge.saturated()
    assert len(reads) == 1  # 8 ms < the 10 ms window: nothing read again
    thread.run(0.004, 1.0)
    gauge.saturated()
    assert len(reads) == 2


def test_an_idle_spell_ends_saturation_at_the_next_reading() -> None:
    thread = Thread()
    gauge = pressure(thread)
    gauge.saturated()
    for _ in range(30):
        thread.run(0.01, 1.0)
        gauge.saturated()
    assert gauge.last_verdict
    thread.run(2.0, 0.01)  # two seconds with nothing to do
    assert not gauge.saturated()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"threshold": 0.0}, "threshold"), ({"threshold": 1.5}, "threshold"),
    ({"window_s": 0.0}, "window_s"), ({"smoothing": 0.0}, "smoothing"),
])
def test_bad_settings_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LoopPressure(**kwargs)


def test_the_real_reader_counts_this_thread_spinning() -> None:
    """On the CPU or waiting for one counts; not all of 50 ms of wall time, though: waiting
    for the GIL is sleeping, and a thread another test left running in this process takes it
    (37 of 50 ms in a clean-clone CI at fa34e8f). So the reading is held to the thread's own
    CPU time over the same spin, less a scheduler tick of lag."""
    read = loop_pressure.busy_ns()
    start, cpu, began = read(), time.thread_time_ns(), time.monotonic()
    while time.monotonic() - began < 0.05:
        pass
    spun, cpu = read() - start, time.thread_time_ns() - cpu
    assert cpu > 0.01e9 and spun >= cpu - 0.01e9, (spun, cpu)


def test_without_schedstat_the_reader_falls_back_to_the_threads_cpu_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop_pressure, "SCHEDSTAT", "/nonexistent/schedstat")
    read = loop_pressure.busy_ns()
    first = read()
    assert abs(first - time.thread_time_ns()) < 0.05e9
