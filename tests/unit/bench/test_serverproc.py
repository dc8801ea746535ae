"""ServerProcess: an interrupt while the server is still loading stops it, not orphans it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from parityserve.bench import serverproc


def test_an_interrupt_during_startup_stops_the_server(monkeypatch, tmp_path: Path) -> None:
    real_popen = subprocess.Popen

    def a_server_that_never_gets_ready(cmd: list[str], **kwargs: Any) -> Any:
        # Stands in for `parityserve start` still loading its workers: no URL line, ever.
        return real_popen([sys.executable, "-c", "import time; time.sleep(120)"], **kwargs)

    monkeypatch.setattr(serverproc.subprocess, "Popen", a_server_that_never_gets_ready)
    server = serverproc.ServerProcess(tmp_path / "serving.yaml", startup_timeout_s=20)
    # Ctrl-C as a terminal delivers it, whatever this process inherited: a test run started
    # in the background by a non-interactive shell (`make test &`) starts with SIGINT
    # ignored (POSIX), Python then leaves it ignored, and no KeyboardInterrupt would come.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt), server:
            pytest.fail("__enter__ returned although the server never printed its URL")
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, before)
    assert server.proc is not None
    assert server.proc.poll() is not None, "the half-started server outlived the interrupt"
