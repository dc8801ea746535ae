"""``parityserve bench load``: a load tool for any KServe V2 server or Clipper route.

Triton's perf_analyzer, for this ecosystem. It speaks V2 over HTTP (JSON or the binary tensor
extension) and gRPC, or a Clipper ``/{app}/predict`` route, so the same numbers can be taken
from parityserve, Triton, KServe or a bare app. Three modes:

- open loop (``--rate``): Poisson or constant arrivals, each query sent at its intended time
  whatever happened to earlier ones, latency from that intended time (no coordinated
  omission: see ``loadgen``);
- closed loop (``--concurrency``): that many clients, each sending its next query when the
  last one is answered;
- sweep (``--sweep --slo-ms``): open-loop steps that find the highest rate whose p99 stays
  under the SLO with under 1% errors.

Every run reports p50/p90/p99/p99.9 with the sample count behind each, goodput (answers
within the SLO per second), errors by kind, the tool's own CPU per request (so a reader knows
when the tool, not the server, is the bottleneck) and, against a parityserve server, where
the time went: queueing inside the server, the rest of the server, and outside it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from parityserve.bench.loadgen import (
    HttpSender,
    HttpStatusError,
    LoadResult,
    collector_paused,
    encode_bodies,
    error_kind,
    poisson_schedule,
    run_event_loop,
    run_open_loop,
)
from parityserve.bench.stats import enough_samples, percentiles
from parityserve.errors import ConfigError, DataError

__all__ = ["PROTOCOLS", "add_arguments", "next_sweep_rate", "run", "run_closed_loop",
           "server_split", "v2_target"]

PROTOCOLS = ("http-json", "http-binary", "grpc", "clipper")
Send = Callable[[int], Awaitable[Any]]

_SWEEP_MAX_ERROR_RATE = 0.01  # a sweep step with more failed queries than this fails
_TOOL_BUSY = 0.7  # share of one core the tool may use before it warns it may be the limit


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="server base URL: http://HOST:PORT (or HOST:PORT for grpc)")
    p.add_argument("--protocol", choices=PROTOCOLS, default="http-binary",
                   help="V2 over HTTP JSON or binary, V2 over gRPC, or a Clipper route "
                        "(default: http-binary)")
    target = p.add_argument_group("what to query")
    target.add_argument("--model", help="V2 model name (http-json, http-binary, grpc)")
    target.add_argument("--model-version", default="", help="V2 model version (default: latest)")
    target.add_argument("--app", help="Clipper application (--protocol clipper)")
    target.add_argument("--inputs", type=Path,
                        help=".npy or .npz file; its first axis is the queries (default: "
                             "random data of the model's declared shape)")
    target.add_argument("--input-key", help="array to use from an .npz (default: the first)")
    target.add_argument("--shape", help="shape of one query, e.g. 784 or 3,32,32, when the "
                                        "server declares none (Clipper routes never do)")
    target.add_argument("--datatype", default="FP32", help="V2 datatype of random inputs")
    target.add_argument("--batch", type=int, default=1, help="queries per request (default 1)")
    target.add_argument("--token", help="bearer token, for servers that protect inference")
    mode = p.add_argument_group("how to load it (pick one)")
    mode.add_argument("--rate", type=float, help="open loop: requests per second")
    mode.add_argument("--arrival", choices=("poisson", "constant"), default="poisson")
    mode.add_argument("--concurrency", type=int, help="closed loop: clients in flight")
    mode.add_argument("--sweep", action="store_true",
                      help="find the highest rate whose p99 meets --slo-ms")
    mode.add_argument("--start-rate", type=float, default=50.0, help="sweep: first rate")
    mode.add_argument("--max-rate", type=float, default=20_000.0, help="sweep: highest rate")
    mode.add_argument("--steps", type=int, default=4, help="sweep: bisection steps (default 4)")
    size = p.add_argument_group("how long")
    size.add_argument("--duration", type=float, default=10.0,
                      help="seconds per run (per sweep step); default 10")
    size.add_argument("--requests", type=int, help="requests per run (instead of --duration)")
    size.add_argument("--slo-ms", type=float, help="latency objective for goodput and sweeps")
    size.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    out = p.add_argument_group("output")
    out.add_argument("--metrics-url", help="where the server's /metrics is (default: the URL "
                                           "itself for HTTP protocols; none for grpc)")
    out.add_argument("--json", type=Path, help="write the full report here")
    out.add_argument("--plot", type=Path, help="draw latency CDF (or the sweep) here (.png)")
    out.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    plan = _check(args)
    report = run_event_loop(_main(args, plan))
    print(render(report))
    if args.plot is not None:
        _plot(report, args.plot)
    if args.json is not None:
        args.json.write_text(json.dumps(_public(report), indent=2, default=_jsonable))
    return 0


def _public(value: Any) -> Any:
    """``value`` without the keys that start with '_' (raw samples kept for the plot)."""
    if isinstance(value, dict):
        return {k: _public(v) for k, v in value.items() if not k.startswith("_")}
    if isinstance(value, list):
        return [_public(v) for v in value]
    return value


# ---- the plan ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    mode: str  # "open", "closed" or "sweep"
    protocol: str
    metrics_url: str | None


def _check(args: argparse.Namespace) -> Plan:
    modes = [m for m, on in (("open", args.rate is not None),
                             ("closed", args.concurrency is not None),
                             ("sweep", args.sweep)) if on]
    if len(modes) != 1:
        raise ConfigError("pick exactly one mode: --rate R (open loop), --concurrency C "
                          "(closed loop) or --sweep --slo-ms S")
    if args.sweep and args.slo_ms is None:
        raise ConfigError("--sweep needs --slo-ms: the p99 each step must meet")
    if args.protocol == "clipper" and not args.app:
        raise ConfigError("--protocol clipper needs --app NAME")
    if args.protocol != "clipper" and not args.model:
        raise ConfigError(f"--protocol {args.protocol} needs --model NAME")
    for flag, value in (("--rate", args.rate), ("--concurrency", args.concurrency),
                        ("--batch", args.batch), ("--duration", args.duration),
                        ("--requests", args.requests), ("--timeout", args.timeout)):
        if value is not None and value <= 0:
            raise ConfigError(f"{flag} must be positive, got {value}")
    if args.protocol == "grpc" and args.url.startswith(("http://", "https://")):
        raise ConfigError("for --protocol grpc give HOST:PORT (the gRPC port), not a URL")
    metrics = args.metrics_url or (args.url if args.protocol != "grpc" else None)
    return Plan(modes[0], args.protocol, metrics)


async def _main(args: argparse.Namespace, plan: Plan) -> dict[str, Any]:
    async with _target(args) as send:
        report: dict[str, Any] = {"command": _command(), "protocol": plan.protocol,
                                  "mode": plan.mode, "url": args.url, "batch": args.batch,
                                  "slo_ms": args.slo_ms}
        if plan.mode == "sweep":
            report["sweep"] = await _sweep(send, args, plan)
        else:
            report["run"] = await _one_run(send, args, plan, args.rate)
        return report


async def _one_run(send: Send, args: argparse.Namespace, plan: Plan,
                   rate: float | None) -> dict[str, Any]:
    before = await _scrape(plan.metrics_url)
    cpu0 = time.process_time()
    progress = False if args.no_progress else "requests"
    if rate is not None:
        n = args.requests or max(1, round(rate * args.duration))
        rng = np.random.default_rng(0)
        schedule = (poisson_schedule(rate, n, rng) if args.arrival == "poisson"
                    else np.arange(n) / rate)
        result = await run_open_loop(send, schedule, progress=progress,
                                     timeout_s=args.timeout, rate_qps=rate)
    else:
        result = await run_closed_loop(send, args.concurrency, requests=args.requests,
                                       duration_s=args.duration, timeout_s=args.timeout,
                                       progress=progress)
    cpu = time.process_time() - cpu0
    after = await _scrape(plan.metrics_url)
    summary = summarise(result, cpu_s=cpu, slo_ms=args.slo_ms, batch=args.batch,
                        split=server_split(before, after, result))
    summary["_latencies_ms"] = result.latencies_s[result.ok] * 1e3  # for the plot, not JSON
    return summary


# ---- closed loop -------------------------------------------------------------------------


async def run_closed_loop(send: Send, concurrency: int, *, requests: int | None = None,
                          duration_s: float = 10.0, timeout_s: float = 30.0,
                          progress: bool | str = False) -> LoadResult:
    """``concurrency`` clients, each sending its next request when the last one is answered,
    for ``requests`` requests in all or, without it, for ``duration_s`` seconds. Latency runs
    from each actual send (a closed loop has no intended times)."""
    limit = requests if requests is not None else sys.maxsize
    latencies: list[float] = []
    ok: list[bool] = []
    errors: Counter[str] = Counter()
    counter = itertools.count()
    bar = _bar(progress, requests)

    async def client() -> None:
        while (i := next(counter)) < limit and time.perf_counter() < stop_at:
            sent = time.perf_counter()
            try:
                await asyncio.wait_for(send(i), timeout_s)
            except Exception as exc:  # a failed request is counted, never dropped
                errors[error_kind(exc) if not isinstance(exc, TimeoutError) else "timeout"] += 1
                ok.append(False)
            else:
                ok.append(True)
            latencies.append(time.perf_counter() - sent)
            if bar is not None:
                bar.update()

    try:
        with collector_paused():  # a generator's own pause is not the server's latency
            start = time.perf_counter()
            stop_at = start + duration_s if requests is None else math.inf
            await asyncio.gather(*(client() for _ in range(concurrency)))
            duration = time.perf_counter() - start
    finally:
        if bar is not None:
            bar.close()
    return LoadResult(latencies_s=np.array(latencies), ok=np.array(ok, dtype=bool),
                      results=[], errors=errors, offered_rate=math.nan, duration_s=duration)


def _bar(progress: bool | str, total: int | None) -> Any:
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=str(progress) if isinstance(progress, str) else "requests",
                unit="req", dynamic_ncols=True)


# ---- sweep -------------------------------------------------------------------------------


def next_sweep_rate(passed: Sequence[float], failed: Sequence[float], *, start: float,
                    maximum: float, steps_left: int) -> float | None:
    """The next rate to try, or None when the sweep is done (pure: the steps so far in).

    Doubles from ``start`` until a step fails (or ``maximum``), then bisects between the best
    rate that passed and the lowest that failed for ``steps_left`` more steps.
    """
    best = max(passed, default=None)
    worst = min(failed, default=None)
    if best is None and worst is None:
        return start
    if worst is None:
        assert best is not None
        return min(best * 2, maximum) if best < maximum else None
    if best is None:
        return worst / 2 if worst / 2 >= 1.0 and steps_left > 0 else None
    if steps_left <= 0 or worst - best <= max(1.0, 0.02 * best):
        return None
    return (best + worst) / 2


async def _sweep(send: Send, args: argparse.Namespace, plan: Plan) -> dict[str, Any]:
    passed: list[float] = []
    failed: list[float] = []
    steps: list[dict[str, Any]] = []
    bisect_left = args.steps
    while (rate := next_sweep_rate(passed, failed, start=args.start_rate,
                                   maximum=args.max_rate, steps_left=bisect_left)) is not None:
        if failed:
            bisect_left -= 1
        print(f"sweep: {rate:.0f} requests/s for {args.duration:g} s", file=sys.stderr,
              flush=True)
        step = await _one_run(send, args, plan, rate)
        good = step_passes(step, args.slo_ms)
        (passed if good else failed).append(rate)
        steps.append({"rate": rate, "passed": good, **step})
    best = max(passed, default=None)
    return {"best_rate": best, "steps": steps,
            "rule": f"p99 <= {args.slo_ms} ms and errors <= {_SWEEP_MAX_ERROR_RATE:.0%}"}


def step_passes(step: dict[str, Any], slo_ms: float) -> bool:
    """Open loop: a server that falls behind answers later, so the p99 (timed from each
    intended send) and the errors say it all; throughput only echoes the offered rate."""
    n = step["n"]
    errors = sum(step["errors"].values())
    return n > 0 and errors / n <= _SWEEP_MAX_ERROR_RATE and step["p99_ms"] <= slo_ms


# ---- results -----------------------------------------------------------------------------


def summarise(result: LoadResult, *, cpu_s: float, slo_ms: float | None, batch: int,
              split: dict[str, float] | None) -> dict[str, Any]:
    """One run's numbers: percentiles with their sample counts, goodput, errors, tool cost."""
    lat = result.latencies_s[result.ok]
    n_ok = int(lat.size)
    within = int((lat * 1e3 <= slo_ms).sum()) if slo_ms is not None else None
    per_request_us = cpu_s / result.n * 1e6 if result.n else math.nan
    tool_capacity = 1e6 / per_request_us if per_request_us > 0 else math.inf
    throughput = result.throughput
    out: dict[str, Any] = {
        "n": result.n, "ok": n_ok, "errors": dict(result.errors),
        "offered_rps": result.offered_rate, "throughput_rps": throughput,
        "throughput_qps": throughput * batch, "duration_s": result.duration_s,
        **percentiles(lat),
        "samples": {"p50": n_ok, "p99_reliable": enough_samples(n_ok, 99.0),
                    "p999_reliable": enough_samples(n_ok, 99.9)},
        "goodput_rps": within / result.duration_s if within is not None and
        result.duration_s > 0 else None,
        "tool_cpu_us_per_request": per_request_us,
        "tool_capacity_rps": tool_capacity,
        "tool_may_be_the_limit": throughput > _TOOL_BUSY * tool_capacity,
    }
    if result.send_lag_s.size:
        out["send_lag_p99_ms"] = percentiles(result.send_lag_s)["p99_ms"]
    if split is not None:
        out["server_split"] = split
    return out


