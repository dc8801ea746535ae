"""The zygote process: imports torch, numpy, zmq and the operator code once, then forks one
stateful graph operator per request from its frontend (why: ``runtime/graphs/zygote.py``).

It never starts a thread or a zmq context: a fork copies only the calling thread, so a lock
another thread held would stay locked in every child (``core.forking.fork_refusal`` is
checked before each fork). It reaps its children (SIGCHLD wakes the loop; ``waitpid``
with WNOHANG until none is left) and sends each exit code to the frontend. It exits when
the frontend's end of the socket closes; its children do not: they are the fault-tolerance
members, and a forked member dies with the frontend through its *lifeline* instead (a pipe
whose write end only the frontend holds), not with the zygote.

Messages on the SOCK_SEQPACKET socket are JSON, with file descriptors beside them:
``fork`` (fds: the lifeline's read end, then the log file if any) is answered ``forked``
(fd: a pidfd of the child, opened before the child can be reaped, so the pid it names is
never a reused one) or ``refused``; ``exit`` and ``ready`` come unasked.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import os
import select
import signal
import socket
import sys
import threading
import traceback
from typing import Any

import orjson

from parityserve.core.forking import fork_refusal

__all__ = ["OPERATOR_MODULE", "main", "watch_lifeline"]

OPERATOR_MODULE = "parityserve.runtime.graphs.hams_worker"
MAX_MESSAGE = 1 << 20  # a fork request: the operator's argv and its environment


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="parityserve-zygote", description=__doc__)
    parser.add_argument("--fd", type=int, required=True, help="the frontend's socket")
    parser.add_argument("--room", default="", help="blank space: each child's command line "
                        "is written over this process's, so it must be long enough")
    args = parser.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    _preload()
    return Zygote(sock).run()


def _preload() -> None:
    """What every operator imports (about 1.5 CPU-seconds here), done once."""
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import zmq  # noqa: F401

    import parityserve.models.stateful  # noqa: F401
    import parityserve.runtime.graphs.hams_worker  # noqa: F401

    # Keep the imported heap out of the collector: a collection in a child would write to
    # every object header and so copy the pages it shares with the zygote.
    gc.freeze()


class Zygote:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup fd is what wakes us
        signal.set_wakeup_fd(self.wake_w)

    def run(self) -> int:
        self.send({"t": "ready", "pid": os.getpid()})
        while True:
            ready, _, _ = select.select([self.sock.fileno(), self.wake_r], [], [])
            if self.wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.wake_r, 4096)
                self.reap()
            if self.sock.fileno() in ready:
                data, fds, _, _ = socket.recv_fds(self.sock, MAX_MESSAGE, 4)
                if not data:
                    return 0  # the frontend closed its end (or died): nothing more to do
                self.fork(orjson.loads(data), fds)

    def send(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        with contextlib.suppress(OSError):  # the frontend is gone; the loop sees EOF next
            socket.send_fds(self.sock, [orjson.dumps(message)], fds or [])

    def reap(self) -> None:
        """Collect every child that ended, so none is left a zombie, and report its code
        (negative: the signal that ended it, as ``subprocess`` says it)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.send({"t": "exit", "pid": pid, "code": os.waitstatus_to_exitcode(status)})

    def fork(self, request: dict[str, Any], fds: list[int]) -> None:
        refusal = fork_refusal(threading.active_count(), _os_threads())
        if refusal is None:
            sys.stdout.flush()
            sys.stderr.flush()  # nothing buffered here is written twice
            try:
                pid = os.fork()
            except OSError as exc:
                refusal = f"fork failed: {exc}"
            else:
                if pid == 0:
                    _child(self, request, fds)  # never returns
                self._forked(request, pid)
        for fd in fds:
            os.close(fd)
        if refusal is not None:
            self.send({"t": "refused", "id": request["id"], "error": refusal})

    def _forked(self, request: dict[str, Any], pid: int) -> None:
        pidfd = os.pidfd_open(pid)  # the child is not reaped before the loop's next turn
        try:
            self.send({"t": "forked", "id": request["id"], "pid": pid}, [pidfd])
        finally:
            os.close(pidfd)

    def close_in_child(self) -> None:
        signal.set_wakeup_fd(-1)
        for fd in (self.wake_r, self.wake_w):
            os.close(fd)
        self.sock.close()


def _os_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


# ---- the child ------------------------------------------------------------------------------

def _child(zygote: Zygote, request: dict[str, Any], fds: list[int]) -> None:
    """Become the operator process ``python -m OPERATOR_MODULE ARGV`` would have been, run
    it, and leave with its exit code (``os._exit``: never back into the zygote's loop)."""
    code = 1
    try:
        code = _become_operator(zygote, request, fds)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - printed as Python would, then the exit code 1
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _become_operator(zygote: Zygote, request: dict[str, Any], fds: list[int]) -> int:
    os.setsid()  # as start_new_session: a terminal's Ctrl-C reaches only the frontend
    _reset_signals()
    zygote.close_in_child()
    lifeline, *log = fds
    if log:
        os.dup2(log[0], 2)
        os.close(log[0])
    os.environ.clear()
    os.environ.update(request["env"])  # exactly what a spawned operator gets, keys included
    os.chdir(request["cwd"])
    _reseed()
    argv = [str(a) for a in request["argv"]]
    _show_command([sys.executable, "-m", OPERATOR_MODULE, *argv])
    watch_lifeline(lifeline)
    from parityserve.runtime.graphs import hams_worker

    return hams_worker.main(argv, die_with_parent=False)


def _reset_signals() -> None:
    """The dispositions a fresh interpreter starts with."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _reseed() -> None:
    """Python's ``random`` reseeds itself after a fork; numpy's and torch's global generators
    do not, and every member would draw the zygote's stream."""
    import numpy as np
    import torch

    np.random.seed(int.from_bytes(os.urandom(4), "little"))
    torch.manual_seed(int.from_bytes(os.urandom(8), "little"))


def watch_lifeline(fd: int) -> None:
    """End this process when the frontend is gone: ``fd`` is the read end of a pipe whose
    write end only the frontend holds, so it reads EOF exactly when the frontend exits,
    however it went. (PR_SET_PDEATHSIG would name the zygote, which may go on its own.)"""
    def watch() -> None:
        with contextlib.suppress(OSError):
            while os.read(fd, 64):
                pass
        os.write(2, b"parityserve operator: the frontend is gone; exiting\n")
        os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name="parityserve-lifeline", daemon=True).start()


def _show_command(argv: list[str]) -> None:
    """Write ``argv`` over this process's command line (``ps``, ``/proc/PID/cmdline``), as
    if it had been spawned, into the room the zygote's ``--room`` left; cut if longer."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
        room = end - start
        text = b"\0".join(a.encode() for a in argv)[:room - 1]
        ctypes.memmove(start, text.ljust(room, b"\0"), room)


if __name__ == "__main__":
    sys.exit(main())
