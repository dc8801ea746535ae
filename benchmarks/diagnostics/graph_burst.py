"""What one client's bursts of graph requests cost another client's tail (issue 38's soak).

    python benchmarks/diagnostics/graph_burst.py [--reps 2] [--seconds 20]

Why: in ``python -m benchmarks.soak`` the well-behaved client's p99 under attack is 2.78x its
calm p99, and run one attack at a time (``--attack WORDS``) only the wrong-width recipe moves
it: each second, 25 graph requests at once, 20 of them well-formed batch-mates and 5 of the
wrong width. This says whether the bad rows or their well-formed mates cost the tail, and
what spreading the same burst (8 in flight at a time) would give.

Method: a ``parityserve start`` subprocess serves the soak's configuration (the README's
``stocks`` graph). One client sends single-row graph requests open-loop (Poisson, 20/s, 8
streams) and measures its own latency: first alone (the calm baseline, in every run), then
beside a burster that sends, each second, one of the variants below, until ``--seconds``
have passed. Variants run in rotating order, ``--reps`` times, each on a fresh server.
Latency counts from each request's intended send time. Writes
``benchmarks/results/graph-burst/graph-burst.{json,md,png}`` and the command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import orjson  # noqa: E402

from benchmarks import soak  # noqa: E402
from benchmarks.figures import save_figure  # noqa: E402
from parityserve.bench.serverproc import ServerProcess, write_config  # noqa: E402
from parityserve.bench.stats import percentiles  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results" / "graph-burst"
RATE = 20.0  # the well-behaved client's requests per second, as in the soak
CALM_S = 8.0
# variant -> (well-formed rows, wrong-width rows, most in flight at once; 0: all at once)
VARIANTS: dict[str, tuple[int, int, int]] = {
    "none (calm throughout)": (0, 0, 0),
    "20 well-formed at once": (20, 0, 0),
    "20 well-formed + 5 wrong width at once (the soak's recipe)": (20, 5, 0),
    "the recipe, 8 in flight at a time": (20, 5, 8),
}


async def _good(client: httpx.AsyncClient, until: float, seed: int) -> list[float]:
    """Open-loop single-row requests; latency from the intended send time (ms)."""
    rng, sent, latencies = np.random.default_rng(seed), 0, []
    tasks = []
    due = time.monotonic()

    async def one(stream: str, at: float) -> None:
        reply = await client.post(f"/{soak.GRAPH}/predict", content=orjson.dumps(
            {"input": [0.1] * soak.WIDTH, soak.STREAM_KEY: stream}))
        reply.raise_for_status()
        latencies.append((time.monotonic() - at) * 1e3)

    while (due := due + rng.exponential(1 / RATE)) < until:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        tasks.append(asyncio.create_task(one(soak.GOOD_STREAMS[sent % 8], due)))
        sent += 1
    await asyncio.gather(*tasks)
    return latencies


async def _burster(client: httpx.AsyncClient, until: float, good: int, bad: int,
                   limit: int) -> list[float]:
    """Each second, ``good`` + ``bad`` graph requests on the attacker's streams; a round's
    time is its slowest request's (ms)."""
    rounds = []
    gate = asyncio.Semaphore(limit or good + bad or 1)

    async def one(j: int, x: list[float]) -> None:
        async with gate:
            await client.post(f"/{soak.GRAPH}/predict", content=orjson.dumps(
                {"input": x, soak.STREAM_KEY: f"burst{j}"}))

    while (started := time.monotonic()) < until:
        shots = [[0.1] * soak.WIDTH] * good + [[0.1, 0.2]] * bad
        await asyncio.gather(*(one(j, x) for j, x in enumerate(shots)))
        rounds.append((time.monotonic() - started) * 1e3)
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
    return rounds


async def _run(url: str, variant: tuple[int, int, int], seconds: float, seed: int
               ) -> dict[str, Any]:
    good, bad, limit = variant
    # idle keep-alive connections go before the server's 5 s close: no reuse race
    limits = httpx.Limits(keepalive_expiry=2.0)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client, \
            httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as attacker:
        for j in range(good + bad):  # the burster's streams exist before it starts
            await attacker.post(f"/{soak.GRAPH}/predict", content=orjson.dumps(
                {"input": [0.1] * soak.WIDTH, soak.STREAM_KEY: f"burst{j}"}))
        calm = await _good(client, time.monotonic() + CALM_S, seed)
        until = time.monotonic() + seconds
        beside, rounds = await asyncio.gather(
            _good(client, until, seed + 1),
            _burster(attacker, until, good, bad, limit) if good + bad else _nothing())
    return {"calm": calm, "beside": beside, "rounds": rounds}


