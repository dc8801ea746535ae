"""An interleaved A/B of parityserve source trees under wrk: did a change to the frontend pay?

The setup of ``benchmarks/frontend_wrk.py`` (``zoo:noop`` or the MNIST MLP, one replica,
cache off, 2,000 distinct bodies, the server pinned to core 1 and wrk to core 0, 64
connections), one fresh server per tree, route and round; the trees alternate within each
round and swap order from round to round, so a slow spell of the VM hits both alike. Each
tree runs from its own directory (``PYTHONPATH``), workers included.

    git worktree add /tmp/before HEAD~1
    python benchmarks/diagnostics/frontend_ab.py --tree before=/tmp/before --tree after=. \\
        --routes clipper-json,v2-binary --rounds 3 --seconds 5 --name my-change

Reports, per tree and route: req/s (median over rounds, each round listed), the server
process's and its workers' CPU per request from /proc, the mean batch, and the p50 at one
connection; then each tree's req/s as a ratio to the first tree's. Writes
``benchmarks/results/frontend-ab/NAME.{json,md}``. Needs ``wrk`` (``scripts/wrk.sh ensure``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import frontend_wrk as fw  # noqa: E402
from benchmarks.frontend_cases import default_data_dir, load_case  # noqa: E402
from benchmarks.frontend_wrk_report import _fmt  # noqa: E402
from benchmarks.report import machine_info  # noqa: E402
from parityserve.bench.ports import free_port  # noqa: E402

OUT = ROOT / "benchmarks/results/frontend-ab"
ROUTES = ("clipper-json", "v2-json", "v2-binary", "grpc")


def _tree(value: str) -> tuple[str, Path]:
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--tree takes NAME=PATH, got {value!r}")
    where = Path(path).resolve()
    if not (where / "parityserve" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"{where} holds no parityserve package")
    return name, where


def _start(tree: Path, case: Any, work: Path
           ) -> tuple[subprocess.Popen[bytes], int, int]:
    """``parityserve start`` from ``tree`` on the server core; (process, HTTP port, gRPC
    port)."""
    port, grpc_port = free_port(), free_port()
    config = work / f"{case.name}.yaml"
    config.write_text(json.dumps(case.parityserve_config(port, grpc_port)))
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.Popen(["taskset", "-c", fw.SERVER_CORE, sys.executable, "-m",
                             "parityserve.cli", "start", "-c", str(config)],
                            cwd=tree, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    fw._wait_listening(port, f"http://127.0.0.1:{port}/v2/health/ready", proc)
    return proc, port, grpc_port


def measure(tree: Path, case: Any, route: str, seconds: float, work: Path,
            bodies: dict[str, Any], lua: Path) -> dict[str, Any]:
    """One fresh server from ``tree``: warm-up, 64 connections, then one connection."""
    proc, port, grpc_port = _start(tree, case, work)
    try:
        batches = fw._BatchCounter("parityserve", f"http://127.0.0.1:{port}")
        args = argparse.Namespace(duration=seconds, connections=64)
        if route == "grpc":  # ``parityserve bench load``, as frontend_wrk measures gRPC
            return fw._grpc_point(proc.pid, grpc_port, args, work, (), batches)
        url = f"http://127.0.0.1:{port}{fw._route_path('parityserve', route, case)}"
        return fw._http_point(proc.pid, url, bodies[f"{route}/distinct"], lua, args, batches)
    finally:
        fw._stop(proc)


def report(state: dict[str, Any]) -> str:
    trees = list(state["trees"])
    lines = ["# Frontend A/B under wrk (a diagnostic)", "", f"Command: `{state['command']}`", "",
             "Server on core 1, wrk on core 0, 64 connections; one fresh server per tree, "
             "route and round, the trees alternating; medians over rounds (each round's req/s "
             "listed). CPU per request from /proc: the server process (frontend) and its "
             "workers. p50 at one connection.", "",
             "| route | tree | req/s | rounds | vs " + trees[0] + " | frontend us/req | "
             "worker us/req | mean batch | p50 1-conn ms |", "|---" * 9 + "|"]
    for route in state["routes"]:
        base = None
        for tree in trees:
            runs = state["runs"].get(f"{route}/{tree}", [])
            if not runs:
                continue
            rps = statistics.median(r["rps"] for r in runs)
            base = base or rps
            med = {k: _median(runs, k) for k in ("frontend_cpu_us_per_request",
                                                 "worker_cpu_us_per_request", "mean_batch",
                                                 "p50_1conn_ms")}
            lines.append(f"| {route} | {tree} | {rps:,.0f} | {[round(r['rps']) for r in runs]} "
                         f"| {rps / base:.3f} | "
                         f"{_fmt(med['frontend_cpu_us_per_request'], ',.0f')} | "
                         f"{_fmt(med['worker_cpu_us_per_request'], ',.0f')} | "
                         f"{_fmt(med['mean_batch'], '.1f')} | {_fmt(med['p50_1conn_ms'], '.3f')} |")
    lines += ["", f"Machine: {state['machine']}", ""]
    return "\n".join(lines)


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=_tree, action="append", required=True,
                        help="NAME=PATH of a parityserve checkout (give two or more; the "
                             "first is the baseline of the ratios)")
    parser.add_argument("--model", default="noop", choices=("noop", "mlp"))
    parser.add_argument("--routes", default="clipper-json,v2-binary",
                        help=f"comma list of {', '.join(ROUTES)} (grpc: ModelInfer with raw "
                             "contents, driven by `parityserve bench load`)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="per 64-connection run")
    parser.add_argument("--data-dir", type=Path, default=default_data_dir())
    parser.add_argument("--name", default="ab", help="results file stem")
    args = parser.parse_args()
    if len(args.tree) < 2:
        parser.error("give at least two --tree NAME=PATH")
    routes = args.routes.split(",")
    if set(routes) - set(ROUTES):
        parser.error(f"unknown routes {sorted(set(routes) - set(ROUTES))}; choose from {ROUTES}")
    if "grpc" in routes and args.model != "noop":
        parser.error("the grpc route is measured on the no-op model only (--model noop)")
    trees = dict(args.tree)
    case = load_case(args.model, args.data_dir if args.model == "mlp" else None)
    info = machine_info()
    given = " ".join(f"--tree {n}={_shown(p)}" for n, p in trees.items())
    state: dict[str, Any] = {
        "command": f"python benchmarks/diagnostics/frontend_ab.py {given} --model {args.model} "
                   f"--routes {args.routes} --rounds {args.rounds} --seconds {args.seconds:g} "
                   f"--name {args.name}",
        "machine": f"{info.get('cpu_model')}, {info.get('cpu_count')} cores, {info.get('date')}",
        "trees": {n: _shown(p) for n, p in trees.items()}, "routes": routes, "runs": {}}
    with fw.wrk_workspace("frontend-ab-") as (work, lua):
        bodies = fw._write_bodies(work, case)
        for round_ in range(args.rounds):
            order = list(trees.items()) if round_ % 2 == 0 else list(trees.items())[::-1]
            for route in routes:
                for name, tree in order:
                    print(f"round {round_ + 1}: {route} {name}", file=sys.stderr, flush=True)
                    point = measure(tree, case, route, args.seconds, work, bodies, lua)
                    state["runs"].setdefault(f"{route}/{name}", []).append(point)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{args.name}.json").write_text(json.dumps(state, indent=2))
    (OUT / f"{args.name}.md").write_text(report(state))
    print(report(state))
    return 0


def _shown(path: Path) -> str:
    """A tree as the command shows it: relative to the project root when inside it."""
    try:
        return str(path.relative_to(ROOT)) or "."
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
