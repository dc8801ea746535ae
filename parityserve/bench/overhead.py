"""``parityserve bench overhead``: what the serving path costs over calling the model yourself.

Three systems see the same open-loop Poisson load in one run, rate by rate, interleaved so that
machine noise hits them alike:
  * ``raw``: the model's predict() called in-process, one query at a time (no HTTP at all);
  * ``bare``: a bare Starlette/uvicorn app that calls the same model in-process;
  * ``parityserve``: the full system, frontend plus one worker process (cache off, so repeated
    inputs are computed, not served from memory).
Then each is driven at saturation (a fixed number of requests in flight) for peak throughput,
and adaptive batching is compared with batch size 1 for the MLP at a 20 ms SLO.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from parityserve.bench.extra import require_bench_extra
from parityserve.bench.loadgen import (
    HttpSender,
    LoadResult,
    Send,
    encode_bodies,
    json_sender,
    poisson_schedule,
    run_event_loop,
    run_open_loop,
)
from parityserve.bench.ports import free_port
from parityserve.bench.probe import probe
from parityserve.bench.report import Column, markdown_table, plot_latency_vs_load, write_results
from parityserve.bench.serverproc import ServerProcess, write_config
from parityserve.bench.stats import percentiles
from parityserve.errors import DataError, Unavailable

__all__ = ["add_arguments", "model_case", "open_loop", "result_row", "run", "serving_config"]

_SLO_MS = 20.0  # the batching experiment's latency objective (the 20 ms)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", type=Path, help="datasets/weights ($PARITYSERVE_DATA)")
    p.add_argument("--rates", default="100,400,800", help="offered loads, queries/s")
    p.add_argument("--queries", type=int, default=3000, help="queries per rate and system")
    p.add_argument("--saturation-queries", type=int, default=4000)
    p.add_argument("--repeats", type=int, default=3,
                   help="repetitions per point; medians are reported, with the spread")
    p.add_argument("--in-flight", type=int, default=32,
                   help="requests in flight when measuring peak throughput")
    p.add_argument("--models", default="noop,mlp", help="comma list of noop, mlp")
    p.add_argument("--batch-request", default="8,32",
                   help="queries per V2 request in the batching experiment (comma list)")
    p.add_argument("--results-dir", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--quick", action="store_true", help="small runs to check the harness")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    require_bench_extra("parityserve bench overhead")
    rates = [float(r) for r in args.rates.split(",") if r]
    if args.quick:
        args.queries, args.saturation_queries, args.repeats = 300, 600, 1
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    data_dir = _data_dir(args.data_dir)
    report: dict[str, Any] = {"rates": rates, "queries_per_point": args.queries,
                              "in_flight": args.in_flight, "models": {}}
    workdir = args.results_dir / ".work"
    for name in models:
        model = model_case(name, data_dir)
        print(f"\n== {name}: {model['source']} ==", flush=True)
        report["models"][name] = _bench_model(model, rates, args, workdir)
    if "mlp" in models and data_dir is not None:
        report["batching"] = _bench_batching(model_case("mlp", data_dir), args, workdir)
    _write(report, args.results_dir)
    return 0


# ---- the cases ----------------------------------------------------------------------------
def _data_dir(explicit: Path | None) -> Path | None:
    from parityserve.models.datasets import resolve_data_dir

    try:
        return resolve_data_dir(explicit)
    except DataError as exc:
        print(f"note: {exc}; the MLP cases are skipped", file=sys.stderr)
        return None


def model_case(name: str, data_dir: Path | None) -> dict[str, Any]:
    """A model to measure (``noop`` or ``mlp``): its source, weights and 784-wide inputs."""
    if name == "noop":
        inputs = _mnist(data_dir) if data_dir else np.random.default_rng(0).random(
            (1000, 784), dtype=np.float32)
        return {"name": "noop", "source": "zoo:noop", "weights": None, "inputs": inputs}
    if name == "mlp":
        if data_dir is None:
            raise DataError("the mlp case needs --data-dir or PARITYSERVE_DATA")
        weights = str(data_dir / "weights" / "parm-mnist-base-mlp.npz")
        return {"name": "mlp", "source": "zoo:parm-mlp", "weights": weights,
                "inputs": _mnist(data_dir)}
    raise DataError(f"unknown model case {name!r}; use noop or mlp")


def _mnist(data_dir: Path) -> np.ndarray:
    from parityserve.models.datasets import load_mnist

    x, _ = load_mnist("test", data_dir=data_dir)
    return x[::10][:1000]  # the test set is not sorted by class, but stride anyway


# ---- one model: raw, bare, parityserve ----------------------------------------------------
def _bench_model(model: dict[str, Any], rates: Sequence[float], args: argparse.Namespace,
                 workdir: Path) -> dict[str, Any]:
    raw = _bench_raw(model)
    print(f"raw in-process predict: p50 {raw['p50_ms']:.3f} ms, "
          f"{raw['throughput_qps']:.0f} q/s", flush=True)
    with ExitStack() as stack:
        bare = stack.enter_context(
            _AppProcess("parityserve.bench.baseline_app", model["source"], model["weights"]))
        config = serving_config(model, max_batch=64, slo_ms=10_000)
        server = stack.enter_context(
            ServerProcess(write_config(config, workdir / f"{model['name']}.yaml")))
        targets = {"bare": bare.url, "parityserve": server.url}
        bodies = encode_bodies(list(model["inputs"]))
        points = _sweep(targets, bodies, rates, args)
        # The architecture's floor (bare HTTP + one worker-process hop) joins the low-load
        # probe only: that is where the < 1 ms target is judged.
        floor = stack.enter_context(
            _AppProcess("parityserve.bench.floor_app", model["source"], model["weights"]))
        low_load = _probe_low_load({"bare": bare.url, "floor": floor.url, **targets}, bodies,
                                   min(rates), args)
        peak = _saturate(targets, bodies, args)
    return {"source": model["source"], "raw": raw, "points": points, "probe": low_load,
            "peak": peak}


def _probe_low_load(targets: dict[str, str], bodies: list[bytes], rate: float,
                    args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The lowest rate again with the lean one-connection probe: medians over repetitions."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
    for rep in range(args.repeats):
        for system, url in targets.items():
            result = probe(url, "/bench/predict", bodies, rate_qps=rate, n=args.queries,
                           seed=rep)
            runs[system].append({"system": system, "rate": rate, **result})
    out = {}
    for system, rows in runs.items():
        row = out[system] = _median_row(rows, ("p50_ms", "p99_ms", "p999_ms"))
        print(f"  probe {rate:4.0f} q/s  {system:<12} p50 {row['p50_ms']:7.3f}  "
              f"p99 {row['p99_ms']:7.3f} ms  errors {row['errors']}", flush=True)
    return out


def _bench_raw(model: dict[str, Any], n: int = 3000) -> dict[str, Any]:
    from parityserve.models.loader import load_model

    loaded = load_model(model["source"], weights=model["weights"])
    xs = model["inputs"]
    for i in range(200):
        loaded.predict(xs[i % len(xs)][None])
    lat = np.empty(n)
    for i in range(n):
        t0 = time.perf_counter()
        loaded.predict(xs[i % len(xs)][None])
        lat[i] = time.perf_counter() - t0
    return {**percentiles(lat), "throughput_qps": n / lat.sum(), "n": n}


def _sweep(targets: dict[str, str], bodies: list[bytes], rates: Sequence[float],
           args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each rate: every system once per repetition, interleaved, then medians per system."""
    points = []
    for rate in rates:
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
        for rep in range(args.repeats):
            for system, url in targets.items():
                result = run_event_loop(
                    open_loop(url, bodies, rate, args.queries, 10_000, seed=rep))
                runs[system].append(result_row(system, rate, result))
        for rows in runs.values():
            points.append(_median_row(rows))
            _print_row(points[-1])
    return points