def render(report: dict[str, Any]) -> str:
    """The report as a reader wants it in a terminal."""
    lines = [f"{report['protocol']} {report['mode']} loop against {report['url']} "
             f"({report['batch']} queries per request)"]
    runs = ([report["run"]] if "run" in report
            else [s for s in report["sweep"]["steps"]])
    lines.append(f"{'rate':>8} {'n':>7} {'req/s':>8} {'p50 ms':>8} {'p90 ms':>8} "
                 f"{'p99 ms':>8} {'p99.9 ms':>9} {'errors':>7} {'goodput':>8}")
    for r in runs:
        rate = "closed" if math.isnan(r["offered_rps"]) else f"{r['offered_rps']:.0f}"
        good = "" if r["goodput_rps"] is None else f"{r['goodput_rps']:.0f}"
        p999 = f"{r['p999_ms']:.3f}" + ("" if r["samples"]["p999_reliable"] else "*")
        lines.append(f"{rate:>8} {r['n']:>7} {r['throughput_rps']:>8.0f} {r['p50_ms']:>8.3f} "
                     f"{r['p90_ms']:>8.3f} {r['p99_ms']:>8.3f} {p999:>9} "
                     f"{sum(r['errors'].values()):>7} {good:>8}")
    last = runs[-1]
    if any(r["errors"] for r in runs):
        kinds: Counter[str] = Counter()
        for r in runs:
            kinds.update(r["errors"])
        lines.append("errors by kind: " + ", ".join(f"{k} x{v}" for k, v in kinds.items()))
    if not all(r["samples"]["p999_reliable"] for r in runs):
        lines.append("* fewer than 1,000 answers: p99.9 is one of the slowest few, not a tail")
    lines.append(f"tool: {last['tool_cpu_us_per_request']:.0f} us CPU per request, so one "
                 f"core sends at most ~{last['tool_capacity_rps']:.0f} req/s"
                 + ("  <-- the tool may be the bottleneck" if last["tool_may_be_the_limit"]
                    else ""))
    split = last.get("server_split")
    if split:
        lines.append(f"server (mean per query): {split['queue_ms']:.3f} ms queued, "
                     f"{split['server_ms']:.3f} ms in the server in all; "
                     f"{split['outside_ms']:.3f} ms outside it (network, client, HTTP)")
    if "sweep" in report:
        best = report["sweep"]["best_rate"]
        lines.append(f"sweep ({report['sweep']['rule']}): highest passing rate "
                     + ("none" if best is None else f"{best:.0f} requests/s"))
    return "\n".join(lines)


