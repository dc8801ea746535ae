"""Starts local worker processes (model containers) and stops them without leaving orphans.

Forked from the server's zygote when it has one (``zygote.py``: a replica then says hello
in a tenth of a second, not after a fresh interpreter's imports), else spawned."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from pathlib import Path

from parityserve.runtime.fleet.processes import (
    ProcessHandle,
    kill_and_reap,
    log_file,
    spawn_worker_process,
    worker_env,
)
from parityserve.runtime.fleet.zygote import WORKER, ForkServer, start_process
from parityserve.runtime.workers.keys import ClientKeys
from parityserve.runtime.workers.worker import WorkerSpec

__all__ = ["LocalLauncher", "ProcessHandle", "WorkerProcess", "kill_and_reap", "log_file",
           "spawn_worker_process", "worker_env"]

log = logging.getLogger(__name__)


class WorkerProcess:
    """A handle on one local worker subprocess."""

    def __init__(self, spec: WorkerSpec, popen: ProcessHandle) -> None:
        self.spec = spec
        self.popen = popen

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exit_code(self) -> int | None:
        return self.popen.poll()

    def kill(self, reap_s: float = 5.0) -> None:
        """SIGKILL, and reap it if it goes within ``reap_s``. Never raises: the supervisor
        kills from its periodic round, and a process that outlives SIGKILL (stuck in the
        kernel, as a hung GPU driver call can be) must not stop the round and with it the
        replacement of this replica and every later restart."""
        if not kill_and_reap(self.popen, reap_s):
            log.warning("worker %s (pid %d) has not exited %.0f s after SIGKILL; its slot is "
                        "relaunched anyway, and the process is reaped when it goes",
                        self.spec.replica_id, self.pid, reap_s)

    def terminate(self, grace_s: float = 2.0) -> None:
        """SIGTERM, then SIGKILL after the grace period."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.kill()


class LocalLauncher:
    """Starts ``python -m parityserve.runtime.workers.worker`` for each replica: forked from
    ``forks`` (the server's zygote) when it can, else spawned.

    Workers get their own session so a terminal's Ctrl-C reaches only the frontend (which then
    stops them in order), and they end if the frontend dies: a spawned one asks the kernel
    (its parent is the frontend), a forked one reads EOF on its lifeline (its parent is the
    zygote, which may go on its own and must take no replica along).
    """

    def __init__(self, connect: str, *, log_dir: Path | None = None,
                 forks: ForkServer | None = None) -> None:
        self.connect = connect
        self.log_dir = log_dir
        self.forks = forks

    def start(self, spec: WorkerSpec, keys: ClientKeys | None = None) -> WorkerProcess:
        """Start a worker; its CURVE keys (if any) go in its environment, which only its own
        user can read, never on the command line, which ``ps`` shows to everyone."""
        args = ["--connect", self.connect, "--spec", spec.to_json(), "--die-with-parent",
                "--parent-pid", str(os.getpid())]
        popen = start_process(WORKER, args, threads=spec.threads, keys=keys,
                              log_dir=self.log_dir, name=spec.replica_id, forks=self.forks)
        return WorkerProcess(spec, popen)

    @staticmethod
    def stop_all(procs: list[WorkerProcess], grace_s: float = 2.0) -> None:
        deadline = time.monotonic() + grace_s
        for proc in procs:
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.popen.wait(timeout=max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
