"""Is the EMULATED testbed's tail the host's? Hypervisor steal against each answer's latency.

The testbed's baseline with nothing slowed (equal-resources 12 + 6, no shuffles, 150 q/s)
has a p99.9 about 11 ms above what the simulator, driving the same scheduler, predicts. This
runs that case (and ParM k = 2 beside it, interleaved, one server each) while
``benchmarks.steal.StealSampler`` reads the VM's stolen CPU every 5 ms, and then asks
of every answer: was it in flight while the host stole CPU time from this VM? If the slowest
answers met steal far more often than typical ones, the tail is partly the host's.

    python benchmarks/diagnostics/steal_tail.py --data-dir ../shared/data

Writes ``benchmarks/results/steal-tail/steal-tail.{json,md}`` (about 5 min).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import parm_testbed as tb  # noqa: E402
from benchmarks.frontend_cases import default_data_dir  # noqa: E402
from benchmarks.report import markdown_table, write_results  # noqa: E402
from benchmarks.steal import StealSampler, StealSamples  # noqa: E402
from parityserve.bench.loadgen import (  # noqa: E402
    LoadResult,
    encode_bodies,
    poisson_schedule,
    run_event_loop,
    run_open_loop,
    warmed_json_sender,
)
from parityserve.bench.serverproc import ServerProcess, write_config  # noqa: E402
from parityserve.bench.stats import percentiles  # noqa: E402

# Latency bands, by the run's own percentiles: (label, low, high) in percent.
BANDS = (("up to p50", 0.0, 50.0), ("p50-p99", 50.0, 99.0), ("p99-p99.5", 99.0, 99.5),
         ("above p99.5", 99.5, 100.0))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=Path, default=default_data_dir())
    p.add_argument("--rate", type=float, default=150.0)
    p.add_argument("--queries", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--modes", default="equal-resources,parm",
                   help="testbed modes, comma-separated (parm means ParM k = 2)")
    p.add_argument("--results-dir", type=Path, default=Path("benchmarks/results/steal-tail"))
    args = p.parse_args()
    from parityserve.models.datasets import load_mnist, resolve_data_dir

    data_dir = resolve_data_dir(args.data_dir)
    x, _ = load_mnist("test", data_dir=data_dir)
    bodies = encode_bodies(list(x[::10][:1000]))
    cases = tb.testbed_cases(args.modes.split(","), [2], 12, 60.0)
    rows = []
    for rnd in range(args.rounds):
        for case in cases if rnd % 2 == 0 else cases[::-1]:
            config = write_config(tb.testbed_config(case, "parm-gpu-resnet18", rnd),
                                  args.results_dir / ".work" / f"{case.name}.yaml")
            with ServerProcess(config, data_dir=data_dir) as server:
                row = _run(server.url, bodies, args, case.name, rnd)
            print(f"  round {rnd + 1} {case.name:<20} p99.9 {row['p999_ms']:6.1f} ms, "
                  f"stolen {row['steal_share']:.1%}, met steal: above p99.5 "
                  f"{row['met_above p99.5']:.0%}, up to p50 {row['met_up to p50']:.0%}",
                  flush=True)
            rows.append(row)
    _write(args, rows)
    return 0


def _run(url: str, bodies: list[bytes], args: argparse.Namespace, case: str,
         rnd: int) -> dict[str, Any]:
    schedule = poisson_schedule(args.rate, args.queries, np.random.default_rng([rnd, 11]))

    async def go() -> LoadResult:
        async with warmed_json_sender(url, "/bench/predict", bodies, warmup=100) as send:
            return await run_open_loop(send, schedule, rate_qps=args.rate,
                                       max_in_flight=10_000, timeout_s=60)

    with StealSampler() as sampler:
        result = run_event_loop(go())
    samples = sampler.samples()
    if not samples.measured:
        raise SystemExit("no steal counter here (/proc/stat): nothing to diagnose")
    lat = percentiles(result.latencies_s[result.ok])
    return {"round": rnd + 1, "case": case, "n": int(result.ok.sum()),
            "p50_ms": lat["p50_ms"], "p99_ms": lat["p99_ms"], "p999_ms": lat["p999_ms"],
            **samples.summary(), **met_steal_by_band(result, schedule, samples)}


def met_steal_by_band(result: LoadResult, schedule: np.ndarray,
                      samples: StealSamples) -> dict[str, Any]:
    """Per latency band: the share of its answers in flight while steal happened."""
    sends = result.started_at + schedule
    ticks = samples.during(sends, sends + result.latencies_s)
    assert ticks is not None  # measured: checked by the caller
    lat, met = result.latencies_s[result.ok], ticks[result.ok] > 0
    out: dict[str, Any] = {}
    for label, low, high in BANDS:
        lo, hi = np.percentile(lat, [low, high])
        band = (lat >= lo) & (lat <= hi) if high == 100.0 else (lat >= lo) & (lat < hi)
        out[f"met_{label}"] = float(met[band].mean()) if band.any() else None
        out[f"n_{label}"] = int(band.sum())
    return out


def _write(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    for row in rows:  # each band's share with the answers behind it
        for label, _, _ in BANDS:
            row[f"met_{label}_text"] = f"{row[f'met_{label}']:.0%} ({row[f'n_{label}']})"
    columns = [("round", "round", "d"), ("case", "case", "s"), ("n", "answers", "d"),
               ("p50_ms", "p50 ms", ".1f"), ("p99_ms", "p99 ms", ".1f"),
               ("p999_ms", "p99.9 ms", ".1f"), ("steal_share", "CPU stolen", ".1%"),
               ("steal_stalls", "stalls (20+ ms)", "d"),
               *[(f"met_{label}_text", f"met steal: {label} (n)", "s")
                 for label, _, _ in BANDS]]
    body = f"""# Hypervisor steal and the EMULATED testbed's tail

EMULATED testbed (`parm-gpu-resnet18` profile), no shuffles (nothing is slowed),
{args.rate:g} q/s open-loop Poisson, {args.queries} queries per run, {args.rounds} rounds, cases
interleaved, a fresh server per run. `CPU stolen` is the share of the VM's CPU time the host
took during the run (`/proc/stat`, sampled every 5 ms); `stalls` the 5-ms intervals in which
it took 20 ms or more. `met steal` is the share of each latency band's answers that were in
flight while any CPU was stolen (read from the samples around the query, so a little wider
than its life). If steal were unrelated to latency, every band would read about the same;
a long answer meets steal a little more often by chance, but not every time.

{markdown_table(rows, columns)}

"""
    write_results("steal-tail", {"rate": args.rate, "queries": args.queries,
                                 "rounds": args.rounds, "runs": rows},
                  results_dir=args.results_dir, markdown=body)
    print(f"wrote {args.results_dir}/steal-tail.md")


if __name__ == "__main__":
    raise SystemExit(main())
