"""How long a model replica takes from its start to its hello: spawned (a fresh
``python -m parityserve.runtime.workers.worker``) or forked from a zygote
(``runtime/fleet/zygote.py``), as the local launcher starts it.

The frontend side is a real ``WorkerLink`` on an asyncio loop and a real ``LocalLauncher``;
one replica at a time is started, timed from the ``start`` call to its hello on the link, its
CPU time read from ``/proc/PID/stat`` at that moment, and then stopped. The zygote's own
start (its imports, paid once per server) is printed apart. Prints the median of each.

    PYTHONPATH=. python benchmarks/diagnostics/replica_start.py [--starts 10]
        [--sources zoo:echo,zoo:lenet5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from parityserve.models.extras import source_extra
from parityserve.runtime.fleet.launcher import LocalLauncher
from parityserve.runtime.fleet.zygote import ForkServer
from parityserve.runtime.fleet.zygote_server import WORKER_PRELOAD
from parityserve.runtime.workers import wire
from parityserve.runtime.workers.rpc import WorkerLink
from parityserve.runtime.workers.worker import WorkerSpec

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14, 15)


async def _one(link: WorkerLink, hellos: dict[str, asyncio.Event], launcher: LocalLauncher,
               source: str, n: int) -> tuple[float, float]:
    rid = f"m/v1/0#{n}-{source.replace(':', '-')}"
    hellos[rid] = asyncio.Event()
    spec = WorkerSpec(replica_id=rid, model="m", version=1, source=source)
    started = time.perf_counter()
    process = launcher.start(spec)
    await asyncio.wait_for(hellos[rid].wait(), 120)
    took = time.perf_counter() - started
    cpu = _cpu_s(process.pid)
    with_bye = asyncio.to_thread(LocalLauncher.stop_all, [process])
    await with_bye
    return took, cpu


async def _run(sources: list[str], starts: int) -> None:
    link = WorkerLink()
    hellos: dict[str, asyncio.Event] = {}

    def on_message(rid: str, header: dict[str, Any], buffers: list[Any]) -> None:
        if header.get("t") == wire.HELLO and rid in hellos:
            hellos[rid].set()

    link.start(on_message)
    logs = Path(tempfile.mkdtemp(prefix="replica-start-"))
    try:
        for source in sources:
            preload = (*WORKER_PRELOAD, *(("torch",) if source_extra(source) else ()))
            forks = ForkServer(logs, preload=preload)
            opened = time.perf_counter()
            forks.open()
            assert await forks.wait_ready(), (logs / "zygote.log").read_text()
            zygote_s = time.perf_counter() - opened
            assert forks.zygote_pid is not None
            zygote_cpu = _cpu_s(forks.zygote_pid)
            try:
                for mode, launcher in (("spawned", LocalLauncher(link.address, log_dir=logs)),
                                       ("forked", LocalLauncher(link.address, log_dir=logs,
                                                                forks=forks))):
                    runs = [await _one(link, hellos, launcher, source, n)
                            for n in range(starts)]
                    walls, cpus = zip(*runs, strict=True)
                    print(f"{source:14s} {mode:8s} start -> hello: median "
                          f"{statistics.median(walls):.3f} s wall, "
                          f"{statistics.median(cpus):.2f} CPU-s  (min {min(walls):.3f}, "
                          f"max {max(walls):.3f}; {starts} starts)", flush=True)
                print(f"{source:14s} zygote   start -> ready: {zygote_s:.3f} s wall, "
                      f"{zygote_cpu:.2f} CPU-s, once per server (preload: "
                      f"{', '.join(preload)})", flush=True)
                assert forks.forked == starts and forks.spawned == 0
            finally:
                forks.close()
    finally:
        await link.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--sources", default="zoo:echo,zoo:lenet5")
    args = parser.parse_args()
    asyncio.run(_run(args.sources.split(","), args.starts))


if __name__ == "__main__":
    main()
