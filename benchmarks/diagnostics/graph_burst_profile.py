"""Where one burst of graph requests spends the machine's CPU (issue 38's soak tail).

    python benchmarks/diagnostics/graph_burst_profile.py [--seconds 20] [--burst 20]

Why: in the soak, one client's burst of 20 well-formed single-row requests to the README's
``stocks`` graph, all at once each second, doubles the graph's load in an instant, and the
well-behaved client's p99 (model route included, which shares only the frontend's event loop
and the cores) is what pays. Before cutting anything: how much CPU does each process of the
server spend per burst, and where does the frontend's go?

Method: a ``parityserve start`` subprocess serves the soak's configuration. The burster
sends ``--burst`` single-row graph requests at once, each second, on its own streams, for
``--seconds``; nothing else runs. Per-process CPU comes from /proc (all threads) over the
bursts; the frontend is sampled by py-spy (``--format raw``, its main thread's Python
stacks, idle samples left out). Prints the CPU per burst by role and the frontend's top
functions by self and by inclusive samples; writes the collapsed stacks to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx  # noqa: E402
import orjson  # noqa: E402

from benchmarks import soak  # noqa: E402
from parityserve.bench.serverproc import ServerProcess, write_config  # noqa: E402


async def _bursts(url: str, seconds: float, burst: int) -> list[float]:
    """Each second, ``burst`` graph requests at once; a round's time is its slowest's (ms)."""
    rounds: list[float] = []
    limits = httpx.Limits(keepalive_expiry=2.0)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

        async def one(j: int) -> None:
            reply = await client.post(f"/{soak.GRAPH}/predict", content=orjson.dumps(
                {"input": [0.1] * soak.WIDTH, soak.STREAM_KEY: f"burst{j}"}))
            reply.raise_for_status()

        for j in range(burst):  # the streams exist, and the connections are open
            await one(j)
        until = time.monotonic() + seconds
        while (started := time.monotonic()) < until:
            await asyncio.gather(*(one(j) for j in range(burst)))
            rounds.append((time.monotonic() - started) * 1e3)
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
    return rounds


def _operators(url: str) -> dict[str, dict[str, Any]]:
    """The graph's operators as ``/admin/state`` shows them."""
    state = httpx.get(f"{url}/admin/state", timeout=10).json()
    operators: dict[str, dict[str, Any]] = state["graphs"][soak.GRAPH]["operators"]
    return operators


def _sent(operators: dict[str, dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """Each operator's (batches, rows) sent so far."""
    return {op: (o["batches_sent"], o["rows_sent"]) for op, o in operators.items()}


def _member_roles(operators: dict[str, dict[str, Any]]) -> dict[int, str]:
    """pid -> "seq1 primary" and so on, for the stateful operators' members. A member's
    command line names its own operator and the ones before it, so it cannot tell them."""
    return {o[f"{role}_pid"]: f"{op} {role}" for op, o in operators.items()
            for role in ("primary", "backup", "spare") if o.get(f"{role}_pid")}


def _role(pid: int, frontend: int, members: dict[int, str]) -> str:
    if pid == frontend:
        return "frontend"
    if pid in members:
        return members[pid]
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return "gone"
    model = next((m for m in ("features", "scorer") if m in cmd), None)
    return f"worker {model}" if model else "other worker"


def _cpu_by_role(frontend: int, members: dict[int, str], run: Callable[[], object]
                 ) -> dict[str, tuple[float, float]]:
    """(CPU ms, wall seconds) per role while ``run`` runs: the frontend, each stateful
    member, and the model workers by the model each serves (its command line)."""
    before, started = soak.proc_ticks(), time.monotonic()
    run()
    after, wall = soak.proc_ticks(), time.monotonic() - started
    out: dict[str, float] = {}
    for pid in {frontend} | soak.descendants(frontend, after):
        if pid in after:
            role = _role(pid, frontend, members)
            ticks = after[pid][1] - before.get(pid, (0, 0))[1]
            out[role] = out.get(role, 0.0) + ticks * 1e3 / os.sysconf("SC_CLK_TCK")
    return {role: (ms, wall) for role, ms in out.items()}


def _top(raw: Path, n: int) -> tuple[list[tuple[str, int]], list[tuple[str, int]], int]:
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        k = int(count)
        frames = [f for f in stack.split(";") if not f.startswith("process ")
                  and not f.startswith("thread ")]
        if not frames:
            continue
        total += k
        own[frames[-1]] += k
        for frame in set(frames):
            inclusive[frame] += k
    return own.most_common(n), inclusive.most_common(n), total


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="example, from the project root:\n"
                                "  python benchmarks/diagnostics/graph_burst_profile.py "
                                "--seconds 20 --out .cache/burst.raw")
    p.add_argument("--seconds", type=float, default=20.0, help="seconds of bursts")
    p.add_argument("--burst", type=int, default=20, help="requests per burst (20)")
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--out", type=Path, default=Path(".cache/graph-burst-profile.raw"))
    args = p.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_config(soak.CONFIG, Path(tmp) / "soak.yaml")
        with ServerProcess(path, log_dir=Path(tmp) / "logs") as server:
            soak._wait_ready(server.url)
            assert server.proc is not None
            frontend = server.proc.pid
            time.sleep(2.0)
            members = _member_roles(_operators(server.url))
            idle = _cpu_by_role(frontend, members, lambda: time.sleep(args.seconds / 2))
            recorder = subprocess.Popen(
                [spy, "record", "--pid", str(frontend), "--format", "raw", "--rate",
                 str(args.rate), "--duration", str(int(args.seconds)), "--output",
                 str(args.out), "--nonblocking"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            rounds: list[float] = []
            before = _sent(_operators(server.url))
            busy = _cpu_by_role(frontend, members, lambda: rounds.extend(
                asyncio.run(_bursts(server.url, args.seconds, args.burst))))
            after = _sent(_operators(server.url))
            recorder.wait(timeout=60)
    n = len(rounds)
    print(f"{n} bursts of {args.burst}; round p50 {sorted(rounds)[n // 2]:.0f} ms")
    print("CPU ms per second idle, and per burst (beyond idle), by role (all threads):")
    for role in sorted(busy, key=lambda r: -busy[r][0]):
        ms, wall = busy[role]
        idle_ms, idle_wall = idle.get(role, (0.0, 1.0))
        per_s = idle_ms / idle_wall
        print(f"  {role:20s} idle {per_s:6.1f} ms/s   burst {(ms - per_s * wall) / n:7.1f} ms")
    print("batches per burst, and rows per batch, by operator:")
    for op, (sent, rows) in after.items():
        b, r = sent - before[op][0], rows - before[op][1]
        print(f"  {op:8s} {b / n:6.1f} batches   {r / max(b, 1):5.2f} rows each")
    own, inclusive, total = _top(args.out, args.top)
    print(f"\nfrontend: {total} samples at {args.rate}/s "
          f"({total / args.rate * 1e3 / n:.1f} ms per burst)")
    print("\nself:")
    for frame, k in own:
        print(f"  {k / total:6.1%}  {frame}")
    print("\ninclusive:")
    for frame, k in inclusive:
        print(f"  {k / total:6.1%}  {frame}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
