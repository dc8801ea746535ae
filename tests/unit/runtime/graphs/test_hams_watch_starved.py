"""A silent graph member that is starved of CPU is not a hung one (hams_watch): the verdict,
and ``runnable`` read from /proc of real processes (busy, asleep, stopped, gone)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from parityserve.runtime.graphs.hams_watch import (
    STARVED_GRACE,
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
