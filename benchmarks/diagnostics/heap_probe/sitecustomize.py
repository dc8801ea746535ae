"""Reads a ``parityserve start`` process's heap from inside it, every 10 s (issue 38's RSS).

    PYTHONPATH=benchmarks/diagnostics/heap_probe HEAP_PROBE_OUT=/tmp/heap.txt \\
        python -m benchmarks.soak --quick --results-dir <scratch>

Why: the soak reads the frontend's RSS from /proc, and RSS cannot tell live memory from memory
the allocator keeps after it was freed (fragmentation, which a long-running process may
plateau at) or from a leak (which does not stop). This file is imported by every Python
process started with this folder on ``PYTHONPATH`` (``sitecustomize``); in the one whose
command line says ``start`` it starts a daemon thread that appends a line every 10 s to
``HEAP_PROBE_OUT``: RSS, glibc's ``mallinfo2`` (arena bytes obtained from the system, mmapped
bytes, bytes in use, bytes free inside the arenas) and CPython's allocated blocks. In use and
blocks flat while RSS and free grow: the allocator keeps freed memory. In use or blocks
growing: something holds on. ``HEAP_PROBE_TRACE=N`` also runs tracemalloc with N frames and
appends the 12 biggest growths since the fourth reading, every third reading (slow: for
finding a holder, not for timing). Other processes return at once.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from typing import Any


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _probe(path: str, frames: int) -> None:
    time.sleep(3)  # sys.argv is the command's by now
    if "start" not in sys.argv:
        return
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Mallinfo2
    tracemalloc: Any = None
    if frames:
        import tracemalloc
        tracemalloc.start(frames)
    base, reading = None, 0
    with open(path, "a") as out:
        while True:
            m, mb = libc.mallinfo2(), 2 ** 20
            out.write(f"{time.time():.0f} rss={_rss_mb():.1f} arena={m.arena / mb:.1f} "
                      f"mmap={m.hblkhd / mb:.1f} inuse={m.uordblks / mb:.1f} "
                      f"free={m.fordblks / mb:.1f} pyblocks={sys.getallocatedblocks()}\n")
            reading += 1
            if tracemalloc is not None:
                snapshot = tracemalloc.take_snapshot()
                if reading == 4:
                    base = snapshot
                elif base is not None and reading % 3 == 0:
                    for stat in snapshot.compare_to(base, "traceback")[:12]:
                        out.write(f"  {stat.size_diff / 1024:.0f} KB {stat.count_diff} blocks\n")
                        out.writelines(f"    {line}\n" for line in stat.traceback.format())
            out.flush()
            time.sleep(10)


if os.environ.get("HEAP_PROBE_OUT"):
    threading.Thread(target=_probe, name="heap-probe", daemon=True, args=(
        os.environ["HEAP_PROBE_OUT"], int(os.environ.get("HEAP_PROBE_TRACE", "0")))).start()
