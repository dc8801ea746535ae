"""Killing a worker never raises, even when the process outlives SIGKILL (a process stuck in
the kernel, as a hung GPU driver call leaves one): the supervisor kills from its periodic
round, and a raise there used to leave the replica's slot empty for good."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from parityserve.runtime.fleet.launcher import WorkerProcess
from parityserve.runtime.workers.worker import WorkerSpec

SPEC = WorkerSpec(replica_id="m/v1/0#1-abc", model="m", version=1, source="zoo:noop")


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_kill_ends_and_reaps_a_live_process() -> None:
    process = WorkerProcess(SPEC, _sleeper())
    process.kill()
    assert process.exit_code() == -9


def test_a_process_that_outlives_sigkill_is_logged_not_raised(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    popen = _sleeper()
    process = WorkerProcess(SPEC, popen)

    def stuck(timeout: float | None = None) -> int:
        raise subprocess.TimeoutExpired(popen.args, timeout or 0)

    monkeypatch.setattr(popen, "wait", stuck)  # the kernel has not let it go yet
    with caplog.at_level(logging.WARNING, logger="parityserve.runtime.fleet.launcher"):
        process.kill(reap_s=0.01)
    assert "has not exited" in caplog.text and "relaunched anyway" in caplog.text
    monkeypatch.undo()
    assert popen.wait(timeout=5) == -9  # the SIGKILL was sent; the process does go
