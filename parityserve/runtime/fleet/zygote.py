"""A fork server (zygote) for the server's worker processes: model replicas and stateful
graph operators.

Why: every such process was a fresh ``python -m ...``: a stateful graph operator (primary,
backup, warm spare: three per operator) paid ~1.4-2 CPU-seconds of imports (torch above
all) before its model even loaded, a ``zoo:echo`` replica ~0.5, a torch model's replica
~2. ``tests/integration/test_hams_recovery.py`` (8 tests) started 56 operators and used 94
CPU-s, ~79 in operator processes; after a failover a new spare took 5-8 s to be ready on a
2-core machine, a window in which a second loss can leave no member holding the state
(issue 39); a crashed replica was back only after the same imports; and the test suite,
which starts hundreds of replicas, was too slow (issue 40).

How: one zygote per server (the serving system owns it, and gives it to the local launcher
and to the graphs; one is enough, and a second would only pay the imports again) imports
once, single-threaded, what its children need (``preload_for``), and forks a child of a
known kind per request (``zygote_server.py``). The child becomes what the spawned process
would have been: the same command line in ``/proc/PID/cmdline``, the same environment
(thread counts and CURVE keys included) in ``os.environ`` and ``/proc/PID/environ``, its own
session, its stderr in its log file, numpy's and torch's generators reseeded. The frontend
gets a ``ForkedProcess``, which behaves as the ``subprocess.Popen`` it replaces (``pid``,
``poll``, ``returncode``, ``wait``, ``kill``, ``send_signal``): the zygote reaps the child
and reports its exit code; a pidfd, opened by the zygote before the child could be reaped,
makes ``kill`` safe against a reused pid.

No new single point of failure: a child is in its own session, not tied to the zygote, so
killing the zygote kills no replica and no member. Their exits are still seen (a pidfd
works for a process that is not one's child), but their exit codes are then lost with the
zygote (``core.forking.UNKNOWN_EXIT``, ``exit_known`` False). The next start replaces the
zygote (and is spawned plainly meanwhile). Forked children die with the frontend through a
lifeline pipe; a zygote that cannot be used (not Linux, no pidfd, turned off with
``server.fork_server: false``, failed to start, refused a fork) means a plain spawn
(``start_process``, the one place that chooses).
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
from typing import Any, Literal

import orjson

from parityserve.config import ServingConfig
from parityserve.core.forking import UNKNOWN_EXIT, route, unusable_reason
from parityserve.models.extras import deployment_needs
from parityserve.runtime.fleet.processes import (
    ProcessHandle,
    log_file,
    spawn_worker_process,
    worker_env,
)
from parityserve.runtime.fleet.zygote_server import (
    ALL_PRELOAD,
    ENV_ROOM_VAR,
    KINDS,
    MAX_MESSAGE,
    OPERATOR_PRELOAD,
    PRELOAD_VAR,
    WORKER_PRELOAD,
)
from parityserve.runtime.workers.keys import ClientKeys

__all__ = ["OPERATOR", "WORKER", "ForkServer", "ForkedProcess", "Kind", "command_of",
           "fork_server_for", "preload_for", "start_process"]

log = logging.getLogger(__name__)

Kind = Literal["worker", "operator"]
WORKER: Kind = "worker"  # a model replica: ``runtime/workers/worker.py``
OPERATOR: Kind = "operator"  # a stateful graph operator: ``runtime/graphs/hams_worker.py``

ZYGOTE_MODULE = "parityserve.runtime.fleet.zygote_server"
ROOM = 16384  # bytes of command line each child can show (a spec: ~500, more with options)
ENV_ROOM = 8192  # bytes more of environment each child can show than the zygote's (keys: ~200)
FORK_REPLY_S = 10.0  # a fork of the zygote takes milliseconds; this is for a stalled box
EXIT_REPORT_S = 2.0  # the zygote reports an exit at its SIGCHLD: milliseconds; a stopped
# zygote (SIGSTOP) would never: its children's exits are then reported with codes unknown
READY_S = 120.0  # the zygote's imports: 2-5 s here


def command_of(kind: Kind, args: Sequence[str]) -> list[str]:
    """A child's command line when spawned plainly (and what a forked one shows)."""
    return [sys.executable, "-m", KINDS[kind], *args]


def start_process(kind: Kind, args: list[str], *, threads: int, keys: ClientKeys | None,
                  log_dir: Path | None, name: str, forks: ForkServer | None) -> ProcessHandle:
    """Start child ``name`` of ``kind`` with ``args``: forked from ``forks`` when it can,
    else spawned (``python -m ...``), its keys in its environment, its stderr in
    ``log_dir/NAME.log``. The one place that chooses, for replicas and operators alike."""
    if forks is not None:
        forked = forks.fork(kind, args, threads=threads, keys=keys, log_dir=log_dir, name=name)
        if forked is not None:
            return forked
        forks.spawned += 1
    return spawn_worker_process(command_of(kind, args), threads, keys, log_dir, name)


