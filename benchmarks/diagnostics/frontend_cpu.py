"""Where the frontend's CPU goes at no-op saturation: a diagnostic for #2's throughput target.

    .venv/bin/python benchmarks/diagnostics/frontend_cpu.py [--runs 3] [--queries 6000]
        [--py-spy] [--out benchmarks/results/overhead-profile]

It starts the same no-op server and load as ``parityserve bench overhead`` (the bench's own
config, bodies and open-loop sender, 32 requests in flight) and, per run, prints:
  * the throughput;
  * the cores each process used (frontend, its workers, the load generator), read from
    /proc (Linux only), which says which process is the bottleneck.
With ``--py-spy`` (``pip install py-spy``), the last run is also sampled and the frontend's
main-thread samples are split into the serving path, the worker RPC and the rest (HTTP
parsing, Starlette, the event loop). Results are written to ``--out`` as JSON with the
command line.

This is a diagnostic, not a benchmark: it does not measure the bare app, so it states no
ratio. The ratio comes from ``parityserve bench overhead``.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from parityserve.bench import overhead
from parityserve.bench.loadgen import encode_bodies, run_event_loop
from parityserve.bench.serverproc import ServerProcess, write_config

# A main-thread sample belongs to the first of these frames found in its stack.
_BUCKETS = {"serving path (_Frontend.predict)": "_Frontend.predict ",
            "worker RPC (WorkerLink._receive_pass)": "WorkerLink._receive_pass "}
_MAIN_THREAD = "serve (parityserve/runtime/server.py"


def main() -> int:
    args = _parse()
    model = overhead.model_case("noop", None)
    bodies = encode_bodies(list(model["inputs"]))
    config = overhead.serving_config(model, max_batch=64, slo_ms=10_000)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    with tempfile.TemporaryDirectory() as tmp, \
            ServerProcess(write_config(config, Path(tmp) / "noop.yaml")) as server:
        assert server.proc is not None
        pids = {"frontend": server.proc.pid, **_children(server.proc.pid),
                "loadgen": os.getpid()}
        for i in range(args.runs):
            spy = _start_spy(server.proc.pid, args) if args.py_spy and i == args.runs - 1 \
                else None
            runs.append(_one_run(server.url, bodies, pids, args.queries, seed=i))
            print(f"run {i + 1}: {runs[-1]['throughput_qps']:.0f} q/s, cores used "
                  f"{runs[-1]['cores']}", flush=True)
            if spy is not None:
                spy.wait()
    report: dict[str, Any] = {"command": "python " + " ".join(sys.argv), "runs": runs}
    if args.py_spy:
        report["frontend_main_thread"] = split_samples(args.out / "py-spy-raw.txt")
        print("frontend main thread:", report["frontend_main_thread"])
    (args.out / "frontend-cpu.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    print(f"wrote {args.out / 'frontend-cpu.json'}")
    return 0


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--queries", type=int, default=6000, help="queries per run")
    p.add_argument("--py-spy", action="store_true", help="sample the frontend in the last run")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/overhead-profile"))
    args = p.parse_args()
    if args.py_spy and shutil.which("py-spy") is None:
        p.error("--py-spy needs py-spy on PATH (pip install py-spy)")
    return args


def _children(pid: int) -> dict[str, int]:
    """The frontend's worker processes (its direct children)."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return {f"worker{i}": int(p) for i, p in enumerate(out.split())}


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _one_run(url: str, bodies: list[bytes], pids: dict[str, int], n: int,
             seed: int) -> dict[str, Any]:
    before = {name: _cpu_s(pid) for name, pid in pids.items()}
    start = time.perf_counter()
    result = run_event_loop(overhead.open_loop(url, bodies, 1e6, n, 32, seed=seed))
    wall = time.perf_counter() - start
    cores = {name: round((_cpu_s(pid) - before[name]) / wall, 2) for name, pid in pids.items()}
    return {"throughput_qps": overhead.result_row("parityserve", 0.0, result)["throughput_qps"],
            "cores": cores}


def _start_spy(pid: int, args: argparse.Namespace) -> subprocess.Popen[bytes]:
    spy = subprocess.Popen(["py-spy", "record", "-p", str(pid), "-f", "raw", "-r", "200",
                            "-d", "6", "-o", str(args.out / "py-spy-raw.txt")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1)  # py-spy attaches before the load starts
    return spy


def split_samples(raw: Path) -> dict[str, float]:
    """Shares of the frontend's main-thread samples per bucket (py-spy's raw format: one
    ``frame;frame;... count`` line per distinct stack). Other threads are left out: they
    block in recv, and py-spy does not always tell that apart from running."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if _MAIN_THREAD not in stack:
            continue
        bucket = next((b for b, frame in _BUCKETS.items() if frame in stack), "the rest")
        counts[bucket] += int(n)
    total = sum(counts.values()) or 1
    return {b: round(c / total, 3) for b, c in counts.most_common()}


if __name__ == "__main__":
    sys.exit(main())
