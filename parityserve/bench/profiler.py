"""``parityserve profile``: SERF's profiler through the real serving path, and the exhaustive
search it replaces (SERF Table II).

For every tuple (i, intra) the plan allows (``core/profiling.profile_plan``), the profiler sets
the model's parallelism c = i and its intra-op threads live through the admin API (no process
restarts; it waits until every replica's heartbeat acknowledges the threads), then keeps
exactly i V2 requests outstanding in a closed loop. The first ``--warmup`` answers are
discarded and the next ``--requests`` timed; with c = i nothing queues. μ_i = 1 / the mean
service time, which is (``--service-time server``, the default) the time each timed request
held its slot as the frontend measured it, dispatch to a worker until the result is back,
with the rest of the client's round trip (HTTP, the frontend, the client) kept as overhead
outside the queue; or (``client``) the whole round trip. The server's time matters because
under open load the frontend's work for one request overlaps the next one's compute: a
round trip would understate the rate the slot turns over. From the profile,
``core/queueing`` predicts every configuration's mean latency (W plus the overhead) at every
load and prints the best per load level (the reference table).

Beyond SERF (``--idle-requests``, on by default with the server's service time): per thread
count, each i once more with one request queued behind them (back-to-back service, no idle
gap), and at c = 1 requests spaced by idle gaps of 2-50 ms. ``core/idle_queueing`` turns
them into the idle-aware model, for a machine where a request that starts after its worker
slept computes slower (this project's VM: a ResNet-20 call 1.2-1.3x its back-to-back time
after 5-50 ms asleep, ``benchmarks/results/serf-noise``). It adds a few seconds; the report
keeps its time apart (``idle_elapsed_s``).

``--exhaustive`` also measures what the model predicts: every configuration at every load
level, each an open-loop Poisson run, and reports both searches' cost side by side.

Where the server comes from: with ``-c serving.yaml`` the profiler starts ``parityserve start``
as a subprocess serving only the profiled model, with enough replicas for the largest i, batches
of one, the prediction cache off and the other models and applications left out. A separate
process keeps the load generator off the frontend's interpreter (the frontend's time is
measured as a client sees it), and the derived deployment file is written beside the original
(so relative model paths still resolve) and removed afterwards. With ``--url`` it profiles a
running server instead, which must have its cache off and enough replicas; it puts the model's
parallelism and threads back as they were when it is done.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import yaml

from parityserve.bench.load import run_closed_loop, v2_target
from parityserve.bench.loadgen import (
    LoadResult,
    Send,
    poisson_schedule,
    run_event_loop,
    run_open_loop,
)
from parityserve.bench.report import command_line, machine_info
from parityserve.bench.stats import percentiles
from parityserve.client import Client
from parityserve.core.idle_queueing import Spaced, idle_inputs
from parityserve.core.profiling import (
    SERVICE_TIMES,
    Cell,
    Cost,
    Measurement,
    ProfileDocument,
    best_with_overhead,
    compare_costs,
    exhaustive_plan,
    load_levels,
    measure,
    measured_best,
    overheads,
    profile_plan,
)
from parityserve.core.queueing import Config, TableRow, configurations, reference_table
from parityserve.core.tail_choice import tail_table
from parityserve.errors import ConfigError, ParityServeError, Unavailable

__all__ = ["add_arguments", "apply_configuration", "profile_config", "profile_deployment",
           "render", "run"]

_ACK_TIMEOUT_S = 15.0
_POLL_S = 0.02


def add_arguments(p: argparse.ArgumentParser) -> None:
    where = p.add_argument_group("which server (one of)")
    where.add_argument("-c", "--config", type=Path,
                       help="deployment YAML: start a private server for the model from it")
    where.add_argument("--url", help="a running parityserve (cache off, replicas >= the "
                                     "largest i): profile it live")
    where.add_argument("--token", help="admin token for --url (default: as `parityserve "
                                       "token` finds it)")
    where.add_argument("--data-dir", type=Path, help="datasets/weights ($PARITYSERVE_DATA)")
    p.add_argument("--model", required=True, help="the deployed model to profile")
    plan = p.add_argument_group("what to measure")
    plan.add_argument("--cores", type=int, help="cores to plan for (default: this machine's)")
    plan.add_argument("--oversubscribe", action="store_true",
                      help="also tuples with i x intra up to twice the cores (c up to 4 on 2 "
                           "cores): a labelled extension beyond SERF's faithful setting")
    plan.add_argument("--intra", help="thread counts to profile, e.g. 1,2 (default: all)")
    plan.add_argument("--max-c", type=int, help="largest i (default: as many as fit)")
    plan.add_argument("--warmup", type=int, default=10,
                      help="answers discarded per tuple (default 10)")
    plan.add_argument("--requests", type=int, default=50,
                      help="answers timed per tuple (at least 10; default 50)")
    plan.add_argument("--service-time", choices=SERVICE_TIMES, default="server",
                      help="server (default): the time a request holds its slot, as the "
                           "frontend measures it (dispatch to result), with the rest of the "
                           "round trip kept as overhead outside the queue; client: the whole "
                           "round trip. Server needs batches of one")
    plan.add_argument("--idle-requests", type=int, default=20,
                      help="beyond SERF: per thread count, also time each i with one more "
                           "request queued (back-to-back service) and, at c = 1, this many "
                           "requests after each idle gap in " + _gaps_text() + ", for the "
                           "idle-aware model (core/idle_queueing); 0 skips it, and so does "
                           "--service-time client (default 20)")
    plan.add_argument("--shape", help="one query's shape when the model declares none")
    plan.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    ex = p.add_argument_group("the exhaustive baseline")
    ex.add_argument("--exhaustive", action="store_true",
                    help="also measure every configuration at every load level directly "
                         "(open-loop Poisson) and compare the two searches' cost")
    ex.add_argument("--levels", type=int, default=10,
                    help="load levels λ_k = k·λ_max/(levels+1) (default 10)")
    ex.add_argument("--exhaustive-queries", type=int, default=200,
                    help="queries per (configuration, load level) run (default 200)")
    ex.add_argument("--seed", type=int, default=0, help="seeds the Poisson schedules and "
                                                         "the simulations")
    tail = p.add_argument_group("tail-aware choice (beyond SERF)")
    tail.add_argument("--slo-p99-ms", type=float,
                      help="per load level, also the cheapest configuration (fewest cores "
                           "busy) whose p99, simulated on the profiled service times by the "
                           "discrete-event simulator (the real scheduler), meets this SLO; "
                           "the table is saved in the profile, where a scheduler with "
                           "`slo_p99_ms` set to the same value reads it")
    tail.add_argument("--tail-queries", type=int, default=5000,
                      help="simulated queries per (configuration, load level) (default 5000)")
    out = p.add_argument_group("output")
    out.add_argument("-o", "--out", type=Path, help="profile JSON (default: profile-MODEL.json)")
    out.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    _check(args)
    with _served(args) as (client, token):
        report = run_event_loop(profile_deployment(client, args, token=token))
    out = args.out or Path(f"profile-{args.model}.json")
    out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    print(render(report))
    print(f"profile written to {out}")
    return 0


def _check(args: argparse.Namespace) -> None:
    if (args.config is None) == (args.url is None):
        raise ConfigError("give exactly one of -c/--config (start a server) or --url "
                          "(profile a running one)")
    if args.requests < 10:
        raise ConfigError(f"--requests must be at least 10 (got {args.requests}): a mean of "
                          "fewer is noise")
    if args.idle_requests < 0:
        raise ConfigError(f"--idle-requests must be 0 (skip) or more, got {args.idle_requests}")
    for name in ("warmup", "levels", "exhaustive_queries"):
        if getattr(args, name) < (0 if name == "warmup" else 1):
            raise ConfigError(f"--{name.replace('_', '-')} is too small: "
                              f"{getattr(args, name)}")
    if args.slo_p99_ms is not None and not (math.isfinite(args.slo_p99_ms)
                                            and args.slo_p99_ms > 0):
        raise ConfigError(f"--slo-p99-ms must be a number of milliseconds > 0, got "
                          f"{args.slo_p99_ms}")
    if args.tail_queries < 100:
        raise ConfigError(f"--tail-queries must be at least 100 for a p99, got "
                          f"{args.tail_queries}")
    args.intras = _intras(args.intra)


def _intras(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise ConfigError(f"--intra must be thread counts like 1,2; got {text!r}") from None


# ---- the server ----------------------------------------------------------------------------


@contextlib.contextmanager
def _served(args: argparse.Namespace) -> Iterator[tuple[Client, str | None]]:
    """The client of the server to profile, and the token its inference routes may need."""
    if args.url is not None:
        with Client(args.url, token=args.token) as client:
            yield client, args.token
        return
    from parityserve.bench.serverproc import ServerProcess

    derived, token = _derived_config(args)
    try:
        with ServerProcess(derived, data_dir=_data_dir(args.data_dir)) as server, \
                Client(server.url, token=token) as client:
            _await_ready(client, args.model)
            yield client, token
    finally:
        derived.unlink(missing_ok=True)


def profile_config(raw: dict[str, Any], model: str, *, replicas: int,
                   oversubscribe: bool) -> dict[str, Any]:
    """The deployment mapping the profiler serves: only ``model``, with ``replicas`` data
    replicas, batches of one, no redundancy or faults, c = 1 and one thread to start, and
    the cache off (a cached answer has no service time). Raises ConfigError without it."""
    found = [m for m in raw.get("models") or [] if m.get("name") == model]
    if not found:
        names = [m.get("name") for m in raw.get("models") or []]
        raise ConfigError(f"model {model!r} is not in the deployment file (it has {names})")
    dep = {k: v for k, v in found[0].items() if k not in ("faults", "parity", "redundancy")}
    dep.update(replicas=max(int(dep.get("replicas", 1)), replicas), parallelism=1,
               threads_per_replica=1, oversubscribe=oversubscribe,
               batching={"max_batch_size": 1, "max_delay_ms": 0})
    server = {**(raw.get("server") or {}), "http_port": 0, "grpc_port": 0, "cache_bytes": 0}
    server.pop("admin_host", None)
    server.pop("admin_port", None)
    return {"server": server, "models": [dep], "applications": []}


def _derived_config(args: argparse.Namespace) -> tuple[Path, str | None]:
    from parityserve.config import parse_config
    from parityserve.runtime.server import resolve_admin_token

    try:
        raw = yaml.safe_load(args.config.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read {args.config}: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{args.config}: expected a mapping at the top level")
    budget = _budget(args)
    mapping = profile_config(raw, args.model, replicas=min(budget, args.max_c or budget),
                             oversubscribe=args.oversubscribe)
    base_dir = args.config.resolve().parent
    token = resolve_admin_token(parse_config(mapping, where=str(args.config)), base_dir)
    path = base_dir / f".{args.config.stem}.profile-{os.getpid()}.yaml"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it may hold the token
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(mapping, f, sort_keys=False)
    return path, token.token if token else None


def _budget(args: argparse.Namespace) -> int:
    from parityserve.core.profiling import thread_budget

    return thread_budget(_cores(args), oversubscribe=args.oversubscribe)


def _cores(args: argparse.Namespace) -> int:
    return int(args.cores or os.cpu_count() or 1)


def _data_dir(explicit: Path | None) -> Path | None:
    chosen = explicit or (Path(os.environ["PARITYSERVE_DATA"])
                          if os.environ.get("PARITYSERVE_DATA") else None)
    return chosen.resolve() if chosen else None


def _model_state(client: Client, model: str) -> dict[str, Any]:
    for entry in client.state()["models"]:
        if entry["name"] == model:
            return dict(entry)
    raise ConfigError(f"the server at {client.url} serves no model {model!r}")


def _await_ready(client: Client, model: str, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        replicas = _model_state(client, model)["replicas"]
        if replicas and all(r["state"] == "ready" for r in replicas):
            return
        time.sleep(0.1)
    raise Unavailable(f"model {model!r}: replicas not ready after {timeout_s:.0f}s")


def apply_configuration(client: Client, model: str, config: Config) -> None:
    """Set c, then the threads (so the server's c x threads check sees the new c), and wait
    until every ready replica's heartbeat reports the threads."""
    client.set_parallelism(model, config.c)
    client.set_threads(model, config.intra)
    deadline = time.monotonic() + _ACK_TIMEOUT_S
    while time.monotonic() < deadline:
        ready = [r for r in _model_state(client, model)["replicas"] if r["state"] == "ready"]
        if ready and all(r.get("threads") == config.intra for r in ready):
            return
        time.sleep(_POLL_S)
    raise Unavailable(f"model {model!r}: replicas did not acknowledge {config.intra} threads "
                      f"within {_ACK_TIMEOUT_S:.0f}s")


# ---- profiling -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Setup:
    model: str
    cores: int
    oversubscribe: bool
    plan: tuple[Config, ...]
    restore: tuple[int | None, int]  # the parallelism and threads found, put back at the end


def _setup(client: Client, args: argparse.Namespace) -> _Setup:
    state = _model_state(client, args.model)
    if args.url is not None and _cache_on(client):
        raise ConfigError("the server's prediction cache is on: a cached answer has no "
                          "service time. Profile with server.cache_bytes: 0 (or use -c)")
    data = [r for r in state["replicas"] if r.get("pool", "data") == "data"]
    cap = min(len(data), args.max_c or len(data))
    if cap < 1:
        raise ConfigError(f"model {args.model!r} has no data replicas to profile")
    plan = profile_plan(_cores(args), oversubscribe=args.oversubscribe, intras=args.intras,
                        max_c=cap)
    return _Setup(args.model, _cores(args), args.oversubscribe, plan,
                  (state.get("parallelism"), int(state.get("threads") or 1)))


def _cache_on(client: Client) -> bool:
    return bool(client.state()["cache"].get("capacity_bytes"))


async def profile_deployment(client: Client, args: argparse.Namespace,
                             token: str | None = None) -> dict[str, Any]:
    """Profile (and with ``--exhaustive`` search) ``args.model`` on the server ``client``
    talks to; returns the report that ``run`` writes as JSON."""
    setup = _setup(client, args)
    try:
        async with v2_target(client.url, args.model, protocol="http-binary", shape=args.shape,
                             token=token, timeout_s=args.timeout) as send:
            report = await _searches(send, client, setup, args)
    finally:
        _restore(client, setup)
    return report


def _restore(client: Client, setup: _Setup) -> None:
    """Put c and the threads back. c = 1 first, so the threads pass the server's
    c x threads check whatever c was profiled last; then the original c (unchecked)."""
    c, threads = setup.restore
    try:
        client.set_parallelism(setup.model, 1)
        client.set_threads(setup.model, threads)
        client.set_parallelism(setup.model, c)
    except ParityServeError as exc:
        print(f"parityserve profile: warning: could not put {setup.model!r} back to "
              f"parallelism {c} and {threads} threads: {exc}", file=sys.stderr)


async def _searches(send: Send, client: Client, setup: _Setup,
                    args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    measurements, server_side, sent = await _profile(send, client, setup, args)
    elapsed = time.perf_counter() - started
    doc = ProfileDocument(setup.model, setup.cores, setup.oversubscribe, tuple(measurements),
                          elapsed, args.service_time)
    levels = load_levels(doc.profiles, cores=setup.cores, oversubscribe=setup.oversubscribe,
                         count=args.levels)
    table = reference_table(levels, doc.profiles, cores=setup.cores,
                            oversubscribe=setup.oversubscribe)
    report = {**doc.to_dict(), "runs": len(measurements), "requests": sent,
              "warmup": args.warmup, "timed": args.requests, "server_side": server_side,
              "levels": levels,
              "reference_table": [_row_doc(row, overheads(measurements)) for row in table],
              "command": command_line(), "machine": machine_info()}
    if args.idle_requests and args.service_time == "server":  # it needs the slot times
        idle_started = time.perf_counter()
        report["idle"] = await _idle_profile(send, client, setup, measurements, args)
        report["idle_elapsed_s"] = time.perf_counter() - idle_started
    if args.slo_p99_ms is not None:
        report["tail_aware"] = _tail_aware(measurements, levels, setup, args)
    if args.exhaustive:
        cost = Cost(elapsed, len(measurements), sent)
        report["exhaustive"] = await _exhaustive(send, client, setup, doc, table, cost, args)
    return report


async def _profile(send: Send, client: Client, setup: _Setup, args: argparse.Namespace
                   ) -> tuple[list[Measurement], list[dict[str, Any]], int]:
    """Each tuple: switch, a warm-up closed loop, then the timed one; besides μ_i, what the
    server saw of the timed requests (its round trip to the worker, the worker's compute)."""
    bar = _bar(args, len(setup.plan), "profiling (i, intra)")
    measurements: list[Measurement] = []
    server_side: list[dict[str, Any]] = []
    sent = 0
    try:
        for config in setup.plan:
            apply_configuration(client, setup.model, config)
            warm = await _closed(send, config.c, args.warmup, args)
            before = _server_totals(client, setup.model)
            timed = await _closed(send, config.c, args.requests, args)
            seen = _per_batch(before, _server_totals(client, setup.model))
            server_side.append({**_config_doc(config), **seen})
            sent += len(warm.ok) + len(timed.ok)
            measurements.append(_measured(config, warm, timed, seen, args))
            _advance(bar, f"i={config.c} intra={config.intra} "
                          f"mu={measurements[-1].mu:.1f}/s")
    finally:
        _close(bar)
    return measurements, server_side, sent


# Idle gaps the idle-aware profile times at c = 1: from a few round trips to the sparse
# arrivals of a lightly loaded server, where the measured penalty levels off.
IDLE_GAPS_S = (0.002, 0.005, 0.01, 0.02, 0.05)


def _gaps_text() -> str:
    return ", ".join(f"{g * 1e3:g}" for g in IDLE_GAPS_S) + " ms"


async def _idle_profile(send: Send, client: Client, setup: _Setup,
                        measurements: Sequence[Measurement], args: argparse.Namespace
                        ) -> dict[str, Any]:
    """Per thread count: the busy slot time of every profiled i (i + 1 in flight at c = i,
    so a slot starts its next request as it frees) and, at c = 1, spaced runs (each request
    sent a gap after the last answer). ``core/idle_queueing.idle_inputs`` turns them into
    the idle-aware model's inputs; the raw means are kept beside them."""
    intras = sorted({config.intra for config in setup.plan})
    bar = _bar(args, len(setup.plan) + len(intras) * len(IDLE_GAPS_S), "idle profile")
    doc: dict[str, Any] = {}
    try:
        for intra in intras:
            busy = [await _busy_slot(send, client, setup.model, config, args, bar)
                    for config in setup.plan if config.intra == intra]
            apply_configuration(client, setup.model, Config(1, intra))
            spaced = [await _spaced(send, client, setup.model, gap, args, bar)
                      for gap in IDLE_GAPS_S]
            closed = next(m for m in measurements if m.c == 1 and m.intra == intra)
            inputs = idle_inputs(busy, closed.mean_s, closed.overhead_s, spaced)
            doc[str(intra)] = {"busy_slot_s": busy, "spaced": [asdict(run) for run in spaced],
                               **inputs.to_dict()}
    finally:
        _close(bar)
    return doc


async def _busy_slot(send: Send, client: Client, model: str, config: Config,
                     args: argparse.Namespace, bar: Any) -> float:
    apply_configuration(client, model, config)
    await _closed(send, config.c + 1, args.warmup, args)
    before = _server_totals(client, model)
    timed = await _closed(send, config.c + 1, args.idle_requests, args)
    if not timed.ok.all():  # a failure has no service time; leaving it out would flatter
        raise Unavailable(f"profiling {model!r}: {int((~timed.ok).sum())} of "
                          f"{timed.ok.size} back-to-back requests failed at c={config.c}, "
                          f"intra={config.intra} ({dict(timed.errors)})")
    slot = _per_batch(before, _server_totals(client, model))["round_trip_mean_s"]
    _advance(bar, f"busy i={config.c} intra={config.intra}")
    if slot is None:
        raise Unavailable(f"profiling {model!r}: no batches seen at c={config.c}")
    return float(slot)


async def _spaced(send: Send, client: Client, model: str, gap_s: float,
                  args: argparse.Namespace, bar: Any) -> Spaced:
    before = _server_totals(client, model)
    latencies = []
    for i in range(args.idle_requests):
        await asyncio.sleep(gap_s)
        sent = time.perf_counter()
        try:
            await asyncio.wait_for(send(i), args.timeout)
        except Exception as exc:  # say which part failed, not a traceback from the sender
            raise Unavailable(f"profiling {model!r}: a request after a {gap_s * 1e3:g} ms "
                              f"idle gap failed: {type(exc).__name__}: {exc}") from exc
        latencies.append(time.perf_counter() - sent)
    slot = _per_batch(before, _server_totals(client, model))["round_trip_mean_s"]
    _advance(bar, f"idle gap {gap_s * 1e3:g} ms")
    if slot is None:
        raise Unavailable(f"profiling {model!r}: no batches seen after {gap_s * 1e3:g} ms gaps")
    return Spaced(gap_s, float(slot), float(np.mean(latencies)))


async def _closed(send: Send, c: int, requests: int, args: argparse.Namespace) -> LoadResult:
    return await run_closed_loop(send, c, requests=requests, timeout_s=args.timeout)


def _server_totals(client: Client, model: str) -> tuple[int, float, float]:
    """(batches served, summed round trips, summed worker time) over the data replicas."""
    data = [r for r in _model_state(client, model)["replicas"]
            if r.get("pool", "data") == "data"]
    return (sum(int(r["served"]) for r in data), sum(float(r["round_trip_s"]) for r in data),
            sum(float(r["worker_s"]) for r in data))


def _per_batch(before: tuple[int, float, float], after: tuple[int, float, float]
               ) -> dict[str, float | None]:
    batches = after[0] - before[0]
    if batches <= 0:
        return {"batches": 0, "round_trip_mean_s": None, "worker_mean_s": None}
    return {"batches": batches, "round_trip_mean_s": (after[1] - before[1]) / batches,
            "worker_mean_s": (after[2] - before[2]) / batches}


def _measured(config: Config, warm: LoadResult, timed: LoadResult, seen: dict[str, Any],
              args: argparse.Namespace) -> Measurement:
    latencies = [*warm.latencies_s.tolist(), *timed.latencies_s.tolist()]
    ok = [*warm.ok.tolist(), *timed.ok.tolist()]
    slot = None
    if args.service_time == "server":
        if seen["batches"] != len(timed.ok):
            raise ConfigError(
                f"the server ran {seen['batches']} batches for {len(timed.ok)} timed requests "
                f"of {args.model!r}: the server-side service time needs batches of one and no "
                "cache (set batching.max_batch_size: 1), or use --service-time client")
        slot = seen["round_trip_mean_s"]
    try:
        return measure(config, latencies, ok, warmup=len(warm.ok), slot_mean_s=slot)
    except ValueError as exc:
        raise Unavailable(f"profiling {args.model!r}: {exc}") from None


def _row_doc(row: TableRow, overhead: dict[Config, float]) -> dict[str, Any]:
    """One load level: the best configuration and every candidate's predicted mean latency,
    the queue's W plus the configuration's overhead outside it."""
    best, latency = best_with_overhead(row, overhead)
    return {"rate": row.arrival_rate, "best": _config_doc(best),
            "predicted_mean_s": _finite(latency),
            "candidates": [{**_config_doc(ch.config), "predicted_mean_s": _finite(
                ch.prediction.latency + overhead.get(ch.config, 0.0))}
                for ch in row.candidates]}


def _config_doc(config: Config) -> dict[str, int]:
    return {"c": config.c, "intra": config.intra}


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None  # JSON has no infinity


def _tail_aware(measurements: Sequence[Measurement], levels: Sequence[float], setup: _Setup,
                args: argparse.Namespace) -> dict[str, Any]:
    return tail_table(measurements, levels, args.slo_p99_ms / 1e3, cores=setup.cores,
                      oversubscribe=setup.oversubscribe, queries=args.tail_queries,
                      seed=args.seed)


# ---- the exhaustive baseline ---------------------------------------------------------------


async def _exhaustive(send: Send, client: Client, setup: _Setup, doc: ProfileDocument,
                      table: Sequence[TableRow], profiling: Cost,
                      args: argparse.Namespace) -> dict[str, Any]:
    configs = configurations(doc.profiles, cores=setup.cores, oversubscribe=setup.oversubscribe)
    levels = [row.arrival_rate for row in table]
    plan = exhaustive_plan(configs, levels)
    started = time.perf_counter()
    cells, sent = await _measure_cells(send, client, setup, plan, args)
    cost = Cost(time.perf_counter() - started, len(plan), sent)
    best = measured_best(cells)
    extra = overheads(doc.measurements)
    agree = sum(best.get(row.arrival_rate) == best_with_overhead(row, extra)[0]
                for row in table)
    return {"cells": [_cell_doc(cell, table, extra) for cell in cells],
            "measured_best": [{"rate": r, **_config_doc(c)} for r, c in best.items()],
            "agreement": {"levels": len(table), "predicted_best_is_measured_best": agree},
            "cost": {"profiling": _cost_doc(profiling), "exhaustive": _cost_doc(cost),
                     **compare_costs(profiling, cost)}}


async def _measure_cells(send: Send, client: Client, setup: _Setup,
                         plan: Sequence[tuple[Config, float]], args: argparse.Namespace
                         ) -> tuple[list[Cell], int]:
    bar = _bar(args, len(plan), "exhaustive (config, load)")
    cells: list[Cell] = []
    sent, current = 0, None
    try:
        for k, (config, rate) in enumerate(plan):
            if config != current:  # switch, then warm up the new configuration
                apply_configuration(client, setup.model, config)
                sent += len((await run_closed_loop(send, config.c, requests=args.warmup,
                                                   timeout_s=args.timeout)).ok)
                current = config
            schedule = poisson_schedule(rate, args.exhaustive_queries,
                                        np.random.default_rng([args.seed, k]))
            result = await run_open_loop(send, schedule, timeout_s=args.timeout, rate_qps=rate)
            sent += len(result.ok)
            cells.append(_cell(config, rate, result.latencies_s, result.ok))
            _advance(bar, f"c={config.c} intra={config.intra} {rate:.0f}/s")
    finally:
        _close(bar)
    return cells, sent


def _cell(config: Config, rate: float, latencies: np.ndarray, ok: np.ndarray) -> Cell:
    good = latencies[ok]
    p = percentiles(good)
    mean = float(good.mean()) if good.size else math.nan
    return Cell(config, rate, int(good.size), mean, p["p50_ms"] / 1e3, p["p99_ms"] / 1e3,
                p["p999_ms"] / 1e3, int((~ok).sum()))


def _cell_doc(cell: Cell, table: Sequence[TableRow], overhead: dict[Config, float]
              ) -> dict[str, Any]:
    row = next(r for r in table if r.arrival_rate == cell.rate)
    predicted = next(ch.prediction.latency for ch in row.candidates
                     if ch.config == cell.config) + overhead.get(cell.config, 0.0)
    return {**_config_doc(cell.config), "rate": cell.rate, "n": cell.n, "errors": cell.errors,
            "mean_s": _finite(cell.mean_s), "p50_s": _finite(cell.p50_s),
            "p99_s": _finite(cell.p99_s), "p999_s": _finite(cell.p999_s),
            "predicted_mean_s": _finite(predicted)}


def _cost_doc(cost: Cost) -> dict[str, float]:
    return {"seconds": cost.seconds, "runs": cost.runs, "requests": cost.requests}


# ---- output --------------------------------------------------------------------------------


def _bar(args: argparse.Namespace, total: int, label: str) -> Any:
    if args.no_progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=label, unit="run", dynamic_ncols=True)


def _advance(bar: Any, note: str) -> None:
    if bar is not None:
        bar.set_postfix_str(note)
        bar.update()


def _close(bar: Any) -> None:
    if bar is not None:
        bar.close()


def render(report: dict[str, Any]) -> str:
    """The profile, the reference table and (with --exhaustive) the cost comparison."""
    lines = [f"profiled {report['model']}: {report['runs']} runs, {report['requests']} "
             f"requests in {report['elapsed_s']:.1f}s ({report['cores']} cores"
             f"{', oversubscribed' if report['oversubscribe'] else ''}; service time: "
             f"{report['service_time']})", "",
             "   i  intra   service ms     mu /s    p99 ms  overhead ms     n  worker ms"]
    lines += [f"{m['c']:>4} {m['intra']:>6} {m['mean_s'] * 1e3:>12.2f} {m['mu']:>9.1f} "
              f"{m['p99_s'] * 1e3:>9.2f} {m['overhead_s'] * 1e3:>12.2f} {m['n']:>5} "
              f"{_ms(s['worker_mean_s']):>10}"
              for m, s in zip(report["measurements"], report["server_side"], strict=True)]
    lines += ["", "reference table (M/D_interf/c plus overhead, best mean latency per load):",
              "   load /s   best (c, intra)   predicted mean ms"]
    lines += [f"{r['rate']:>10.1f}   ({r['best']['c']}, {r['best']['intra']}){'':>9} "
              f"{_ms(r['predicted_mean_s'])}" for r in report["reference_table"]]
    if "idle" in report:
        lines += ["", *_render_idle(report["idle"])]
    if "tail_aware" in report:
        lines += ["", *_render_tail(report["tail_aware"])]
    if "exhaustive" in report:
        lines += ["", *_render_costs(report["exhaustive"])]
    return "\n".join(lines)


def _render_idle(idle: dict[str, Any]) -> list[str]:
    lines = ["idle penalty (beyond SERF; core/idle_queueing): slot time back to back, and "
             "after each idle gap at c = 1",
             "  intra   busy ms   " + "   ".join(f"{g * 1e3:>4g} ms gap" for g in IDLE_GAPS_S)]
    for intra, doc in idle.items():
        cells = "   ".join(f"{run['slot_s'] * 1e3:>10.2f}" for run in doc["spaced"])
        lines.append(f"  {intra:>5} {doc['busy_slot_s'][0] * 1e3:>9.2f}   {cells}")
    return lines


def _render_tail(tail: dict[str, Any]) -> list[str]:
    lines = [f"tail-aware: cheapest configuration with simulated p99 <= {tail['slo_p99_ms']:g} "
             f"ms ({tail['queries']} simulated queries each):",
             "   load /s   chosen (c, intra)   cores   simulated p99 ms"]
    for row in tail["levels"]:
        chosen = row["chosen"]
        lines.append(f"{row['rate']:>10.1f}   none meets it" if chosen is None else
                     f"{row['rate']:>10.1f}   ({chosen['c']}, {chosen['intra']}){'':>11} "
                     f"{chosen['cores']:>5}   {_ms(chosen['p99_s'])}")
    return lines


def _render_costs(ex: dict[str, Any]) -> list[str]:
    cost, agree = ex["cost"], ex["agreement"]
    rows = [f"{name:<12} {c['seconds']:>9.1f} {c['runs']:>6} {c['requests']:>9}"
            for name, c in (("profiling", cost["profiling"]), ("exhaustive", cost["exhaustive"]))]
    return ["search cost (SERF Table II):", "method         seconds   runs  requests", *rows,
            f"ratio        {cost['time_ratio']:>8.1f}x {cost['runs_ratio']:>5.1f}x "
            f"{cost['requests_ratio']:>8.1f}x",
            f"predicted best = measured best at {agree['predicted_best_is_measured_best']} of "
            f"{agree['levels']} load levels"]


def _ms(seconds: float | None) -> str:
    return "unstable" if seconds is None or not math.isfinite(seconds) else f"{seconds * 1e3:.2f}"