def preload_for(config: ServingConfig, *, local_replicas: bool,
                local_operators: bool = True) -> tuple[str, ...]:
    """What a server's zygote imports: the replica's code when replicas run here, the
    operators' (torch included) when a graph has a stateful operator whose members run here
    (not with the Ray launcher: they are Ray actors), torch when a model's source needs it.
    Nothing (no zygote) when no child of either kind can start here."""
    stateful = local_operators and any(op.stateful for g in config.graphs for op in g.operators)
    torch = local_replicas and any(need.extra == "torch" for d in config.models
                                   for need in deployment_needs(d))
    modules = [*(WORKER_PRELOAD if local_replicas else ()),
               *(OPERATOR_PRELOAD if stateful else ()), *(("torch",) if torch else ())]
    return tuple(dict.fromkeys(modules))


def fork_server_for(enabled: bool, log_dir: Path | None,
                    preload: Sequence[str] = ALL_PRELOAD) -> ForkServer | None:
    """A fork server, or None (with the reason logged) where none can be used."""
    reason = unusable_reason(enabled, sys.platform, hasattr(os, "pidfd_open"))
    if reason is not None:
        log.info("replicas and graph operators are spawned plainly: %s", reason)
        return None
    return ForkServer(log_dir, preload=preload) if preload else None


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
    def launch(cls, command: Sequence[str], preload: Sequence[str],
               log_dir: Path | None) -> _Zygote:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # one thread everywhere: a fork is safe only from a single-threaded process (and
        # each child sets its own counts, zygote_server._apply_threads); blank room for
        # each child's environment to be shown in (zygote_server._show_environment)
        env = {**worker_env(1, None), "OPENBLAS_NUM_THREADS": "1", ENV_ROOM_VAR: " " * ENV_ROOM,
               PRELOAD_VAR: ",".join(preload)}
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

    def fork(self, kind: Kind, argv: list[str], env: dict[str, str], log_fd: int | None,
             lifeline: int) -> ForkedProcess | str:
        """A forked child, or why there is none."""
        with self.lock:
            rid = next(self._ids)
            request = {"t": "fork", "id": rid, "kind": kind, "argv": argv, "env": env,
                       "cwd": os.getcwd()}
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
            return ForkedProcess(self, int(reply["pid"]), pidfds[0], command_of(kind, argv))

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
    """A forked process, with the part of ``subprocess.Popen`` the runtime uses. Nothing
    here blocks but ``wait``: the graphs and the supervisor poll from the event loop."""

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
                log.warning("process %d (%s) exited, and its zygote did not say how; its "
                            "exit code is unknown (reported as %d)", self.pid,
                            " ".join(self.args[2:3]), UNKNOWN_EXIT)
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
    plain spawn, ``start_process``) whenever it cannot fork. ``preload``: what it imports
    (``preload_for``); a child of a kind it did not preload imports the rest itself."""

    def __init__(self, log_dir: Path | None, *, preload: Sequence[str] = ALL_PRELOAD,
                 command: Sequence[str] | None = None) -> None:
        self.log_dir = log_dir
        self.preload = tuple(preload)
        self._command = list(command or (sys.executable, "-m", ZYGOTE_MODULE))
        # The lifeline: forked children read EOF on it when the frontend exits, however.
        # Only this process holds the write end (non-inheritable, never sent anywhere).
        self._lifeline_r, self._lifeline_w = os.pipe()
        self._zygote: _Zygote | None = None
        self._told: set[str] = set()  # reasons for a plain spawn already logged
        self.restarts = 0
        self.forked = self.spawned = 0

    @property
    def zygote_pid(self) -> int | None:
        return self._zygote.proc.pid if self._zygote is not None else None

    def open(self) -> None:
        self._zygote = _Zygote.launch(self._command, self.preload, self.log_dir)

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
        log.warning("the fork server is not ready (%s); replicas and graph operators are "
                    "spawned plainly until it is",
                    "it exited" if zygote and not zygote.alive else "late")
        return False

    def fork(self, kind: Kind, args: list[str], *, threads: int, keys: ClientKeys | None,
             log_dir: Path | None, name: str) -> ForkedProcess | None:
        """Child ``name`` of ``kind``, forked; None when the zygote cannot fork it now (why
        is logged, each reason once at warning level): the caller spawns it plainly
        (``start_process``)."""
        zygote = self._zygote
        if zygote is None:
            return None
        zygote.pump(0.0)
        decision = route(zygote.ready, zygote.alive, self.restarts)
        if decision == "restart":
            self.restarts += 1
            zygote.abandon()
            log.warning("the fork server (pid %d) is gone; starting another (restart %d); "
                        "%s is spawned plainly", zygote.proc.pid, self.restarts, name)
            self.open()
        if decision != "fork":
            return None
        stderr = log_file(log_dir, name)
        try:
            forked = zygote.fork(kind, args, worker_env(threads, keys), stderr,
                                 self._lifeline_r)
        finally:
            if stderr is not None:
                os.close(stderr)  # the child holds its own copy
        if isinstance(forked, str):
            level = logging.DEBUG if forked in self._told else logging.WARNING
            self._told.add(forked)
            log.log(level, "%s %s is spawned plainly: %s", kind, name, forked)
            return None
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