# ---- the server's own split, from /metrics -----------------------------------------------

_QUEUE = "parityserve_queue_time_seconds"
_LATENCY = "parityserve_request_latency_seconds"


async def _scrape(url: str | None) -> dict[str, float] | None:
    if url is None:
        return None
    import httpx

    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            response = await client.get(url.rstrip("/") + "/metrics")
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    return histogram_sums(response.text)


def histogram_sums(text: str) -> dict[str, float]:
    """``{name_sum, name_count}`` totals over all label sets of our two histograms."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in (_QUEUE, _LATENCY):
            continue
        for sample in family.samples:
            if sample.name.endswith(("_sum", "_count")):
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def server_split(before: dict[str, float] | None, after: dict[str, float] | None,
                 result: LoadResult) -> dict[str, float] | None:
    """Mean queueing and in-server time per query over the run, and the time outside.

    None when the server is not parityserve (no such histograms) or served nothing.
    """
    if before is None or after is None:
        return None

    def mean(name: str) -> float | None:
        count = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
        total = after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)
        return total / count * 1e3 if count > 0 else None

    queue, server = mean(_QUEUE), mean(_LATENCY)
    lat = result.latencies_s[result.ok]
    if queue is None or server is None or lat.size == 0:
        return None
    client = float(lat.mean() * 1e3)
    return {"queue_ms": queue, "server_ms": server, "outside_ms": max(client - server, 0.0),
            "client_mean_ms": client}


# ---- targets -----------------------------------------------------------------------------


def v2_target(url: str, model: str, *, protocol: str = "http-binary", shape: str | None = None,
              token: str | None = None, timeout_s: float = 30.0) -> _target:
    """``async with v2_target(url, model) as send``: this tool's sender for one V2 model, with
    256 distinct random inputs of its declared shape (or ``shape``), for other tools (the
    profiler) that drive their own loops."""
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    # "--flag=value": a value may begin with "-" (a urlsafe token does, one time in 64),
    # which argparse would take for an option if it came as the next word.
    argv = [url, f"--model={model}", f"--protocol={protocol}", f"--timeout={timeout_s}"]
    argv += [f"--shape={shape}"] if shape else []
    argv += [f"--token={token}"] if token else []
    return _target(parser.parse_args(argv))


class _target:  # noqa: N801 - an async context manager used as ``async with _target(args)``
    """The ``send(i)`` for the chosen protocol, with its connections open."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self._close: list[Callable[[], Awaitable[Any]]] = []

    async def __aenter__(self) -> Send:
        a = self.args
        headers = {"Authorization": f"Bearer {a.token}"} if a.token else {}
        if a.protocol == "grpc":
            return await self._grpc(headers)
        http = HttpSender(a.url, timeout_s=a.timeout)
        await http.__aenter__()
        self._close.append(lambda: http.__aexit__(None, None, None))
        if a.protocol == "clipper":
            rows = _inputs(a, None)
            bodies = (encode_bodies(list(rows[:256])) if a.batch == 1
                      else _clipper_batches(rows, a.batch))
            json_headers = {"Content-Type": "application/json", **headers}
            return _post_sender(http, f"/{a.app}/predict",
                                [(body, json_headers) for body in bodies])
        meta = await _http_metadata(a.url, a.model, a.model_version, headers)
        return _v2_http_sender(http, a, meta, headers)

    async def __aexit__(self, *exc: object) -> None:
        for close in reversed(self._close):
            await close()

    async def _grpc(self, headers: dict[str, str]) -> Send:
        import tritonclient.grpc.aio as tga
        from tritonclient.utils import InferenceServerException

        a = self.args
        client = tga.InferenceServerClient(a.url)
        self._close.append(client.close)
        try:
            meta = await client.get_model_metadata(a.model, a.model_version, headers=headers,
                                                   as_json=True)
        except InferenceServerException as exc:
            raise ConfigError(f"cannot read model {a.model!r} at {a.url}: {exc}") from None
        spec = _spec_from(meta)
        requests = _requests(_inputs(a, spec), a.batch)
        inputs = []
        for batch in requests:
            inp = tga.InferInput(spec["name"], list(batch.shape), _datatype(batch))
            inp.set_data_from_numpy(batch)
            inputs.append([inp])

        async def send(i: int) -> Any:
            try:
                return await client.infer(a.model, inputs[i % len(inputs)],
                                          model_version=a.model_version, headers=headers,
                                          client_timeout=a.timeout)
            except InferenceServerException as exc:
                raise _GrpcError(str(exc.status())) from None

        return send