async def _nothing() -> list[float]:
    return []


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    calm = [x for r in runs for x in r["calm"]]
    beside = [x for r in runs for x in r["beside"]]
    p_calm = percentiles(np.asarray(calm) / 1e3)
    p_beside = percentiles(np.asarray(beside) / 1e3)
    ratios = [percentiles(np.asarray(r["beside"]) / 1e3)["p99_ms"]
              / percentiles(np.asarray(r["calm"]) / 1e3)["p99_ms"] for r in runs]
    rounds = [x for r in runs for x in r["rounds"]]
    return {"calm": p_calm, "beside": p_beside, "n_calm": len(calm), "n_beside": len(beside),
            "p99_ratio_per_rep": ratios, "p99_ratio_median": statistics.median(ratios),
            "round_p50_ms": statistics.median(rounds) if rounds else None}


def _markdown(result: dict[str, Any], command: str) -> str:
    lines = ["# One client's graph bursts against another client's tail", "",
             f"{result['reps']} repetitions per variant, each on a fresh server, variants in "
             f"rotating order; the well-behaved client sends {RATE:g} single-row graph "
             f"requests/s, {CALM_S:g} s alone (calm), then {result['seconds']:g} s beside the "
             "burster. Latency from the intended send time. Load average at the end: "
             f"{result['loadavg']}.", "",
             "| burst each second | calm p50 / p99 ms | beside p50 / p99 / p99.9 ms | samples "
             "(calm / beside) | p99 beside / calm, per rep (median) | burst round p50 ms |",
             "|---|---|---|---|---|---|"]
    for name, s in result["variants"].items():
        per = " / ".join(f"{r:.2f}x" for r in s["p99_ratio_per_rep"])
        round_p50 = "-" if s["round_p50_ms"] is None else f"{s['round_p50_ms']:.0f}"
        lines.append(f"| {name} | {s['calm']['p50_ms']:.1f} / {s['calm']['p99_ms']:.1f} | "
                     f"{s['beside']['p50_ms']:.1f} / {s['beside']['p99_ms']:.1f} / "
                     f"{s['beside']['p999_ms']:.1f} | {s['n_calm']} / {s['n_beside']} | "
                     f"{per} (**{s['p99_ratio_median']:.2f}x**) | {round_p50} |")
    lines += ["", "p99.9 rests on fewer samples than it needs (1,000): read it as the worst few.",
              "", "![p99 ratio per variant](graph-burst.png)", "", "Command:", "",
              f"    {command}", ""]
    return "\n".join(lines)


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["variants"])
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(names) + 1.2))
    ax.barh(names, [result["variants"][n]["p99_ratio_median"] for n in names])
    ax.axvline(2.0, color="k", linestyle=":", label="issue 38's 2x")
    ax.set_xlabel("well-behaved client's p99 beside the bursts / its calm p99 (median of reps)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="examples, from the project root:\n"
                                "  python benchmarks/diagnostics/graph_burst.py\n"
                                "  python benchmarks/diagnostics/graph_burst.py --reps 3 "
                                "--seconds 30")
    p.add_argument("--reps", type=int, default=2, help="repetitions per variant (default 2)")
    p.add_argument("--seconds", type=float, default=20.0,
                   help="seconds beside the burster per run (default 20)")
    args = p.parse_args()
    if args.reps < 1 or args.seconds <= 0:
        p.error("--reps must be >= 1 and --seconds > 0")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    for rep in range(args.reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            with tempfile.TemporaryDirectory() as tmp:
                path = write_config(soak.CONFIG, Path(tmp) / "soak.yaml")
                with ServerProcess(path, log_dir=Path(tmp) / "logs") as server:
                    soak._wait_ready(server.url)
                    runs[name].append(asyncio.run(_run(server.url, VARIANTS[name],
                                                       args.seconds, seed=rep * 10)))
            print(f"rep {rep + 1}/{args.reps}: {name} done", flush=True)
    result = {"reps": args.reps, "seconds": args.seconds,
              "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
              "variants": {n: _summary(r) for n, r in runs.items()}}
    command = "python benchmarks/diagnostics/graph_burst.py " + " ".join(sys.argv[1:])
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "graph-burst.json").write_text(json.dumps(result, indent=2))
    (RESULTS / "graph-burst.md").write_text(_markdown(result, command.strip()))
    (RESULTS / "graph-burst.command.txt").write_text(command.strip() + "\n")
    _plot(result, RESULTS / "graph-burst.png")
    print(_markdown(result, command.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
