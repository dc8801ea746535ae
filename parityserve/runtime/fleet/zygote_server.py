"""The zygote process: imports what its children need (numpy, zmq, the worker's and the
operators' code, torch when a model needs it) once, then forks one child per request from its
frontend, of a known *kind*: a model replica (``runtime/workers/worker.py``) or a stateful
graph operator (``runtime/graphs/hams_worker.py``) (why: ``runtime/fleet/zygote.py``).

The kinds are named here, not imported: the fleet never imports the graphs (the wings'
order, ``tests/unit/test_import_graph.py``); only this process, which runs no fleet logic,
imports a kind's module, by name, to preload it or to run its ``main``.

It never starts a thread or a zmq context: a fork copies only the calling thread, so a lock
another thread held would stay locked in every child (``core.forking.fork_refusal`` is
checked before each fork). It reaps its children (SIGCHLD wakes the loop; ``waitpid``
with WNOHANG until none is left) and sends each exit code to the frontend. It exits when
the frontend's end of the socket closes; its children do not (replicas keep serving, graph
members keep their state): a forked child dies with the frontend through its *lifeline*
instead (a pipe whose write end only the frontend holds), not with the zygote.

Messages on the SOCK_SEQPACKET socket are JSON, with file descriptors beside them:
``fork`` (its kind, argv, environment and working directory; fds: the lifeline's read end,
then the log file if any) is answered ``forked``
(fd: a pidfd of the child, opened before the child can be reaped, so the pid it names is
never a reused one) or ``refused``; ``exit`` and ``ready`` come unasked.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import importlib
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

__all__ = ["ALL_PRELOAD", "ENV_ROOM_VAR", "KINDS", "OPERATOR_PRELOAD", "PRELOAD_VAR",
           "WORKER_PRELOAD", "main", "watch_lifeline"]

# kind -> the module a spawned child runs (``python -m MODULE ARGV``); its ``main(argv,
# die_with_parent=False)`` is what a forked one runs
KINDS = {
    "worker": "parityserve.runtime.workers.worker",  # a model replica
    "operator": "parityserve.runtime.graphs.hams_worker",  # a stateful graph operator
}
# What each kind imports before its own work begins (about 0.6 CPU-s for a replica, 2 for an
# operator, torch above all); the frontend picks what its zygote preloads (``zygote.py``).
WORKER_PRELOAD = ("numpy", "zmq", KINDS["worker"], "parityserve.models.loader",
                  "parityserve.models.zoo")
OPERATOR_PRELOAD = ("numpy", "torch", "zmq", "parityserve.models.stateful", KINDS["operator"])
ALL_PRELOAD = tuple(dict.fromkeys((*WORKER_PRELOAD, *OPERATOR_PRELOAD)))
ENV_ROOM_VAR = "PARITYSERVE_ZYGOTE_ROOM"  # blank space in the zygote's environment block
PRELOAD_VAR = "PARITYSERVE_ZYGOTE_PRELOAD"  # what to import, comma-separated
MAX_MESSAGE = 1 << 20  # a fork request: the child's argv and its environment


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="parityserve-zygote", description=__doc__)
    parser.add_argument("--fd", type=int, required=True, help="the frontend's socket")
    parser.add_argument("--room", default="", help="blank space: each child's command line "
                        "is written over this process's, so it must be long enough")
    args = parser.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    # in the environment, not on the command line, where a search of /proc for a replica or
    # an operator by its module's name would find this process too
    preload = os.environ.pop(PRELOAD_VAR, ",".join(ALL_PRELOAD))
    _preload([m for m in preload.split(",") if m])
    return Zygote(sock).run()


def _preload(modules: list[str]) -> None:
    """What the children import, done once."""
    for module in modules:
        importlib.import_module(module)
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
    """Become the process ``python -m KINDS[kind] ARGV`` would have been, run it, and leave
    with its exit code (``os._exit``: never back into the zygote's loop)."""
    code = 1
    try:
        code = _become(zygote, request, fds)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - printed as Python would, then the exit code 1
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            _flush_zmq()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _become(zygote: Zygote, request: dict[str, Any], fds: list[int]) -> int:
    os.setsid()  # as start_new_session: a terminal's Ctrl-C reaches only the frontend
    _reset_signals()
    zygote.close_in_child()
    lifeline, *log = fds
    if log:
        os.dup2(log[0], 2)
        os.close(log[0])
    module = KINDS[request["kind"]]
    os.environ.clear()
    os.environ.update(request["env"])  # exactly what a spawned child gets, keys included
    _show_environment(request["env"])
    os.chdir(request["cwd"])
    _reseed()
    _apply_threads(request["env"])
    argv = [str(a) for a in request["argv"]]
    _show_command([sys.executable, "-m", module, *argv])
    watch_lifeline(lifeline, request["kind"])
    entry = importlib.import_module(module)
    sys.argv = [str(entry.__file__), *argv]  # as ``-m`` sets it
    code: int = entry.main(argv, die_with_parent=False)
    return code


def _reset_signals() -> None:
    """The dispositions a fresh interpreter starts with."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _reseed() -> None:
    """Python's ``random`` reseeds itself after a fork; numpy's and torch's global generators
    do not, and every child would draw the zygote's stream. (Those the zygote did not import
    are seeded as in a spawned process when the child imports them.)"""
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(int.from_bytes(os.urandom(4), "little"))
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(int.from_bytes(os.urandom(8), "little"))


def _apply_threads(env: dict[str, str]) -> None:
    """The thread counts the environment asks for. OpenMP and OpenBLAS read theirs once, when
    loaded: in the zygote, with one thread (no pool, so forking stays safe). A spawned
    child with ``OMP_NUM_THREADS=n`` would have n; set them live (a torch model sets its own
    again when it loads)."""
    try:
        threads = int(env.get("OMP_NUM_THREADS", "1"))
    except ValueError:
        return
    if threads <= 1:
        return
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)
    with contextlib.suppress(ImportError):  # optional: numpy's BLAS keeps one thread without
        import threadpoolctl

        threadpoolctl.threadpool_limits(limits=threads, user_api="blas")


FLUSH_S = 3.0  # the most a leaving child waits for zmq to deliver what it sent last


def _flush_zmq() -> None:
    """Deliver what the child's sockets still hold (a replica's BYE, a load failure's report)
    before ``os._exit``, within their linger: a spawned child's slow interpreter teardown gave
    zmq's I/O thread that time, a forked child's ``os._exit`` would not (the frontend then
    saw exit code 3 without the reason). Bounded: a socket closed with an infinite linger
    and a peer gone would block ``term`` for ever."""
    zmq = sys.modules.get("zmq")
    ctx = getattr(zmq.Context, "_instance", None) if zmq is not None else None
    if ctx is not None and not ctx.closed:
        flush = threading.Thread(target=ctx.destroy, kwargs={"linger": 2000}, daemon=True)
        flush.start()
        flush.join(FLUSH_S)


def watch_lifeline(fd: int, kind: str = "operator") -> None:
    """End this process when the frontend is gone: ``fd`` is the read end of a pipe whose
    write end only the frontend holds, so it reads EOF exactly when the frontend exits,
    however it went. (PR_SET_PDEATHSIG would name the zygote, which may go on its own.)"""
    def watch() -> None:
        with contextlib.suppress(OSError):
            while os.read(fd, 64):
                pass
        os.write(2, f"parityserve {kind}: the frontend is gone; exiting\n".encode())
        os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name="parityserve-lifeline", daemon=True).start()


def _show_command(argv: list[str]) -> None:
    """Write ``argv`` over this process's command line (``ps``, ``/proc/PID/cmdline``), as
    if it had been spawned, into the room the zygote's ``--room`` left; cut if longer."""
    _overwrite(45, b"\0".join(a.encode() for a in argv))  # arg_start, arg_end (48, 49)


def _show_environment(env: dict[str, str]) -> None:
    """Write ``env`` over this process's environment block (``/proc/PID/environ``, which
    shows the block the zygote was started with, not ``os.environ``), into the room the
    zygote's ``ENV_ROOM_VAR`` left. Only once ``os.environ`` was replaced: libc's
    ``environ`` then points into the block no more."""
    text = b"".join(f"{key}={value}".encode(errors="surrogateescape") + b"\0"
                    for key, value in env.items())
    _overwrite(47, text.rstrip(b"\0"))  # env_start, env_end (fields 50, 51)


def _overwrite(index: int, text: bytes) -> None:
    """Fill the memory between the addresses in fields ``index`` and ``index + 1`` (counted
    after the command name) of ``/proc/self/stat`` with ``text``, NUL-padded, cut if longer."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[index]), int(fields[index + 1])
        room = end - start
        ctypes.memmove(start, text[:room - 1].ljust(room, b"\0"), room)


if __name__ == "__main__":
    sys.exit(main())