class _GrpcError(Exception):
    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.kind = f"gRPC {status.removeprefix('StatusCode.')}"


def _post_sender(http: HttpSender, path: str, framed: list[tuple[bytes, dict[str, str]]]
                 ) -> Send:
    """POST ``framed[i % len]`` (a pre-encoded body and its headers); non-200 raises."""
    async def send(i: int) -> Any:
        body, headers = framed[i % len(framed)]
        status, raw = await http.post(path, body, headers)
        if status != 200:
            raise HttpStatusError(status, raw)
        return len(raw)

    return send


def _clipper_batches(rows: np.ndarray, batch: int) -> list[bytes]:
    import orjson

    groups = _requests(rows, batch)
    return [orjson.dumps({"input_batch": g}, option=orjson.OPT_SERIALIZE_NUMPY) for g in groups]


async def _http_metadata(url: str, model: str, version: str, headers: dict[str, str]
                         ) -> dict[str, Any]:
    import httpx

    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            response = await client.get(url.rstrip("/") + path, headers=headers)
    except httpx.HTTPError as exc:
        raise ConfigError(f"cannot reach {url}: {exc}") from None
    if response.status_code != 200:
        raise ConfigError(f"cannot read model {model!r} at {url}: HTTP "
                          f"{response.status_code} {response.text[:200]}")
    return dict(response.json())