def _saturate(targets: dict[str, str], bodies: list[bytes],
              args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
    for rep in range(args.repeats):
        for system, url in targets.items():
            result = run_event_loop(open_loop(url, bodies, 1e6, args.saturation_queries,
                                               args.in_flight, seed=rep))
            runs[system].append(result_row(system, float("inf"), result))
    peak = {system: _median_row(rows) for system, rows in runs.items()}
    for system, row in peak.items():
        print(f"  peak {system:<12} {row['throughput_qps']:8.0f} q/s "
              f"(runs: {', '.join(f'{t:.0f}' for t in row['throughput_runs'])})", flush=True)
    return peak


_MEDIANS = ("throughput_qps", "goodput_qps", "p50_ms", "p99_ms", "p999_ms", "mean_ms")


def _median_row(rows: list[dict[str, Any]],
                keys: Sequence[str] = _MEDIANS) -> dict[str, Any]:
    """One row per point: medians over repetitions, each run's figures kept beside them."""
    out = dict(rows[0])
    for key in keys:
        values = [r[key] for r in rows]
        out[key] = float(np.median(values))
        out[f"{key.removesuffix('_qps').removesuffix('_ms')}_runs"] = values
    out["errors"] = sum(sum(r["errors"].values()) for r in rows)
    out["repeats"] = len(rows)
    return out


async def open_loop(url: str, bodies: list[bytes], rate: float, n: int,
                    in_flight: int, *, seed: int = 0, path: str = "/bench/predict"
                    ) -> LoadResult:
    """``n`` Poisson arrivals at ``rate`` to one route, at most ``in_flight`` outstanding,
    after 200 warm-up requests."""
    async with HttpSender(url, limit=max(64, in_flight)) as http:
        send = json_sender(http, path, bodies)
        await _warm_up(send)
        rng = np.random.default_rng([seed, int(min(rate, 2**31))])
        schedule = poisson_schedule(rate, n, rng)
        return await run_open_loop(send, schedule, max_in_flight=in_flight, timeout_s=60)


async def _warm_up(send: Send, n: int = 200) -> None:
    await asyncio.gather(*(send(i) for i in range(n)))


def result_row(system: str, rate: float, result: LoadResult) -> dict[str, Any]:
    """One table row: the run's summary plus goodput (answers that are not defaults)."""
    s = result.summary()
    good = sum(_real_answers(r) for r in result.results)
    return {"system": system, "rate": rate, **s,
            "goodput_qps": good / result.duration_s if result.duration_s else 0.0}


def _real_answers(reply: Any) -> int:
    """Answers that are predictions, not defaults (a list reply counts each item)."""
    if isinstance(reply, int):  # a V2 batch: the number of rows answered
        return reply
    if isinstance(reply, list):
        return sum(1 for r in reply if not r.get("default"))
    return int(isinstance(reply, dict) and not reply.get("default"))


def _print_row(row: dict[str, Any]) -> None:
    print(f"  {row['rate']:6.0f} q/s  {row['system']:<12} p50 {row['p50_ms']:7.3f}  "
          f"p99 {row['p99_ms']:7.3f}  p99.9 {row['p999_ms']:7.3f} ms  "
          f"{row['throughput_qps']:7.0f} q/s  errors {row['errors']}", flush=True)


def serving_config(model: dict[str, Any], *, max_batch: int, slo_ms: float) -> dict[str, Any]:
    """parityserve serving ``model`` as app ``bench``: one replica, cache off."""
    deployment: dict[str, Any] = {
        "name": "bench", "source": model["source"], "replicas": 1,
        "batching": {"max_batch_size": max_batch}}
    if model["weights"]:
        deployment["weights"] = model["weights"]
    return {"server": {"http_port": 0, "cache_bytes": 0},
            "models": [deployment],
            "applications": [{"name": "bench", "models": ["bench"], "slo_ms": slo_ms,
                              "default_output": -1}]}


# ---- batching: adaptive vs batch size 1 ---------------------------------------------------
def _bench_batching(model: dict[str, Any], args: argparse.Namespace,
                    workdir: Path) -> dict[str, Any]:
    """Peak goodput (queries answered within the SLO) with AIMD vs a fixed batch of 1.

    Clients send V2 binary tensors of several queries per request, as a busy upstream using
    tritonclient would, so HTTP and JSON costs are shared and the model container is what
    batching can speed up. The deployment's V2 deadline is the SLO: a request not answered
    within it gets a 504 and counts for nothing. Each configuration is measured at several
    numbers of requests in flight and reported at its best.
    """
    sizes = [int(v) for v in str(args.batch_request).split(",") if v]
    out: dict[str, Any] = {"slo_ms": _SLO_MS, "by_request_size": {}}
    for size in sizes:
        print(f"\n== batching: MLP, {_SLO_MS:g} ms SLO, {size} queries per V2 request ==",
              flush=True)
        out["by_request_size"][str(size)] = _batching_at(model, size, args, workdir)
    return out


def _batching_at(model: dict[str, Any], size: int, args: argparse.Namespace,
                 workdir: Path) -> dict[str, Any]:
    from parityserve.runtime.frontend.v2 import encode_infer_request

    xs = model["inputs"]
    bodies = [encode_infer_request([("input", xs[i:i + size])], binary=True, binary_output=True)
              for i in range(0, len(xs) - size + 1, size)]
    n = max(50, args.saturation_queries // size)
    out: dict[str, Any] = {}
    for label, max_batch in (("batch size 1", 1), ("adaptive (AIMD, max 64)", 64)):
        config = serving_config(model, max_batch=max_batch, slo_ms=_SLO_MS)
        config["models"][0]["timeout_ms"] = _SLO_MS
        path = write_config(config, workdir / f"batching-{max_batch}.yaml")
        with ServerProcess(path) as server:
            tried = [_goodput_at(server.url, bodies, size, n, k, args.repeats)
                     for k in _IN_FLIGHT]
        best = max(tried, key=lambda r: r["goodput_qps"])
        out[label] = {**best, "tried": [{k: r[k] for k in ("in_flight", "goodput_qps")}
                                        for r in tried]}
        print(f"  {label:<26} goodput {best['goodput_qps']:8.0f} q/s within the SLO "
              f"(best at {best['in_flight']} requests in flight)", flush=True)
    base = out["batch size 1"]["goodput_qps"]
    out["speedup"] = out["adaptive (AIMD, max 64)"]["goodput_qps"] / base if base else None
    return out


_IN_FLIGHT = (1, 2, 4, 8, 16)


def _goodput_at(url: str, bodies: list[tuple[bytes, dict[str, str]]], size: int, n: int,
                in_flight: int, repeats: int) -> dict[str, Any]:
    """Median goodput with ``in_flight`` batch requests outstanding (a closed-loop knob)."""
    async def once(seed: int) -> LoadResult:
        async with HttpSender(url, limit=max(64, in_flight)) as http:
            async def send(i: int) -> int:
                body, headers = bodies[i % len(bodies)]
                status, _ = await http.post("/v2/models/bench/infer", body, headers)
                return size if status == 200 else 0  # a 504 means past the SLO: no answers

            await _warm_up(send, 20)
            schedule = poisson_schedule(1e6, n, np.random.default_rng(seed))
            return await run_open_loop(send, schedule, max_in_flight=in_flight, timeout_s=60)

    rows = [result_row("batching", float("inf"), run_event_loop(once(rep)))
            for rep in range(repeats)]
    return {**_median_row(rows), "in_flight": in_flight}


# ---- the bare baseline app ----------------------------------------------------------------
class _AppProcess:
    """A baseline app (``baseline_app`` or ``floor_app``) in its own process, on a free port."""

    def __init__(self, module: str, source: str, weights: str | None) -> None:
        self.port = free_port()
        cmd = [sys.executable, "-m", module, "--source", source, "--port", str(self.port),
               "--die-with-parent"]
        if weights:
            cmd += ["--weights", weights]
        self.cmd = cmd
        self.proc: subprocess.Popen[str] | None = None
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> _AppProcess:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        try:
            ready = self.proc.stdout.readline().strip() == "ready"
        except BaseException:  # interrupted while it starts: __exit__ would not run
            self.__exit__()
            raise
        if not ready:
            self.__exit__()
            raise Unavailable(f"baseline app failed to start: {' '.join(self.cmd)}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


# ---- output ---------------------------------------------------------------------------------
def _count(errors: Any) -> str:
    return str(sum(errors.values()) if isinstance(errors, dict) else errors)


_COLUMNS: list[Column] = [("system", "system", "s"), ("rate", "offered q/s", ".0f"),
            ("throughput_qps", "throughput q/s", ".0f"), ("p50_ms", "p50 ms", ".3f"),
            ("p99_ms", "p99 ms", ".3f"), ("p999_ms", "p99.9 ms", ".3f"),
            ("errors", "errors", _count)]


def _write(report: dict[str, Any], results_dir: Path) -> None:
    sections = [_model_section(name, m) for name, m in report["models"].items()]
    if "batching" in report:
        sections.append(_batching_section(report["batching"]))
    report["verdicts"] = _verdicts(report)
    sections.append("## Targets\n\n" + "\n".join(f"- {v}" for v in report["verdicts"]))
    paths = write_results("overhead", report, results_dir=results_dir,
                          markdown="\n\n".join(sections))
    plot = plot_latency_vs_load(_series(report), results_dir / "overhead-latency.png",
                                "parityserve vs bare Starlette app: latency vs offered load")
    print(f"\nwrote {paths['json']}, {paths['md']} and {plot}")
    print("\n".join(report["verdicts"]))


def _model_section(name: str, m: dict[str, Any]) -> str:
    raw = m["raw"]
    rows = [*m["points"], *m["peak"].values()]
    text = (f"## {name} ({m['source']})\n\nRaw in-process predict, one query: p50 "
            f"{raw['p50_ms']:.3f} ms, p99 {raw['p99_ms']:.3f} ms, {raw['throughput_qps']:.0f} "
            f"q/s.\n\n" + markdown_table(rows, _COLUMNS) +
            "\n\n(offered q/s `inf`: saturation with a fixed number of requests in flight)")
    if m.get("probe"):
        text += ("\n\nLow-load probe (the same Poisson rate on one keep-alive connection with "
                 "the standard library's `http.client`, whose own cost per request is a "
                 "fraction of the aiohttp generator's; latency from each intended send time):"
                 "\n\n" + markdown_table(list(m["probe"].values()), _PROBE_COLUMNS))
    return text


_PROBE_COLUMNS: list[Column] = [("system", "system", "s"), ("rate", "offered q/s", ".0f"),
                  ("p50_ms", "p50 ms", ".3f"), ("p99_ms", "p99 ms", ".3f"),
                  ("p999_ms", "p99.9 ms", ".3f"), ("errors", "errors", "d")]


def _batching_section(b: dict[str, Any]) -> str:
    cols = [("label", "batching", "s"), ("goodput_qps", "answers within SLO, q/s", ".0f"),
            ("in_flight", "best requests in flight", "d"),
            ("p50_ms", "request p50 ms", ".2f"), ("p99_ms", "request p99 ms", ".2f")]
    parts = [f"## Adaptive batching, MLP, {b['slo_ms']:g} ms SLO (V2 binary requests)"]
    for size, r in b["by_request_size"].items():
        rows = [{"label": k, **v} for k, v in r.items() if isinstance(v, dict)]
        speedup = "n/a (batch size 1 met the SLO for no request)" if r["speedup"] is None \
            else f"{r['speedup']:.2f}x"
        parts.append(f"### {size} queries per request\n\n" + markdown_table(rows, cols) +
                     f"\n\nSpeed-up: {speedup}")
    return "\n\n".join(parts)


def _verdicts(report: dict[str, Any]) -> list[str]:
    out = []
    for name, m in report["models"].items():
        out.append(_p50_verdict(name, m))
        share = m["peak"]["parityserve"]["throughput_qps"] / m["peak"]["bare"]["throughput_qps"]
        if name == "noop":
            ok = "met" if share >= 0.6 else "missed"
            out.append(f"noop: peak throughput {share:.0%} of the bare app's "
                       f"(target >= 60%): {ok}")
    for size, r in report.get("batching", {}).get("by_request_size", {}).items():
        s = r["speedup"]
        if s is None:
            out.append(f"mlp, {size} queries/request: batch size 1 never met the "
                       f"{_SLO_MS:g} ms SLO; adaptive batching did")
            continue
        out.append(f"mlp, {size} queries/request: adaptive batching {s:.2f}x the goodput of "
                   f"batch size 1 at a {_SLO_MS:g} ms SLO (target >= 5x): "
                   f"{'met' if s >= 5 else 'missed'}")
    return out


def _p50_verdict(name: str, m: dict[str, Any]) -> str:
    """The < 1 ms target, judged on the lean probe when there is one (see ``probe``), with the
    load generator's figures beside it."""
    low = min(m["points"], key=lambda r: r["rate"])["rate"]
    raw = m["raw"]["p50_ms"]
    loadgen = {r["system"]: r["p50_ms"] for r in m["points"] if r["rate"] == low}
    p50, client = (({s: r["p50_ms"] for s, r in m["probe"].items()}, "low-load probe")
                   if m.get("probe") else (loadgen, "aiohttp load generator"))
    added = p50["parityserve"] - raw
    text = (f"{name}: parityserve p50 is {added:.3f} ms above the raw in-process call at "
            f"{low:g} q/s on the {client} (target < 1 ms): {'met' if added < 1.0 else 'missed'}"
            f"; the bare HTTP app alone is {p50['bare'] - raw:.3f} ms above it, so the serving "
            f"path adds {p50['parityserve'] - p50['bare']:.3f} ms over the bare app")
    if "floor" in p50:
        text += _floor_split(p50, raw)
    if m.get("probe"):
        text += (f" (on the aiohttp load generator: {loadgen['parityserve'] - raw:.3f} ms above "
                 f"raw, bare {loadgen['bare'] - raw:.3f} ms)")
    if p50["bare"] - raw >= 1.0:
        text += (". The bare HTTP app alone spends the whole 1 ms budget, so no frontend that "
                 "answers over HTTP meets the target with this machine and load generator")
    return text


_FLOOR_APP = "the bare app plus one hop to a worker process through parityserve's RPC layer"


def _floor_split(p50: dict[str, float], raw: float) -> str:
    """Split parityserve's latency into HTTP hop, process hop and serving logic, but only
    when the floor app (bare app plus one worker hop) really is below parityserve: a floor
    measured above it says the floor's own hop was slower in that run, not that our serving
    logic costs negative time."""
    floor = p50["floor"] - raw
    if p50["floor"] > p50["parityserve"]:
        return (f". The floor app ({_FLOOR_APP}) measured {floor:.3f} ms above the raw call, "
                f"slower than parityserve itself, so this run does not split the hops")
    return (f". The architecture's floor ({_FLOOR_APP}) is {floor:.3f} ms above the raw "
            f"call: the process hop costs {p50['floor'] - p50['bare']:.3f} ms, parityserve's own "
            f"serving logic {p50['parityserve'] - p50['floor']:.3f} ms"
            + (", so no implementation of this architecture meets the target on this machine"
               if floor >= 1.0 else ""))


def _series(report: dict[str, Any]) -> dict[str, list[tuple[float, float, float, float]]]:
    series: dict[str, list[tuple[float, float, float, float]]] = {}
    for name, m in report["models"].items():
        for r in m["points"]:
            series.setdefault(f"{name} {r['system']}", []).append(
                (r["rate"], r["p50_ms"], r["p99_ms"], r["p999_ms"]))
    return series
