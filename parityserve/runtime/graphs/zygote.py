"""A fork server (zygote) for the stateful graph operators' processes.

Why: every operator process (primary, backup, warm spare: three per stateful operator) was
``python -m parityserve.runtime.graphs.hams_worker``, and each paid ~1.4-2 CPU-seconds of imports
(torch above all) before its model even loaded. ``tests/integration/test_hams_recovery.py``
(8 tests) started 56 of them and used 94 CPU-s, ~79 in operator processes; after a failover
a new spare took 5-8 s to be ready on a 2-core machine, a window in which a second loss can
leave no member holding the state (issue 39), and the suite was too slow (issue 40).

How: one zygote per server (``runtime/graphs/registry.py`` owns it; one is enough, as every graph's
operators start from the same imports, and a second would only pay them again) imports
those once, single-threaded, and forks a member per request (``runtime/graphs/zygote_server.py``).
The frontend gets a ``ForkedProcess``, which behaves as the ``subprocess.Popen`` it
replaces (``pid``, ``poll``, ``returncode``, ``wait``, ``kill``): the zygote reaps the child
and reports its exit code; a pidfd, opened by the zygote before the child could be reaped,
makes ``kill`` safe against a reused pid.

No new single point of failure: a member is in its own session, not tied to the zygote, so
killing the zygote kills no member. Their exits are still seen (a pidfd works for a
process that is not one's child), but their exit codes are then lost with the zygote
(``core.forking.UNKNOWN_EXIT``, ``exit_known`` False). The next start replaces the zygote
(and is spawned plainly meanwhile). Forked members die with the frontend through a lifeline
pipe; a zygote that cannot be used (not Linux, no pidfd, turned off with
``server.fork_server: false``, failed to start, refused a fork) means a plain spawn.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from parityserve.core.forking import UNKNOWN_EXIT, route, unusable_reason
from parityserve.runtime.fleet.launcher import (
    ProcessHandle,
    log_file,
    spawn_worker_process,
    worker_env,
)
from parityserve.runtime.graphs.zygote_server import MAX_MESSAGE, OPERATOR_MODULE
from parityserve.runtime.workers.keys import ClientKeys

__all__ = ["ForkServer", "ForkedProcess", "fork_server_for", "operator_command"]

log = logging.getLogger(__name__)

ZYGOTE_MODULE = "parityserve.runtime.graphs.zygote_server"
ROOM = 4096  # bytes of command line each child can show (its spec is ~500)
FORK_REPLY_S = 10.0  # a fork of the zygote takes milliseconds; this is for a stalled box
EXIT_REPORT_S = 2.0  # the zygote reports an exit at its SIGCHLD: milliseconds; a stopped
# zygote (SIGSTOP) would never: its children's exits are then reported with codes unknown
READY_S = 120.0  # the zygote's imports: 2-5 s here


def operator_command(args: Sequence[str]) -> list[str]:
    """An operator's command line when spawned plainly."""
    return [sys.executable, "-m", OPERATOR_MODULE, *args]


def fork_server_for(enabled: bool, log_dir: Path | None) -> ForkServer | None:
    """A fork server, or None (with the reason logged) where none can be used."""
    reason = unusable_reason(enabled, sys.platform, hasattr(os, "pidfd_open"))
    if reason is not None:
        log.info("graph operators are spawned plainly: %s", reason)
        return None
    return ForkServer(log_dir)


