"""Starting one worker-like process (a model replica, a graph operator) plainly, and what the
runtime uses of a started process: shared by the launchers and the fork server
(``zygote.py``), which starts the same processes by fork."""

from __future__ import annotations

import os
import select
import subprocess
from pathlib import Path
from typing import Any, Protocol

from parityserve.runtime.workers.keys import ENV_VAR, ClientKeys
from parityserve.runtime.workers.niceness import NICENESS_ENV

__all__ = ["ProcessHandle", "kill_and_reap", "log_file", "niceness_env", "spawn_worker_process",
           "wait_child", "worker_env"]


class ProcessHandle(Protocol):
    """What the runtime uses of a started process: a ``subprocess.Popen``, or a process
    forked by the zygote (``zygote.ForkedProcess``)."""

    pid: int
    # int | None, but typed as typeshed types Popen's (int | Any): callers that read it
    # after poll() said it is set use it as an int
    returncode: Any

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...

    def send_signal(self, sig: int) -> None: ...


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


def wait_child(popen: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    """The exit code of child ``popen`` once it exits, or None if it still runs after
    ``timeout_s``. Blocks on a pidfd, so a long wait costs no CPU (a Ray actor's long-poll:
    ``ray_launcher.ActorExit``); where there is none (Linux before 5.3), ``Popen.wait``."""
    code = popen.poll()
    if code is not None or timeout_s <= 0:
        return code
    try:
        fd = os.pidfd_open(popen.pid)
    except (AttributeError, OSError):  # no pidfd here, or the child already reaped
        try:
            return popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None
    try:  # poll, not select: select refuses a descriptor past 1023
        waiter = select.poll()
        waiter.register(fd, select.POLLIN)
        waiter.poll(timeout_s * 1000)  # readable once the child exited
    finally:
        os.close(fd)
    return popen.poll()


def niceness_env() -> dict[str, str]:
    """For a process a Ray actor starts on its node: run at this process's niceness
    (``workers.niceness.take_niceness``)."""
    return {NICENESS_ENV: str(os.getpriority(os.PRIO_PROCESS, 0))}
