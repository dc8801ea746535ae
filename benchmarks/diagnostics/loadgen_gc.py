"""Does the load generator's own garbage collector make the tail it reports? An A/B.

The EMULATED testbed's baseline (``benchmarks.parm_testbed``, equal-resources 12 + 6, no
shuffles, 250 q/s) measured a p99.9 of about 100 ms at a 34 ms median, with nothing slowed.
This runs that case with the generator's collector left on (as before) and paused while the
run is timed (``loadgen.collector_paused``, now the default), interleaved, one server for all
runs, and records every collection the generator made during each run (``gc.callbacks``).

    python benchmarks/diagnostics/loadgen_gc.py --data-dir ../shared/data

Writes ``benchmarks/results/loadgen-gc/loadgen-gc.{json,md}``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import parm_testbed as tb  # noqa: E402
from benchmarks.frontend_cases import default_data_dir  # noqa: E402
from benchmarks.report import markdown_table, write_results  # noqa: E402
from parityserve.bench import loadgen  # noqa: E402
from parityserve.bench.loadgen import (  # noqa: E402
    encode_bodies,
    poisson_schedule,
    run_event_loop,
    run_open_loop,
    warmed_json_sender,
)
from parityserve.bench.serverproc import ServerProcess, write_config  # noqa: E402
from parityserve.bench.stats import percentiles  # noqa: E402

VARIANTS = ("collector-on", "collector-paused")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=Path, default=default_data_dir())
    p.add_argument("--rate", type=float, default=250.0)
    p.add_argument("--queries", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--results-dir", type=Path, default=Path("benchmarks/results/loadgen-gc"))
    args = p.parse_args()
    from parityserve.models.datasets import load_mnist, resolve_data_dir

    data_dir = resolve_data_dir(args.data_dir)
    x, _ = load_mnist("test", data_dir=data_dir)
    bodies = encode_bodies(list(x[::10][:1000]))
    case = tb.testbed_cases(["equal-resources"], [2], 12, 60.0)[0]
    config = write_config(tb.testbed_config(case, "parm-gpu-resnet18", 0),
                          args.results_dir / ".work" / "testbed.yaml")
    rows = []
    with ServerProcess(config, data_dir=data_dir) as server:
        for rnd in range(args.rounds):
            for variant in VARIANTS if rnd % 2 == 0 else VARIANTS[::-1]:
                row = _run(server.url, bodies, args, variant, rnd)
                print(f"  round {rnd + 1} {variant:<17} p50 {row['p50_ms']:6.1f}  p99 "
                      f"{row['p99_ms']:6.1f}  p99.9 {row['p999_ms']:6.1f} ms  gen2 pauses "
                      f"{row['gen2_pauses']} (longest {row['gen2_longest_ms']:.1f} ms), "
                      f"collections {row['collections']}",
                      flush=True)
                rows.append(row)
    summary = [_median_row(variant, [r for r in rows if r["variant"] == variant])
               for variant in VARIANTS]
    _write(args, rows, summary)
    return 0


def _run(url: str, bodies: list[bytes], args: argparse.Namespace, variant: str,
         rnd: int) -> dict[str, Any]:
    pauses: list[tuple[int, float, float]] = []  # (generation, start, seconds)
    started = [0.0]
    window = [float("inf"), 0.0]  # first send, last answer: the timed run

    def watch(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            now = time.perf_counter()
            pauses.append((int(info["generation"]), started[0], now - started[0]))

    def timed(send: loadgen.Send) -> loadgen.Send:
        async def wrapped(i: int) -> Any:
            window[0] = min(window[0], time.perf_counter())
            try:
                return await send(i)
            finally:
                window[1] = max(window[1], time.perf_counter())
        return wrapped

    async def go() -> loadgen.LoadResult:
        async with warmed_json_sender(url, "/bench/predict", bodies, warmup=100) as send:
            schedule = poisson_schedule(args.rate, args.queries,
                                        np.random.default_rng([rnd, 7]))
            gc.callbacks.append(watch)
            try:
                with _variant(variant):
                    return await run_open_loop(timed(send), schedule, rate_qps=args.rate,
                                               max_in_flight=10_000, timeout_s=60)
            finally:
                gc.callbacks.remove(watch)

    result = run_event_loop(go())
    lat = percentiles(result.latencies_s[result.ok])
    lag = percentiles(result.send_lag_s)
    # only what paused the timed run, not the warm-up's collections
    inside = [(g, s) for g, t, s in pauses if window[0] <= t <= window[1]]
    gen2 = [s * 1e3 for g, s in inside if g == 2]
    return {"round": rnd + 1, "variant": variant, "n": int(result.ok.sum()),
            "p50_ms": lat["p50_ms"], "p99_ms": lat["p99_ms"], "p999_ms": lat["p999_ms"],
            "max_ms": float(result.latencies_s.max() * 1e3), "send_lag_p99_ms": lag["p99_ms"],
            "collections": len(inside), "gen2_pauses": len(gen2),
            "gen2_longest_ms": max(gen2, default=0.0),
            "longest_pause_ms": max((s * 1e3 for _, s in inside), default=0.0)}


@contextlib.contextmanager
def _variant(variant: str) -> Iterator[None]:
    """``collector-on`` puts back what the generator did before: no pause."""
    if variant == "collector-paused":
        yield
        return
    saved = loadgen.collector_paused
    loadgen.collector_paused = contextlib.nullcontext  # type: ignore[assignment]
    try:
        yield
    finally:
        loadgen.collector_paused = saved


def _median_row(variant: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("p50_ms", "p99_ms", "p999_ms", "max_ms", "send_lag_p99_ms", "gen2_longest_ms")
    out: dict[str, Any] = {"variant": variant, "rounds": len(rows),
                           "n": sum(r["n"] for r in rows),
                           "gen2_pauses": sum(r["gen2_pauses"] for r in rows)}
    out.update({k: float(np.median([r[k] for r in rows])) for k in keys})
    return out


_COLUMNS = [("variant", "generator", "s"), ("rounds", "rounds", "d"),
            ("p50_ms", "p50 ms", ".1f"), ("p99_ms", "p99 ms", ".1f"),
            ("p999_ms", "p99.9 ms", ".1f"), ("max_ms", "max ms", ".1f"),
            ("send_lag_p99_ms", "send lag p99 ms", ".2f"),
            ("gen2_pauses", "full collections in timed runs (all rounds)", "d"),
            ("gen2_longest_ms", "longest full collection ms", ".1f"), ("n", "answers", "d")]
_ROUND_COLUMNS = [("round", "round", "d"), *_COLUMNS[:1], *_COLUMNS[2:]]


def _write(args: argparse.Namespace, rows: list[dict[str, Any]],
           summary: list[dict[str, Any]]) -> None:
    body = f"""# The load generator's garbage collector and the tail it reports

EMULATED testbed, equal-resources 12 + 6, no shuffles (nothing is slowed), {args.rate:g} q/s
open-loop Poisson, {args.queries} queries per run, {args.rounds} interleaved rounds against one
server. `collector-on` is the generator as it was; `collector-paused` turns Python's cyclic
collector off while a run is timed (`parityserve.bench.loadgen.collector_paused`). Medians
over rounds; p99.9 of one run stands on {args.queries // 1000} answers above it.

{markdown_table(summary, _COLUMNS)}

Every run:

{markdown_table(rows, _ROUND_COLUMNS)}
"""
    write_results("loadgen-gc", {"rate": args.rate, "queries": args.queries,
                                 "rounds": args.rounds, "summary": summary, "runs": rows},
                  results_dir=args.results_dir, markdown=body)
    print(f"wrote {args.results_dir}/loadgen-gc.md")


if __name__ == "__main__":
    raise SystemExit(main())