def _datatype(batch: np.ndarray) -> str:
    from parityserve.runtime.frontend.v2 import dtype_to_datatype

    return dtype_to_datatype(batch.dtype)


def _spec_from(meta: dict[str, Any]) -> dict[str, Any]:
    """The single input's name, datatype and per-query shape from V2 model metadata."""
    inputs = meta.get("inputs") or []
    if len(inputs) != 1:
        return {"name": "input", "datatype": None, "shape": None}
    shape = [int(d) for d in inputs[0].get("shape", [])][1:]  # the first axis is the batch
    return {"name": inputs[0]["name"], "datatype": inputs[0]["datatype"], "shape": shape}


def _v2_http_sender(http: HttpSender, a: argparse.Namespace, meta: dict[str, Any],
                    headers: dict[str, str]) -> Send:
    from parityserve.runtime.frontend import v2

    spec = _spec_from(meta)
    binary = a.protocol == "http-binary"
    bodies = [v2.encode_infer_request([(spec["name"], batch)], binary=binary,
                                      binary_output=binary if binary else None)
              for batch in _requests(_inputs(a, spec), a.batch)]
    path = f"/v2/models/{a.model}" + (f"/versions/{a.model_version}" if a.model_version
                                      else "") + "/infer"
    return _post_sender(http, path, [(body, {**h, **headers}) for body, h in bodies])


