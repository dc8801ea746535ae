"""A worker's or graph member's niceness when a Ray actor started it (issue 41).

Ray starts its workers at niceness 15 (its ``worker_niceness``), and a process an actor
starts inherits it. Against the frontend, the raylets and the GCS at 0, a niceness-15 process
gets about 1/28 of a contended core (the kernel's weights: 36 against 1024): on the 4-node
rig, healthy graph members went 200+ ms without a core whenever a node crashed, and were
failed over for it (their own stall reports said so: ``graphs/hams_stall``). Local members run
at the frontend's niceness; so must these. The frontend passes its own in ``NICENESS_ENV``
(``fleet/processes.niceness_env``), and the process takes it first thing in ``main``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

__all__ = ["NICENESS_ENV", "take_niceness"]

NICENESS_ENV = "PARITYSERVE_NICENESS"


def take_niceness(environ: Mapping[str, str] | None = None) -> str | None:
    """Run every thread of this process at the niceness ``NICENESS_ENV`` asks for, when set.
    Returns why it could not (also written to stderr), else None. Raising priority needs
    CAP_SYS_NICE (or RLIMIT_NICE): without it the process stays where Ray put it, and says
    so. Linux sets niceness per thread, so each thread started so far (a library's) is set
    too; later ones inherit it."""
    wanted = (os.environ if environ is None else environ).get(NICENESS_ENV)
    if wanted is None:
        return None
    try:
        target = int(wanted)
    except ValueError:
        return _niceness_warning(f"{NICENESS_ENV}={wanted!r} is not an integer")
    now = os.getpriority(os.PRIO_PROCESS, 0)
    if now == target:
        return None
    try:
        for tid in _thread_ids():
            os.setpriority(os.PRIO_PROCESS, tid, target)
    except PermissionError:
        return _niceness_warning(
            f"runs at niceness {now}, not its frontend's {target}: raising priority needs "
            "CAP_SYS_NICE. Start Ray's nodes with RAY_worker_niceness="
            f"{target} in their environment, or this process may starve under load")
    except OSError as exc:
        return _niceness_warning(f"cannot set niceness {target}: {exc}")
    return None


def _thread_ids() -> list[int]:
    try:
        return [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:  # no /proc: this thread only
        return [0]


def _niceness_warning(text: str) -> str:
    print(f"parityserve worker (pid {os.getpid()}): {text}", file=sys.stderr, flush=True)
    return text