class _Zygote:
    """The frontend's end of one zygote process: its socket, and what it said."""

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self.proc, self.sock = proc, sock
        self.ready = self.dead = False
        self._exits: dict[int, int] = {}
        self._replies: dict[int, tuple[dict[str, Any], list[int]]] = {}
        self._abandoned: set[int] = set()
        self._ids = itertools.count(1)
        self.lock = threading.RLock()

    @classmethod
    def launch(cls, command: Sequence[str], log_dir: Path | None) -> _Zygote:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {**worker_env(1, None), "OPENBLAS_NUM_THREADS": "1"}
        stderr = log_file(log_dir, "zygote")
        try:
            proc = subprocess.Popen(
                [*command, "--fd", str(theirs.fileno()), "--room", " " * ROOM],
                pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL,
                stderr=stderr, start_new_session=True)
        finally:
            theirs.close()
            if stderr is not None:
                os.close(stderr)
        return cls(proc, ours)

    @property
    def alive(self) -> bool:
        return not self.dead and self.proc.poll() is None

    def pump(self, wait_s: float = 0.0) -> None:
        """Take in what the zygote said, waiting up to ``wait_s`` for a first message."""
        with self.lock:
            while not self.dead:
                readable, _, _ = select.select([self.sock], [], [], max(0.0, wait_s))
                if not readable:
                    return
                wait_s = 0.0
                try:
                    data, fds, _, _ = socket.recv_fds(self.sock, MAX_MESSAGE, 4)
                except OSError:
                    data, fds = b"", []
                if not data:  # EOF: the zygote exited (or was killed)
                    self.abandon()
                    return
                self._take(orjson.loads(data), fds)

    def _take(self, message: dict[str, Any], fds: list[int]) -> None:
        kind = message["t"]
        if kind == "ready":
            self.ready = True
        elif kind == "exit":
            self._exits[int(message["pid"])] = int(message["code"])
        elif message["id"] in self._abandoned:  # forked after its caller gave up: no one
            self._abandoned.discard(message["id"])  # owns it, and a plain spawn took its
            for fd in fds:  # place, its keys and its id: it must not run
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                os.close(fd)
        else:
            self._replies[message["id"]] = (message, fds)

    def fork(self, argv: list[str], env: dict[str, str], log_fd: int | None,
             lifeline: int) -> ForkedProcess | str:
        """A forked operator, or why there is none."""
        with self.lock:
            rid = next(self._ids)
            request = {"t": "fork", "id": rid, "argv": argv, "env": env, "cwd": os.getcwd()}
            fds = [lifeline] + ([log_fd] if log_fd is not None else [])
            try:
                socket.send_fds(self.sock, [orjson.dumps(request)], fds)
            except OSError as exc:
                self.dead = True
                return f"the zygote cannot be reached ({exc})"
            deadline = time.monotonic() + FORK_REPLY_S
            while rid not in self._replies and not self.dead:
                if (left := deadline - time.monotonic()) <= 0:
                    self._abandoned.add(rid)
                    return f"the zygote did not answer within {FORK_REPLY_S:.0f} s"
                self.pump(left)
            if rid not in self._replies:
                return "the zygote exited"
            reply, pidfds = self._replies.pop(rid)
            if reply["t"] == "refused":
                return f"the zygote refused: {reply['error']}"
            return ForkedProcess(self, int(reply["pid"]), pidfds[0], operator_command(argv))

    def exit_of(self, pid: int) -> int | None:
        """The exit code the zygote reported for ``pid``, if it has."""
        with self.lock:
            self.pump(0.0)
            return self._exits.pop(pid, None)

    def abandon(self) -> None:
        """Stop talking to it: what it could still say is lost (its children's exit codes)."""
        with self.lock:
            self.dead = True
            self.sock.close()
        self.proc.poll()  # reaped, if it is gone

    def close(self, wait_s: float = 5.0) -> None:
        """Close our end: the zygote sees EOF and exits (its children stay)."""
        self.abandon()
        try:
            self.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ForkedProcess:
    """A forked operator process, with the part of ``subprocess.Popen`` the runtime uses.
    Nothing here blocks but ``wait``: the graph polls its members from its event loop."""

    def __init__(self, zygote: _Zygote, pid: int, pidfd: int, args: list[str]) -> None:
        self.pid, self.args = pid, args
        self.returncode: int | None = None
        self.exit_known = True  # False: it outlived its zygote, which took the code along
        self._zygote, self._pidfd = zygote, pidfd
        self._exited_at: float | None = None  # when its pidfd first said it had exited

    def poll(self) -> int | None:
        with self._zygote.lock:
            if self.returncode is None:
                self._settle()
            return self.returncode

    def _settle(self) -> None:
        """Its exit code, once the zygote reports it (it reaps at its SIGCHLD: within
        milliseconds); given up as unknown when the zygote is gone or says nothing."""
        code = self._zygote.exit_of(self.pid)
        if code is None and self._exited():
            now = time.monotonic()
            self._exited_at = self._exited_at or now
            if not self._zygote.alive or now - self._exited_at > EXIT_REPORT_S:
                log.warning("operator process %d exited, and its zygote did not say how; its "
                            "exit code is unknown (reported as %d)", self.pid, UNKNOWN_EXIT)
                self.exit_known, code = False, UNKNOWN_EXIT
        if code is not None:
            self._finish(code)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            left = 1.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            if self._exited_at is None:  # still running: wake at its exit
                select.select([self._pidfd], [], [], min(left, 1.0))
            else:  # exited: wake at the zygote's report
                self._zygote.pump(min(left, 0.05))
        return code

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # it has exited already
                signal.pidfd_send_signal(self._pidfd, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def _exited(self) -> bool:
        """A pidfd reads readable once its process has exited, reaped yet or not."""
        readable, _, _ = select.select([self._pidfd], [], [], 0)
        return bool(readable)

    def _finish(self, code: int) -> None:
        self.returncode = code
        os.close(self._pidfd)
        self._pidfd = -1


class ForkServer:
    """The server's zygote: started with ``open``, replaced when it dies, and bypassed (a
    plain spawn) whenever it cannot fork."""

    def __init__(self, log_dir: Path | None, *, command: Sequence[str] | None = None) -> None:
        self.log_dir = log_dir
        self._command = list(command or (sys.executable, "-m", ZYGOTE_MODULE))
        # The lifeline: forked members read EOF on it when the frontend exits, however.
        # Only this process holds the write end (non-inheritable, never sent anywhere).
        self._lifeline_r, self._lifeline_w = os.pipe()
        self._zygote: _Zygote | None = None
        self.restarts = 0
        self.forked = self.spawned = 0

    @property
    def zygote_pid(self) -> int | None:
        return self._zygote.proc.pid if self._zygote is not None else None

    def open(self) -> None:
        self._zygote = _Zygote.launch(self._command, self.log_dir)

    async def wait_ready(self, timeout_s: float = READY_S) -> bool:
        """Wait for the zygote's imports, so that the first members are forked. False (and
        plain spawns from then on, until it is ready) when it failed or is late."""
        zygote = self._zygote
        deadline = time.monotonic() + timeout_s
        while zygote is not None and zygote.alive and time.monotonic() < deadline:
            zygote.pump(0.0)
            if zygote.ready:
                return True
            await asyncio.sleep(0.02)
        log.warning("the fork server is not ready (%s); graph operators are spawned plainly "
                    "until it is", "it exited" if zygote and not zygote.alive else "late")
        return False

    def start(self, args: list[str], keys: ClientKeys | None, name: str) -> ProcessHandle:
        """Start operator ``name`` (``hams_worker`` with ``args``): forked when the zygote
        can, else spawned as before."""
        zygote = self._zygote
        if zygote is not None:
            zygote.pump(0.0)
            decision = route(zygote.ready, zygote.alive, self.restarts)
            if decision == "restart":
                self.restarts += 1
                zygote.abandon()
                log.warning("the fork server (pid %d) is gone; starting another (restart "
                            "%d); %s is spawned plainly", zygote.proc.pid, self.restarts, name)
                self.open()
            elif decision == "fork":
                forked = self._fork(zygote, args, keys, name)
                if isinstance(forked, ForkedProcess):
                    return forked
                log.warning("operator %s is spawned plainly: %s", name, forked)
        self.spawned += 1
        return spawn_worker_process(operator_command(args), 1, keys, self.log_dir, name)

    def _fork(self, zygote: _Zygote, args: list[str], keys: ClientKeys | None,
              name: str) -> ForkedProcess | str:
        stderr = log_file(self.log_dir, name)
        try:
            forked = zygote.fork(args, worker_env(1, keys), stderr, self._lifeline_r)
        finally:
            if stderr is not None:
                os.close(stderr)  # the child holds its own copy
        if isinstance(forked, ForkedProcess):
            self.forked += 1
        return forked

    def close(self) -> None:
        """Stop the zygote, and cut the lifeline: a forked member still running (the graphs
        stop theirs first) exits when it reads EOF."""
        if self._zygote is not None:
            self._zygote.close()
        for fd in (self._lifeline_w, self._lifeline_r):
            with contextlib.suppress(OSError):
                os.close(fd)