def _inputs(a: argparse.Namespace, spec: dict[str, Any] | None) -> np.ndarray:
    """The queries to send: from --inputs, or random data of the declared (or --shape) shape."""
    if a.inputs is not None:
        return _load_inputs(a.inputs, a.input_key)
    shape = ([int(d) for d in a.shape.split(",")] if a.shape
             else (spec or {}).get("shape"))
    if shape is None or any(d < 0 for d in shape):
        raise ConfigError("the server declares no fixed input shape: pass --shape (e.g. 784) "
                          "or --inputs FILE.npy")
    datatype = a.datatype if a.shape or not spec or not spec.get("datatype") else \
        spec["datatype"]
    from parityserve.runtime.frontend.v2 import datatype_to_dtype

    dtype = datatype_to_dtype(datatype)
    rng = np.random.default_rng(0)
    if dtype.kind == "f":
        return rng.random((256, *shape)).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 100, (256, *shape)).astype(dtype)
    if dtype.kind == "b":
        return rng.random((256, *shape)) < 0.5
    raise ConfigError(f"random inputs of datatype {datatype} are not supported: use --inputs")


def _load_inputs(path: Path, key: str | None) -> np.ndarray:
    if not path.exists():
        raise DataError(f"--inputs {path} does not exist")
    loaded = np.load(path, allow_pickle=False)
    if isinstance(loaded, np.ndarray):
        return loaded
    with loaded:
        names = list(loaded.files)
        if key is None:
            if not names:
                raise DataError(f"{path} holds no arrays")
            key = names[0]
        if key not in names:
            raise DataError(f"{path} has no array {key!r}; it has {names}")
        return np.asarray(loaded[key])


