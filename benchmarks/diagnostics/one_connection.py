"""Where the time goes at one connection: latency and CPU per request when every query is a
batch of one, for the bare app, the floor and parityserve, under wrk.

    python benchmarks/diagnostics/one_connection.py [--rounds 3] [--seconds 5]   # about 2 min
    python benchmarks/diagnostics/one_connection.py --quick                      # 1 round x 2 s

Issue 17 asks for parityserve's p50 at one connection within 0.35 ms of the bare app's. At one
connection nothing is batched and the core sits idle between requests, so each request pays
every per-batch cost alone (the ZeroMQ send and receive, CURVE, the worker's wake-ups and its
own loop) and every wake-up from idle. This diagnostic measures what that costs in CPU, from
/proc, beside the p50: ``floor`` (the bare app with one CURVE round trip per batch to a
parityserve worker, ``frontend_wrk.py``'s floor) shows what the worker hop alone costs any
design that keeps models in worker processes, and parityserve minus the floor is our own work.

Same setup as ``frontend_wrk.py``: server on core 1 with its workers, wrk on core 0, one
connection, the no-op model's 2,000 distinct bodies; one fresh server per system and round,
systems alternating; medians over rounds. Writes
``benchmarks/results/frontend-profile/one-connection.{json,md}``. Needs ``wrk``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import frontend_wrk as fw  # noqa: E402
from benchmarks.frontend_cases import load_case  # noqa: E402
from benchmarks.report import machine_info  # noqa: E402
from parityserve.bench.ports import free_port  # noqa: E402

OUT = ROOT / "benchmarks/results/frontend-profile"
SYSTEMS = ("bare", "floor", "parityserve")
ROUTES = ("v2-binary", "clipper-json", "v2-json")


def _measure(system: str, route: str, case: Any, spec: dict[str, Any], lua: Path,
             work: Path, seconds: float) -> dict[str, Any]:
    port = free_port()
    proc, _ = fw._start(system, port, case, work)
    try:
        url = f"http://127.0.0.1:{port}{fw._route_path(system, route, case)}"
        fw._wrk(url, spec, lua, 1, min(1.0, seconds))  # warm up
        before = fw._cpu_ticks(proc.pid)
        run, _ = fw.run_wrk(url, spec, lua, 1, seconds)
        after = fw._cpu_ticks(proc.pid)
    finally:
        fw._stop(proc)
    errors = run["socket_errors"] + run["status_errors"]
    if errors:
        raise SystemExit(f"{system} answered {errors} of {run['requests']} requests with an "
                         "error; its numbers would not be comparable")
    return {"requests": run["requests"], "p50_ms": run["p50_us"] / 1000,
            "p99_ms": run["p99_us"] / 1000, "p999_ms": run["p999_us"] / 1000,
            **fw._cpu_split(before, after, run["requests"])}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over rounds; the tail of the round whose p50 is the median."""
    mid = sorted(runs, key=lambda r: r["p50_ms"])[len(runs) // 2]
    return {"p50_ms": statistics.median(r["p50_ms"] for r in runs),
            "p99_ms": mid["p99_ms"], "p999_ms": mid["p999_ms"], "requests": mid["requests"],
            "frontend_us": statistics.median(r["frontend_cpu_us_per_request"] for r in runs),
            "worker_us": statistics.median(r["worker_cpu_us_per_request"] for r in runs),
            "rounds_p50_ms": [round(r["p50_ms"], 3) for r in runs]}


def report(state: dict[str, Any]) -> str:
    lines = ["# One connection: latency and CPU per request (a diagnostic)", "",
             f"Command: `{state['command']}`", "",
             "No-op model, one connection closed loop (every query is a batch of one), server "
             "on core 1 with its workers, wrk on core 0, 2,000 distinct bodies; one fresh "
             "server per system and round, alternating; p50 and CPU are medians over rounds "
             "(each round's p50 listed), p99 / p99.9 and n are the median round's. CPU per "
             "request from /proc: the server process (frontend, with its ZeroMQ threads) and "
             "its worker processes.", "",
             "| route | system | p50 ms | over bare ms | rounds | p99 / p99.9 ms | n | "
             "frontend us/req | worker us/req | CPU over bare us/req |", "|---" * 10 + "|"]
    for route, systems in state["runs"].items():
        rows = {s: summary(r) for s, r in systems.items() if r}
        bare = rows.get("bare")
        for system, row in rows.items():
            total = row["frontend_us"] + row["worker_us"]
            over = (f"{row['p50_ms'] - bare['p50_ms']:+.3f}" if bare else "–")
            cpu_over = (f"{total - bare['frontend_us'] - bare['worker_us']:+,.0f}"
                        if bare else "–")
            lines.append(f"| {route} | {system} | {row['p50_ms']:.3f} | {over} | "
                         f"{row['rounds_p50_ms']} | {row['p99_ms']:.3f} / "
                         f"{row['p999_ms']:.3f} | {row['requests']:,} | "
                         f"{row['frontend_us']:,.0f} | {row['worker_us']:,.0f} | {cpu_over} |")
    m = state["machine"]
    lines += ["", f"Machine: {m['cpu_model']}, {m['cpu_count']} cores, {m['date']}", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="per one-connection run")
    parser.add_argument("--routes", default="v2-binary",
                        help=f"comma list of {', '.join(ROUTES)}")
    parser.add_argument("--quick", action="store_true", help="1 round of 2 s runs")
    args = parser.parse_args()
    routes = [r for r in args.routes.split(",") if r]
    if unknown := set(routes) - set(ROUTES):
        parser.error(f"unknown route(s) {', '.join(sorted(unknown))}; pick from "
                     f"{', '.join(ROUTES)}")
    if args.quick:
        args.rounds, args.seconds = 1, 2.0
    case = load_case("noop", None)
    state: dict[str, Any] = {
        "command": f"python benchmarks/diagnostics/one_connection.py --rounds {args.rounds} "
                   f"--seconds {args.seconds:g} --routes {','.join(routes)}",
        "machine": machine_info(), "runs": {}}
    with fw.wrk_workspace("one-connection-") as (work, lua):
        bodies = fw._write_bodies(work, case)
        for round_ in range(args.rounds):
            order = SYSTEMS if round_ % 2 == 0 else SYSTEMS[::-1]
            for route in routes:
                for system in order:
                    point = _measure(system, route, case, bodies[f"{route}/distinct"], lua,
                                     work, args.seconds)
                    state["runs"].setdefault(route, {}).setdefault(system, []).append(point)
                    print(f"round {round_ + 1}: {route} {system} p50 {point['p50_ms']:.3f} ms",
                          flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "one-connection.json").write_text(json.dumps(state, indent=1, default=str))
    text = report(state)
    (OUT / "one-connection.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
