"""A silent graph member that is starved of CPU is not a hung one (hams_watch): the verdict,
and ``runnable`` read from /proc of real processes (busy, asleep, stopped, gone)."""

from __future__ import annotations

import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest

from parityserve.runtime.graphs.hams_watch import (
    STARVED_GRACE,
    Watch,
    busy,
    runnable,
    silence_verdict,
    thread_states,
)
from tests.integration.conftest import wait_until


def test_silence_within_the_limit_is_no_verdict_and_asks_nothing() -> None:
    def never() -> bool:
        raise AssertionError("asked /proc within the limit")

    assert silence_verdict(0.2, 0.2, never) is None


def test_a_runnable_member_gets_the_grace_and_no_more() -> None:
    assert silence_verdict(0.21, 0.2, lambda: True) is None  # starved, not hung
    assert silence_verdict(0.2 * STARVED_GRACE, 0.2, lambda: True) is None
    assert silence_verdict(0.2 * STARVED_GRACE + 0.01, 0.2, lambda: True) == "timeout"  # spins
    assert silence_verdict(0.21, 0.2, lambda: False) == "timeout"  # stopped, or blocked


def test_when_no_member_is_heard_every_silence_gets_the_grace() -> None:
    """Nobody heard within the limit: the silence may be the frontend's own (its message
    thread starved), so even a member asleep is given the grace, and no more."""
    def never() -> bool:
        raise AssertionError("asked /proc although nothing is heard")

    assert silence_verdict(0.21, 0.2, never, hearing=False) is None
    assert silence_verdict(0.2 * STARVED_GRACE, 0.2, never, hearing=False) is None
    assert silence_verdict(0.2 * STARVED_GRACE + 0.01, 0.2, never, hearing=False) == "timeout"
    assert silence_verdict(0.21, 0.2, lambda: False, hearing=True) == "timeout"


@pytest.fixture
def process():
    started: list[subprocess.Popen[bytes]] = []

    def start(code: str) -> subprocess.Popen[bytes]:
        started.append(subprocess.Popen([sys.executable, "-c", code]))
        return started[-1]

    yield start
    for p in started:
        p.kill()
        p.wait()


def test_runnable_reads_real_processes(process) -> None:
    busy = process("while True: pass")
    asleep = process("import time; time.sleep(60)")
    wait_until(lambda: runnable(busy.pid), 30)  # running or waiting for a core
    wait_until(lambda: not runnable(asleep.pid), 30)  # once it has started, asleep for good
    busy.send_signal(signal.SIGSTOP)  # a frozen member: state T
    wait_until(lambda: not runnable(busy.pid), 30)
    busy.send_signal(signal.SIGCONT)
    wait_until(lambda: runnable(busy.pid), 30)
    busy.kill()
    busy.wait()
    assert not runnable(busy.pid)  # gone (its pid not reused within this test)


def test_a_thread_waiting_on_the_kernel_is_busy_not_hung() -> None:
    """State D (a disk read, a page fault, a log write under another job's heavy I/O) is a
    member waiting on the kernel, not one blocked for good: it gets the grace, as R does."""
    assert busy("DSS") and busy("RS") and busy("D")
    assert not busy("SSS") and not busy("T") and not busy("tS") and not busy("")


def test_thread_states_names_each_thread(process) -> None:
    asleep = process("import time; time.sleep(60)")
    wait_until(lambda: thread_states(asleep.pid) == "S", 30)  # one thread, asleep
    asleep.send_signal(signal.SIGSTOP)
    wait_until(lambda: thread_states(asleep.pid) == "T", 30)
    asleep.kill()
    asleep.wait()
    assert thread_states(asleep.pid) == ""


def _watch_over(*beats: float, lost: tuple[int, ...] = ()) -> Watch:
    """A Watch over members last heard at ``beats`` (those at the indices ``lost`` lost),
    with a 200 ms timeout; the rest of the graph is never touched by ``_hearing``."""
    said = SimpleNamespace(done=lambda: True)
    by_id = {f"m{i}": ("op", SimpleNamespace(last_beat=b, lost="exit" if i in lost else None,
                                             hello=said)) for i, b in enumerate(beats)}
    ctx = SimpleNamespace(graph=SimpleNamespace(heartbeat_timeout_ms=200))
    return Watch(ctx, SimpleNamespace(by_id=by_id), None, None, None)  # type: ignore[arg-type]


def test_the_frontend_hears_while_any_live_member_spoke_within_the_window() -> None:
    assert _watch_over(9.0, 9.95)._hearing(10.0, 0.1)  # one of two heard 50 ms ago
    assert not _watch_over(9.0, 9.85)._hearing(10.0, 0.1)  # nobody for 150 ms: it may be us
    assert not _watch_over(9.0, 9.7, 9.99, lost=(2,))._hearing(10.0, 0.1)  # the lost vouch not
    assert _watch_over(9.0)._hearing(10.0, 0.1)  # one member: nobody to vouch, the plain limit


def test_the_watch_hears_within_half_the_timeout() -> None:
    """A frontend deaf for just over the timeout had still heard someone within the whole
    timeout: the window is half of it (healthy members speak every 50 ms)."""
    watch = _watch_over(9.0, 9.85)
    assert not watch._hearing(10.0, watch._silence_limit_s() / 2)


def test_a_member_does_not_vouch_for_the_frontend_hearing_itself() -> None:
    watch = _watch_over(9.0, 9.99)
    me = watch.members.by_id["m1"][1]
    assert not watch._hearing(10.0, 0.05, but=me)  # only m1 spoke lately: no one else
    assert watch._hearing(10.0, 0.05, but=watch.members.by_id["m0"][1])