def _requests(rows: np.ndarray, batch: int) -> list[np.ndarray]:
    """Up to 256 distinct requests of ``batch`` rows each, cycling through ``rows``."""
    if len(rows) == 0:
        raise DataError("the inputs hold no queries")
    count = max(1, min(256, len(rows) // batch or 1))
    return [np.ascontiguousarray(np.take(rows, range(i * batch, (i + 1) * batch), axis=0,
                                         mode="wrap")) for i in range(count)]


# ---- output ------------------------------------------------------------------------------


def _command() -> str:
    from parityserve.bench.report import command_line

    return command_line()


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _plot(report: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'parityserve[bench]'") from None
    fig, ax = plt.subplots(figsize=(7, 4))
    if "sweep" in report:
        steps = sorted(report["sweep"]["steps"], key=lambda s: s["rate"])
        rates = [s["rate"] for s in steps]
        for key, style in (("p50_ms", "-o"), ("p99_ms", "--o"), ("p999_ms", ":o")):
            ax.plot(rates, [s[key] for s in steps], style, label=key.replace("_ms", ""))
        ax.axhline(report["slo_ms"], color="grey", lw=0.8, label="SLO")
        ax.set_xlabel("offered requests/s")
        ax.set_ylabel("latency, ms")
        ax.set_yscale("log")
        ax.legend()
    else:
        run_ = report["run"]
        lat = np.sort(run_["_latencies_ms"])
        ax.plot(lat, np.arange(1, lat.size + 1) / max(lat.size, 1))
        ax.set_xscale("log")
        ax.set_xlabel("latency, ms (log)")
        ax.set_ylabel("share of requests answered")
        ax.set_title(f"{report['protocol']}: p50 {run_['p50_ms']:.2f} ms, "
                     f"p99 {run_['p99_ms']:.2f} ms, p99.9 {run_['p999_ms']:.2f} ms "
                     f"(n={run_['ok']})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
