"""Starts local worker processes (model containers) and stops them without leaving orphans."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from parityserve.runtime.workers.keys import ENV_VAR, ClientKeys
from parityserve.runtime.workers.worker import WorkerSpec

__all__ = ["LocalLauncher", "ProcessHandle", "WorkerProcess", "kill_and_reap", "log_file",
           "spawn_worker_process", "worker_env"]

log = logging.getLogger(__name__)


class ProcessHandle(Protocol):
    """What the runtime uses of a started process: a ``subprocess.Popen``, or a process
    forked by the zygote (``runtime/graphs/zygote.ForkedProcess``)."""

    pid: int
    # int | None, but typed as typeshed types Popen's (int | Any): callers that read it
    # after poll() said it is set use it as an int
    returncode: Any

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


def spawn_worker_process(cmd: list[str], threads: int, keys: ClientKeys | None,
                         log_dir: Path | None, name: str) -> subprocess.Popen[bytes]:
    """Start one worker-like process (a model replica, a graph operator) in its own session,
    its CURVE keys in its environment, which only its own user can read, never on the
    command line, which ``ps`` shows to everyone; its stderr in ``log_dir/NAME.log``."""
    env = worker_env(threads, keys)
    stderr = log_file(log_dir, name)
    try:
        return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stderr=stderr,
                                start_new_session=True)
    finally:
        if stderr is not None:
            os.close(stderr)  # the child holds its own copy


def worker_env(threads: int, keys: ClientKeys | None) -> dict[str, str]:
    """A worker's environment: this process's, its thread counts, and its keys (only)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    # Idle OpenMP threads sleep instead of spinning (unless the user chose otherwise):
    # spinning threads steal the cores the frontend and the other replicas need, which
    # made two-thread configurations collapse under open load on 2 cores while they
    # looked fastest in a closed loop (profile of ResNet-20, issue 18).
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.pop(ENV_VAR, None)
    if keys is not None:
        env[ENV_VAR] = keys.to_env()
    return env


def log_file(log_dir: Path | None, name: str) -> int | None:
    """An fd for a worker's stderr: ``log_dir/NAME.log``, appended to."""
    if log_dir is None:
        return None  # inherit: worker tracebacks show up in the frontend's terminal
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / f"{name.replace('/', '_')}.log"
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def kill_and_reap(popen: ProcessHandle, reap_s: float) -> bool:
    """SIGKILL ``popen`` if it still runs, and wait up to ``reap_s`` for its exit so that no
    zombie is left. False when it has not gone by then; never raises."""
    if popen.poll() is None:
        popen.kill()
    try:
        popen.wait(timeout=reap_s)
    except subprocess.TimeoutExpired:
        return False
    return True


class WorkerProcess:
    """A handle on one local worker subprocess."""

    def __init__(self, spec: WorkerSpec, popen: subprocess.Popen[bytes]) -> None:
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
    """Spawns ``python -m parityserve.runtime.workers.worker`` for each replica.

    Workers get their own session so a terminal's Ctrl-C reaches only the frontend (which then
    stops them in order), and they ask the kernel to end them if the frontend dies.
    """

    def __init__(self, connect: str, *, log_dir: Path | None = None) -> None:
        self.connect = connect
        self.log_dir = log_dir

    def start(self, spec: WorkerSpec, keys: ClientKeys | None = None) -> WorkerProcess:
        """Start a worker; its CURVE keys (if any) go in its environment, which only its own
        user can read, never on the command line, which ``ps`` shows to everyone."""
        cmd = [sys.executable, "-m", "parityserve.runtime.workers.worker",
               "--connect", self.connect, "--spec", spec.to_json(), "--die-with-parent",
               "--parent-pid", str(os.getpid())]
        popen = spawn_worker_process(cmd, spec.threads, keys, self.log_dir, spec.replica_id)
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
