"""The Berrut modes' group wait on the ParM testbed, in the SIMULATOR (no processes).

The testbed's quick run (``benchmarks/results/parm-testbed-quick.md``) measured Berrut
(K = 12, S = 6 on 18 emulated instances, batch size 1) at a p50 of 838 ms at 100 q/s, where
``none`` served in 32 ms. A group is formed the moment a replica is idle, so it often holds a
query or two, yet it occupies K + S replicas; with ParM's background shuffles slowing some of
them, groups queue behind each other. ``redundancy.group_wait_ms`` lets a partial group wait
for more queries before it is coded. This sweeps that wait in ``core/simulate.py`` (the same
scheduler the runtime drives) on the testbed's setting: the ``parm-gpu-resnet18`` profile's
service time (19.5 ms + 10.5 ms per query, its 5% spread left out), 4 background shuffles
between random pairs of 18 slots at 1.5 Gbps adding 50 ms to each batch of an instance in
one (``benchmarks.parm_testbed.shuffle_events``), open-loop Poisson load.

It runs in about 1.5 CPU minutes and writes JSON, a markdown table and a plot. **Every number is
simulated**; the testbed itself (``benchmarks.parm_testbed --berrut-group-wait-ms``) is
where a wait is to be confirmed.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._cli import build_parser, examples, main

__all__ = ["run", "sweep_point", "window_map"]

ROOT = Path(__file__).resolve().parent.parent
WAITS_MS = (0.0, 20.0, 40.0, 80.0)
RATES = (100.0, 175.0, 250.0)
_EXAMPLES = examples([
    ("python -m benchmarks.berrut_group_wait", "the sweep: 20,000 queries per point"),
    ("python -m benchmarks.berrut_group_wait --queries 3000",
     "a quicker, noisier look"),
])


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--queries", type=int, default=20_000, help="queries per point")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--results-dir", type=Path, default=ROOT / "benchmarks" / "results")
    p.set_defaults(func=run)


def window_map(slots: int, horizon_s: float, rng: np.random.Generator,
               delay_s: float = 0.05) -> dict[int, list[tuple[float, float, float]]]:
    """The testbed's shuffles as the simulator's delay windows, per instance slot."""
    from benchmarks.parm_testbed import shuffle_events

    windows: dict[int, list[tuple[float, float, float]]] = {}
    for start, duration, pair in shuffle_events(slots, 4, horizon_s, 1.5, rng):
        for slot in pair:
            windows.setdefault(slot, []).append((start, start + duration, delay_s))
    return windows


def sweep_point(mode: str, wait_ms: float, rate: float, queries: int,
                seed: int) -> dict[str, Any]:
    """One (mode, wait, rate) point: latency quantiles and tasks sent per query."""
    from parityserve.core.simulate import ServiceProfile, SimConfig, simulate

    arrivals = np.cumsum(np.random.default_rng([seed, int(rate)]).exponential(
        1 / rate, queries))
    windows = window_map(18, float(arrivals[-1]) + 5, np.random.default_rng([seed, 1]))
    shape: dict[str, Any] = {
        "none": {"replicas": 12},
        "equal-resources": {"replicas": 12, "extra": 6},
    }.get(mode, {"replicas": 18, "K": 12, "S": 6, "berrut_group_wait_s": wait_ms / 1000})
    config = SimConfig(mode=mode, max_batch_size=1, slo_s=60.0, delay_windows=windows,
                       **shape)
    result = simulate(config, ServiceProfile.constant(30.0, 10.5, 16), arrivals,
                      np.random.default_rng([seed, 2]))
    lat = np.asarray(result.latency_s) * 1e3
    tasks = result.counters["tasks_coded"] + result.counters["tasks_data"]
    p50, p99, p999 = np.percentile(lat, [50, 99, 99.9], method="higher")
    return {"mode": mode, "wait_ms": wait_ms, "rate": rate, "n": int(lat.size),
            "p50_ms": float(p50), "p99_ms": float(p99), "p999_ms": float(p999),
            "tasks_per_query": tasks / queries}


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    plan = [(m, w) for m in ("none", "equal-resources") for w in (0.0,)]
    plan += [(m, w) for m in ("berrut", "systematic-berrut") for w in WAITS_MS]
    points = [sweep_point(m, w, r, args.queries, args.seed)
              for m, w in tqdm(plan, desc="simulating", disable=not sys.stderr.isatty())
              for r in RATES]
    out = {"name": "berrut-group-wait", "simulated": True, "queries_per_point": args.queries,
           "seed": args.seed, "rates": list(RATES), "waits_ms": list(WAITS_MS),
           "points": points, "command": _command(args)}
    args.results_dir.mkdir(parents=True, exist_ok=True)
    base = args.results_dir / "berrut-group-wait"
    base.with_suffix(".json").write_text(json.dumps(out, indent=2) + "\n")
    base.with_suffix(".md").write_text(markdown(out))
    _plot(out, base.with_suffix(".png"))
    print(base.with_suffix(".md").read_text())
    return 0


def markdown(out: dict[str, Any]) -> str:
    lines = ["# SIMULATED: the Berrut modes' group wait on the ParM testbed's setting", "",
             __doc__.split("\n\n")[1].replace("\n", " "), "",
             f"{out['queries_per_point']:,} queries per point ({out['queries_per_point'] // 1000}"
             " answers above each p99.9), one run each, seed "
             f"{out['seed']}. `none`: 12 instances; `equal-resources`: 18; the Berrut modes: "
             "18 (K = 12, S = 6). Tasks per query: batches sent (data and coded) per query.",
             "", "| mode | group wait ms | q/s | p50 ms | p99 ms | p99.9 ms | tasks/query |",
             "|---|---|---|---|---|---|---|"]
    reading = _reading(out["points"])
    lines += [f"| {p['mode']} | {p['wait_ms']:g} | {p['rate']:g} | {p['p50_ms']:.1f} | "
              f"{p['p99_ms']:.1f} | {p['p999_ms']:.1f} | {p['tasks_per_query']:.2f} |"
              for p in out["points"]]
    lines += ["", *reading, "", "Command:", "", f"    {out['command']}", ""]
    return "\n".join(lines)


def _reading(points: list[dict[str, Any]]) -> list[str]:
    """Per rate: Berrut's p50 without a wait, with the best wait, and none's."""
    out = []
    for rate in dict.fromkeys(p["rate"] for p in points):
        at = [p for p in points if p["rate"] == rate]
        none = next(p for p in at if p["mode"] == "none")
        berrut = [p for p in at if p["mode"] == "berrut"]
        plain = next(p for p in berrut if p["wait_ms"] == 0)
        best = min(berrut, key=lambda p: p["p50_ms"])
        out.append(f"- {rate:g} q/s: Berrut p50 {plain['p50_ms']:.0f} ms without a wait, "
                   f"{best['p50_ms']:.0f} ms with {best['wait_ms']:g} ms "
                   f"({plain['p50_ms'] / best['p50_ms']:.1f}x lower); `none` "
                   f"{none['p50_ms']:.0f} ms.")
    return out


def _plot(out: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, mode in zip(axes, ("berrut", "systematic-berrut"), strict=True):
        for rate in out["rates"]:
            rows = [p for p in out["points"] if p["mode"] == mode and p["rate"] == rate]
            ax.plot([p["wait_ms"] for p in rows], [p["p50_ms"] for p in rows], "o-",
                    label=f"p50, {rate:g} q/s")
            ax.plot([p["wait_ms"] for p in rows], [p["p999_ms"] for p in rows], "o:",
                    label=f"p99.9, {rate:g} q/s")
        ax.set_title(f"SIMULATED {mode}, K = 12, S = 6")
        ax.set_xlabel("group wait (ms)")
        ax.set_yscale("log")
    axes[0].set_ylabel("latency (ms)")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _command(args: argparse.Namespace) -> str:
    parts = ["python", "-m", "benchmarks.berrut_group_wait"]
    if args.queries != 20_000:
        parts += ["--queries", str(args.queries)]
    if args.seed:
        parts += ["--seed", str(args.seed)]
    return " ".join(map(shlex.quote, parts))


if __name__ == "__main__":
    sys.exit(main(build_parser("berrut_group_wait", __doc__.split("\n")[0], _EXAMPLES,
                               _add_arguments)))
