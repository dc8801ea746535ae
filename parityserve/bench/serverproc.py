"""Run ``parityserve start`` as a real subprocess and learn its URL (demo, benches, e2e tests).

The server runs in its own process so that a load generator in this one does not share its
interpreter lock: latency is measured the way a remote client would see it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from parityserve.errors import Unavailable

__all__ = ["ServerProcess", "write_config"]

_URL = re.compile(r"serving on (https?://\S+)")


def write_config(config: dict[str, Any], path: Path) -> Path:
    """Write a deployment mapping as YAML (the same file a user would write)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class ServerProcess:
    """``with ServerProcess(cfg) as srv: srv.url`` — started, ready, and stopped with SIGTERM."""

    def __init__(self, config_path: Path, *, port: int = 0, data_dir: Path | None = None,
                 startup_timeout_s: float = 180.0, log_dir: Path | None = None) -> None:
        self.config_path = config_path
        self.port = port
        self.data_dir = data_dir
        self.startup_timeout_s = startup_timeout_s
        self.log_dir = log_dir
        self.url = ""
        self.output: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self._started = threading.Event()
        self._reader: threading.Thread | None = None

    def start(self) -> ServerProcess:
        cmd = [sys.executable, "-m", "parityserve.cli", "start", "-c", str(self.config_path),
               "--port", str(self.port)]
        if self.data_dir is not None:
            cmd += ["--data-dir", str(self.data_dir)]
        if self.log_dir is not None:
            cmd += ["--log-dir", str(self.log_dir)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self._reader = threading.Thread(target=self._read_output, name="parityserve-output",
                                        daemon=True)
        self._reader.start()
        try:
            self.url = self._await_url()
        except BaseException:
            # Ctrl-C or SIGTERM while the server was still loading: ``with`` calls __exit__
            # only once __enter__ has returned, so stop it here or it outlives us.
            self.stop()
            raise
        return self

    def _read_output(self) -> None:
        """Drain the server's output for its whole life (a full pipe would stall the server)."""
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            match = _URL.search(line)
            if match and not self._started.is_set():
                self.url = match.group(1)
                self._started.set()
        self._started.set()  # end of output: the server is gone

    def _await_url(self) -> str:
        assert self.proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while not self._started.wait(0.5) and time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._started.wait(2.0)  # let the reader catch its last lines
                break
        if self.url:
            return self.url
        self.stop()
        raise Unavailable("server did not start:\n" + "".join(self.output[-40:]))

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM and wait; returns the exit code. Calling it again is harmless."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=5)
            if not self._reader.is_alive() and self.proc.stdout is not None:
                self.proc.stdout.close()
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
