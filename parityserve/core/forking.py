"""Decisions of the fork server (``runtime/fleet/zygote.py``): when a fork is safe, and how the
next replica or operator process is started. Pure: the thread counts and the zygote's state
come in."""

from __future__ import annotations

from typing import Literal

__all__ = ["MAX_ZYGOTE_RESTARTS", "UNKNOWN_EXIT", "Route", "fork_refusal", "route",
           "unusable_reason"]

# The exit code a forked process reports when its zygote died before it: the zygote was its
# parent, so no one left can read its status. Negative, so that a graph treats a member that
# went this way before its hello as killed (started again), not as a model that cannot load
# (which stops the start); no signal has this number, so it is never mistaken for one.
UNKNOWN_EXIT = -255

# A zygote that keeps dying (broken install, out of memory) is not started forever: after
# this many restarts every later operator is spawned plainly.
MAX_ZYGOTE_RESTARTS = 3

Route = Literal["fork", "spawn", "restart"]


def fork_refusal(python_threads: int, os_threads: int) -> str | None:
    """Why the zygote must not fork now, or None. A fork copies only the calling thread: a
    lock another thread held (malloc's, the import lock, a zmq context's) stays locked in
    the child forever. The zygote starts no thread, so more than one means an import did."""
    if python_threads != 1 or os_threads != 1:
        return (f"the zygote runs {python_threads} Python and {os_threads} OS threads; a fork "
                "is safe only with one")
    return None


def route(ready: bool, alive: bool, restarts: int) -> Route:
    """How the next operator starts: through a ready zygote; plainly while one is loading;
    a dead one is replaced (and this start is plain) until it has died too often."""
    if alive:
        return "fork" if ready else "spawn"
    return "restart" if restarts < MAX_ZYGOTE_RESTARTS else "spawn"


def unusable_reason(enabled: bool, platform: str, has_pidfd: bool) -> str | None:
    """Why no fork server is used at all, or None."""
    if not enabled:
        return "server.fork_server is false"
    if not platform.startswith("linux"):
        return f"fork servers need Linux, this is {platform}"
    if not has_pidfd:
        return "this Python has no os.pidfd_open (Python 3.9 and Linux 5.3 needed)"
    return None
