"""A member's own account of its silences (``hams_stall``): when it reports, what it says, and
that it says it once per silence."""

from __future__ import annotations

import time

from parityserve.runtime.graphs.hams_stall import StallWatch, thread_states


class _Clock:
    def __init__(self) -> None:
        self.sent = 0.0


def _watch(clock: _Clock, lines: list[str]) -> StallWatch:
    return StallWatch("g/op/primary-1", lambda: clock.sent, 0.05, 0.15, write=lines.append,
                      where=lambda: "hams_worker.py:300 seed")


def test_quiet_past_the_limit_is_reported_once_with_where_the_main_thread_is() -> None:
    clock, lines = _Clock(), []
    watch = _watch(clock, lines)
    clock.sent = 10.0
    watch.check(10.10, 0.0)
    assert lines == []  # 100 ms quiet: under the limit
    watch.check(10.16, 0.004)
    assert len(lines) == 1
    assert "g/op/primary-1: quiet for 160 ms (the watch woke 4 ms late" in lines[0]
    assert "main thread at: hams_worker.py:300 seed" in lines[0]
    watch.check(10.21, 0.120)
    watch.check(10.26, 0.0)
    assert len(lines) == 1  # the same silence: once


def test_speaking_again_closes_the_silence_with_its_length_and_the_worst_lateness() -> None:
    clock, lines = _Clock(), []
    watch = _watch(clock, lines)
    clock.sent = 10.0
    watch.check(10.2, 0.01)
    watch.check(10.3, 0.09)
    clock.sent = 10.33
    watch.check(10.35, 0.0)
    assert lines[1] == ("g/op/primary-1: spoke again after 330 ms of silence (the watch woke at "
                        "most 90 ms late meanwhile)")
    watch.check(10.40, 0.0)
    assert len(lines) == 2  # speaking: nothing to say
    watch.check(10.50, 0.0)  # a second silence is a new report
    assert len(lines) == 3 and "quiet for 170 ms" in lines[2]


def test_nothing_is_reported_before_the_member_first_spoke() -> None:
    lines: list[str] = []
    watch = _watch(_Clock(), lines)  # sent stays 0: still loading
    watch.check(1000.0, 0.0)
    assert lines == []


def test_the_thread_names_what_the_real_main_thread_waits_on() -> None:
    lines: list[str] = []
    spoke = [0.0]  # 0: not spoken yet, never reported
    watch = StallWatch("m", lambda: spoke[0], 0.02, 0.06, write=lines.append)
    watch.start()
    spoke[0] = time.monotonic()  # after start: the silence is all in the sleep below
    try:
        time.sleep(0.3)  # the main thread, blocked: what a stalled member's main thread is
    finally:
        watch.stop()
    assert lines, "no report of a 300 ms silence"
    assert "test_hams_stall.py" in lines[0] and "test_the_thread_names" in lines[0]
    assert "threads " in lines[0]


def test_thread_states_of_this_process() -> None:
    states = thread_states("self")
    assert states and "R" in states  # this thread, reading its own state, runs
