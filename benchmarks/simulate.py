"""``python -m benchmarks.simulate``: project tail latency to cluster sizes this machine cannot
hold.

The engine is ``parityserve.core.simulate``: a discrete-event model of one model's serving
path that drives the runtime's own decision code (deadline queue, AIMD + delayed batching,
ParM/Berrut groups and decoders, the fault model's bursts) on a simulated clock. This module
is the I/O around it:

* **profile**: time ``load_model(...).predict`` in-process on batches of 1..B rows and store
  the per-size samples as JSON (``simulate-profile-<model>.json``);
* **validate**: compare the simulator's p50/p99 with real-process runs, either read from a
  results JSON (``--validate-real``, e.g. ``benchmarks.tail``'s) or measured here on a small 2-3
  replica deployment with burst faults (``--validate-run``);
* **project**: ParM's cluster sizes (12 deployed + 6 parity, 24 + 12) and 100 and 1,000
  instances, every mode, at rates scaled to the instance count: p50/p99/p99.9.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from benchmarks import _cli
from benchmarks.replica_timing import replica_state, transport_ms_per_task
from benchmarks.report import colours, markdown_table, new_figure, save_figure, write_results
from parityserve.bench.stats import median_and_spread
from parityserve.core.faults import BurstSpec, FaultSpec
from parityserve.core.simulate import MODES, ServiceProfile, SimConfig, simulate
from parityserve.errors import ConfigError, DataError

__all__ = ["add_arguments", "build_parser", "fit_cpu_cost", "load_profile", "main", "profile_model",
           "real_rows", "run", "run_spread", "sim_config", "transport_ms_per_task"]

_MODELS = {
    "mlp": ("zoo:parm-mlp", "parm-mnist-base-mlp.npz", (784,)),
    "resnet20": ("zoo:resnet20", "cifar10-resnet20.npz", (3, 32, 32)),
}
# Deployed (data) replicas per projected size. ParM's k = 2 adds m/2 parity instances, so
# 12 -> 18 and 24 -> 36 instances are the paper's clusters; 66 -> 99 and 666 -> 999 stand
# for 100 and 1,000 instances.
_SIZES = "12,24,66,666"
_PAPER = {12: "ParM: 12 deployed + 6 parity", 24: "ParM: 24 deployed + 12 parity",
          66: "~100 instances", 666: "~1,000 instances"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", choices=sorted(_MODELS), default="mlp",
                   help="which real model's service times to use")
    p.add_argument("--data-dir", type=Path, help="datasets/weights ($PARITYSERVE_DATA)")
    p.add_argument("--profile", type=Path,
                   help="a profile JSON to use (default: <results>/simulate-profile-<model>.json,"
                        " measured now if missing)")
    p.add_argument("--reprofile", action="store_true", help="measure the profile again")
    p.add_argument("--profile-sizes", default="1,2,4,8,16,32,64")
    p.add_argument("--project-clock", choices=("wall", "cpu"), default="cpu",
                   help="service times for projections: the model's CPU time (a dedicated "
                        "core) or wall time on this machine (its contention included)")
    p.add_argument("--validate-clock", choices=("wall", "cpu"), default="wall",
                   help="service times when comparing with real runs on this machine")
    p.add_argument("--profile-repeats", type=int, default=200)
    p.add_argument("--sizes", default=_SIZES, help="deployed replicas per projected cluster")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--load", type=float, default=0.5,
                   help="offered load per deployed replica, as a fraction of one replica's "
                        "batch-1 throughput (1000 / median batch-1 service ms)")
    p.add_argument("--queries", type=int, default=40_000, help="queries per simulated point "
                   "(at least 30 per deployed replica are used)")
    p.add_argument("--warmup", type=float, default=0.1, help="fraction of queries not measured")
    p.add_argument("--burst", default="1000,100,20",
                   help="background bursts on every data replica: every_ms,duration_ms,delay_ms"
                        " ('none' for none)")
    p.add_argument("--slow", type=float, default=0.0,
                   help="also slow replica 0 by this many ms per batch (constant)")
    p.add_argument("--rpc-overhead-ms", type=float, default=None,
                   help="per-task transport cost (default: calibrated, else 0.5)")
    p.add_argument("--frontend-overhead-ms", type=float, default=None,
                   help="per-query HTTP/app cost (default: calibrated, else 0.5)")
    p.add_argument("--overheads-from", type=Path,
                   help="take the calibrated overheads of a simulate-validation.json")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--slo-ms", type=float, default=1000.0,
                   help="application SLO: AIMD's target and the query deadline")
    p.add_argument("--reactive-ms", type=float, default=None,
                   help="reactive re-issue timeout (default: 2x the batch-1 p99 service time)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--validate-real", type=Path, action="append", default=[],
                   help="real-run results JSON (e.g. from benchmarks.tail) to compare with")
    p.add_argument("--validate-run", action="store_true",
                   help="run a small real-process deployment here and compare")
    p.add_argument("--validate-rate", type=float, default=150.0)
    p.add_argument("--calibration-rates", default="150,400,600",
                   help="fault-free `none` runs at these loads (q/s; the validation rate is "
                        "always one) fit the frontend's CPU as background + a marginal cost "
                        "per query: its cost per query falls as load rises")
    p.add_argument("--validate-queries", type=int, default=3000)
    p.add_argument("--validate-modes", default="none,replication,parm")
    p.add_argument("--validate-repeats", type=int, default=3,
                   help="real runs per point; medians are compared, (max-min)/median shown")
    p.add_argument("--host-cores", type=float, default=None,
                   help="cores the validation's processes share (default: this process's "
                        "usable CPUs)")
    p.add_argument("--frontend-task-share", type=float, default=0.4,
                   help="share of the measured frontend CPU per query charged per task "
                        "(receive, settle) rather than per query (HTTP, JSON)")
    p.add_argument("--no-project", action="store_true", help="skip the projections")
    p.add_argument("--results-dir", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--quick", action="store_true",
                   help="small profile, sizes 12 and 24, few queries")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.quick:
        args.profile_repeats = min(args.profile_repeats, 30)
        args.queries = min(args.queries, 6000)
        if args.sizes == _SIZES:
            args.sizes = "12,24"
        args.validate_queries = min(args.validate_queries, 1500)
        args.validate_repeats = 1
    profile = _profile(args, args.project_clock)
    med1 = profile.median_ms(1)
    print(f"profile {profile.model}: batch 1 median {med1:.3f} ms, batch "
          f"{profile.sizes[-1]} median {profile.median_ms(profile.sizes[-1]):.3f} ms", flush=True)
    report: dict[str, Any] = {"model": args.model, "profile": _profile_summary(profile),
                              "settings": _settings(args)}
    calibrated = None
    if args.overheads_from is not None:
        calibrated = orjson.loads(args.overheads_from.read_bytes())["overhead_ms"]
        print(f"overheads from {args.overheads_from}: {calibrated}", flush=True)
    overhead = _overheads(args, calibrated)
    validation: dict[str, Any] | None = None
    if args.validate_run or args.validate_real:
        vprofile = _profile(args, args.validate_clock)
        validation = {"points": [], "profile_clock": args.validate_clock}
        if args.validate_run:
            validation.update(_validate_run(args, vprofile))
            overhead = validation["overhead_ms"]  # measured transport cost, for projections
        for path in args.validate_real:
            doc = orjson.loads(path.read_bytes())
            validation["points"] += _validate_file(path, doc, args, vprofile,
                                                   validation.get("overhead_ms", overhead))
            validation.setdefault("references", {})[path.name] = _measured_on(doc)
        _write_validation(validation, args)
    if not args.no_project:
        report["overhead_ms"] = overhead
        report["projection"] = _project(args, profile, overhead)
        _write_projection(report, args)
    return 0


# ---- profiles ---------------------------------------------------------------------------------
def profile_model(source: str, weights: str | None, item_shape: tuple[int, ...],
                  sizes: Sequence[int], repeats: int, *, data_dir: Path | None = None,
                  seed: int = 0, progress: bool = True) -> dict[str, Any]:
    """Time ``load_model(source).predict`` in this process on batches of each size.

    One thread, as a worker runs by default (``threads_per_replica: 1``). Inputs are random:
    the models' cost does not depend on the values. Sizes are interleaved within each
    repetition so that other load on the machine hits every size alike. Returns the profile
    mapping with wall-clock ``samples_ms`` (what a worker on this machine sees, other
    processes' CPU contention included) and ``cpu_samples_ms`` (the thread's CPU time: the
    model's own cost, what a dedicated core would see).
    """
    from tqdm import tqdm

    from parityserve.models.loader import load_model

    model = load_model(source, weights=weights, data_dir=data_dir, threads=1)
    rng = np.random.default_rng(seed)
    xs = rng.random((max(sizes), *item_shape), dtype=np.float32)
    for b in sizes:
        for _ in range(5):
            model.predict(xs[:b])
    wall: dict[int, list[float]] = {b: [] for b in sizes}
    cpu: dict[int, list[float]] = {b: [] for b in sizes}
    for _ in tqdm(range(repeats), desc=f"profile {source}", unit="round",
                  disable=not progress):
        for b in sizes:
            batch = xs[:b]
            c0, t0 = time.thread_time(), time.perf_counter()
            model.predict(batch)
            wall[b].append((time.perf_counter() - t0) * 1e3)
            cpu[b].append((time.thread_time() - c0) * 1e3)
    meta = {"source": source, "weights": weights, "repeats": repeats, "threads": 1,
            "how": "load_model(...).predict in-process; perf_counter (samples_ms) and "
                   "thread_time (cpu_samples_ms), sizes interleaved"}
    return {"model": source, "meta": meta,
            "samples_ms": {str(b): v for b, v in wall.items()},
            "cpu_samples_ms": {str(b): v for b, v in cpu.items()}}


def _profile_path(args: argparse.Namespace) -> Path:
    return Path(args.profile or args.results_dir / f"simulate-profile-{args.model}.json")


def load_profile(path: Path, clock: str = "wall") -> ServiceProfile:
    """A stored profile; ``clock`` "wall" (samples_ms) or "cpu" (cpu_samples_ms)."""
    key = "cpu_samples_ms" if clock == "cpu" else "samples_ms"
    profile = ServiceProfile.from_mapping(orjson.loads(path.read_bytes()), key)
    return ServiceProfile(profile.model, profile.samples_ms, {**profile.meta, "clock": clock})


def _profile(args: argparse.Namespace, clock: str) -> ServiceProfile:
    path = args.profile or args.results_dir / f"simulate-profile-{args.model}.json"
    if path.exists() and not args.reprofile:
        print(f"using the service-time profile {path} ({clock} clock)", flush=True)
        return load_profile(path, clock)
    source, weights_file, shape = _MODELS[args.model]
    data_dir = _data_dir(args.data_dir)
    weights = str(data_dir / "weights" / weights_file) if data_dir else None
    sizes = [int(s) for s in args.profile_sizes.split(",") if s]
    doc = profile_model(source, weights, shape, sizes, args.profile_repeats,
                        data_dir=data_dir, seed=args.seed)
    from benchmarks.report import command_line, machine_info

    doc["meta"].update(machine=machine_info(), command=command_line())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    print(f"wrote the profile {path}", flush=True)
    args.reprofile = False  # measured once per run
    return load_profile(path, clock)


def _data_dir(explicit: Path | None) -> Path | None:
    from parityserve.models.datasets import resolve_data_dir

    try:
        return resolve_data_dir(explicit)
    except DataError as exc:
        print(f"note: {exc}; profiling with the zoo's published weights", flush=True)
        return None


def _profile_summary(profile: ServiceProfile) -> dict[str, Any]:
    return {"model": profile.model, "meta": {k: v for k, v in profile.meta.items()},
            "median_ms": {b: profile.median_ms(b) for b in profile.sizes},
            "p99_ms": {b: profile.quantile_ms(b, 0.99) for b in profile.sizes}}


# ---- scenarios -----------------------------------------------------------------------------
def _burst(text: str) -> BurstSpec | None:
    if text.strip().lower() in ("", "none", "off"):
        return None
    try:
        every, duration, delay = (float(v) for v in text.split(","))
    except ValueError as exc:
        raise ConfigError(f"--burst wants every_ms,duration_ms,delay_ms, got {text!r}") from exc
    return BurstSpec(every, duration, delay)


def sim_config(mode: str, deployed: int, *, burst: BurstSpec | None, slow_ms: float = 0.0,
               rpc_ms: float = 0.0, frontend_ms: float = 0.0, max_batch: int = 64,
               slo_ms: float = 1000.0, reactive_ms: float = 20.0, matched: bool = True,
               seeds: Sequence[int] | None = None, query_cpu_ms: float = 0.0,
               task_cpu_ms: float = 0.0, host_cores: float = 0.0,
               worker_cpu_ms: float = 0.0, client_cpu_ms: float = 0.0) -> SimConfig:
    """The simulated deployment of ``mode`` with ``deployed`` data replicas.

    ``matched``: every mode but ``none`` runs as many instances as ParM (k = 2) does, m + m/2:
    equal-resources adds m/2 plain replicas, the others spread over m + m/2 replicas.
    """
    extra = -(-deployed // 2)
    replicas = deployed + extra if matched and mode not in ("none", "parm",
                                                            "equal-resources") else deployed
    faults: dict[str, FaultSpec] = {}
    n_data = replicas + (extra if mode == "equal-resources" else 0)
    if burst is not None or slow_ms > 0:
        for i in range(n_data):
            seed = None if seeds is None else seeds[i % len(seeds)]
            delay = slow_ms if i == 0 else 0.0
            faults[str(i)] = FaultSpec(delay_ms=delay, burst=burst, seed=seed)
    kw: dict[str, Any] = {}
    if mode == "replication":
        kw["d"] = 2
    elif mode == "reactive":
        kw["reactive_timeout_s"] = reactive_ms / 1000
    elif mode == "parm":
        kw["k"], kw["r"] = 2, 1
    elif mode in ("berrut", "systematic-berrut"):
        kw["K"], kw["S"] = 2, 1
    return SimConfig(mode=mode, replicas=replicas, extra=extra, max_batch_size=max_batch,
                     slo_s=slo_ms / 1000, faults=faults, rpc_overhead_s=rpc_ms / 1000,
                     frontend_query_cpu_s=query_cpu_ms / 1000,
                     frontend_task_cpu_s=task_cpu_ms / 1000,
                     host_cores=host_cores, worker_task_cpu_s=worker_cpu_ms / 1000,
                     client_query_cpu_s=client_cpu_ms / 1000,
                     frontend_overhead_s=frontend_ms / 1000, **kw)


def _overheads(args: argparse.Namespace, calibrated: Mapping[str, float] | None
               ) -> dict[str, float]:
    base = dict(calibrated or {"rpc": 0.5, "frontend": 0.5})
    if args.rpc_overhead_ms is not None:
        base["rpc"] = args.rpc_overhead_ms
    if args.frontend_overhead_ms is not None:
        base["frontend"] = args.frontend_overhead_ms
    return base


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("project_clock", "sizes", "modes", "load", "queries", "warmup", "burst", "slow",
            "max_batch", "slo_ms", "reactive_ms", "seed", "quick")
    return {k: getattr(args, k) for k in keys}


def _one(config: SimConfig, profile: ServiceProfile, rate: float, n: int, seed: int,
         warmup: float) -> dict[str, Any]:
    rng = np.random.default_rng([seed, 1])
    arrivals = np.cumsum(rng.exponential(1.0 / rate, size=n))
    t0 = time.perf_counter()
    result = simulate(config, profile, arrivals, np.random.default_rng([seed, 2]),
                      warmup=int(n * warmup))
    s = result.summary()
    s["wall_s"] = time.perf_counter() - t0
    s["simulated_s"] = float(arrivals[-1])
    return s


# ---- projection -------------------------------------------------------------------------------
def _project(args: argparse.Namespace, profile: ServiceProfile,
             overhead: Mapping[str, float]) -> list[dict[str, Any]]:
    from tqdm import tqdm

    sizes = [int(s) for s in args.sizes.split(",") if s]
    modes = [m for m in args.modes.split(",") if m]
    per_replica = args.load * 1000.0 / (profile.median_ms(1) + overhead["rpc"])
    reactive_ms = args.reactive_ms or 2 * (profile.quantile_ms(1, 0.99) + overhead["rpc"])
    burst = _burst(args.burst)
    rows: list[dict[str, Any]] = []
    bar = tqdm([(m, mode) for m in sizes for mode in modes], desc="simulate", unit="point")
    for m, mode in bar:
        bar.set_postfix_str(f"{m} deployed, {mode}")
        cfg = sim_config(mode, m, burst=burst, slow_ms=args.slow, rpc_ms=overhead["rpc"],
                         frontend_ms=overhead["frontend"] + overhead.get("query_cpu", 0.0)
                         + overhead.get("task_cpu", 0.0), max_batch=args.max_batch,
                         slo_ms=args.slo_ms, reactive_ms=reactive_ms)
        rate = per_replica * m
        n = max(args.queries, 30 * m)
        s = _one(cfg, profile, rate, n, args.seed, args.warmup)
        tasks_per_query = s["counters"]["batches"] / n
        cores = rate * (overhead.get("query_cpu", 0.0)
                        + overhead.get("task_cpu", 0.0) * tasks_per_query) / 1000
        rows.append({"deployed": m, "cluster": _PAPER.get(m, f"{m} deployed"), "mode": mode,
                     "frontend_cores": cores if cores > 0 else None,
                     "instances": cfg.instances(), "rate_qps": rate, **s,
                     "mean_batch": s["counters"]["rows"] / max(1, s["counters"]["batches"]),
                     "util_data": s["utilisation"].get("data", math.nan),
                     "decoded": sum(v for k, v in s["answered"].items()
                                    if k not in ("direct", "expired", "late", "rejected")),
                     "defaults": sum(s["answered"].get(k, 0) for k in ("expired", "late",
                                                                      "rejected"))})
    return rows


_PROJ_COLS = [("cluster", "cluster", "s"), ("mode", "mode", "s"),
              ("instances", "instances", "d"), ("rate_qps", "rate q/s", ".0f"),
              ("p50_ms", "p50 ms", ".2f"), ("p99_ms", "p99 ms", ".2f"),
              ("p999_ms", "p99.9 ms", ".2f"), ("mean_batch", "mean batch", ".1f"),
              ("util_data", "data util", ".2f"), ("decoded", "decoded", "d"),
              ("defaults", "defaults", "d"), ("frontend_cores", "frontend cores", ".1f"),
              ("n", "measured", "d")]

_TRUST = """\
## Where the projection stops being trustworthy

- **The frontend is not modelled.** One asyncio process forms every batch, runs every
  encoder/decoder and serialises every request. The simulator charges a fixed
  `frontend_overhead` per query and `rpc_overhead` per task and gives the frontend infinite
  CPU. Measured here, the real frontend serves a few thousand queries/s per core; the
  1,000-instance point offers far more than that, so it describes a sharded frontend, not this
  one. Read the 100/1,000-instance rows as "the coding and queueing policy at that scale".
- **One queue.** The runtime has one deadline queue per model and pumps idle replicas in a
  Python loop (O(replicas) per event). At hundreds of replicas the pump itself costs more
  than a small model's batch; the simulator charges nothing for it.
- **Network.** Transport is a constant per task, calibrated on loopback. A real cluster adds
  per-hop latency, its own tail and correlated stalls (a top-of-rack switch), and the
  encoders' extra bytes (parity queries) are free here.
- **Bursts are independent per replica.** Each data replica draws its own burst timeline from
  `core/faults.py`'s model; correlated slow-downs (a shared host, GC pauses in the frontend)
  would hurt coded modes more than this shows. Parity replicas run fault-free, as the runtime
  launches them.
- **Profile coverage.** Service times are i.i.d. draws from one worker profiled alone on this
  machine; batch sizes past the largest profiled size are extrapolated linearly. Contention
  between co-located workers (this machine has few cores) is in the real runs but not in
  the profile unless it was measured under the same contention.
- **Not modelled at all:** crashes, hangs, heartbeats and restarts, the response cache,
  Byzantine outputs (decoders see exact stand-in outputs, so E > 0 never locates anything).
- **Simulated time per point is short at 1,000 instances** (at least 30 queries per
  deployed replica, a fraction of a second of simulated time): bursts with a mean gap of a
  second are sampled across replicas rather than over time. Each replica's burst timeline
  starts ten mean cycles before t = 0, so every run begins in the stationary state.
- **AIMD in the Berrut mode** observes coded tasks as batches of one (they answer no query
  directly), so its limit stays at 2 and groups hold at most 2K queries: a property of the
  runtime the simulator inherits, not a simulator artefact.
"""


def _write_projection(report: dict[str, Any], args: argparse.Namespace) -> None:
    rows = report["projection"]
    s = report["settings"]
    o = report["overhead_ms"]
    intro = (f"Model: {report['profile']['model']} (profile medians, ms: "
             + ", ".join(f"b={b}: {v:.3f}" for b, v in report["profile"]["median_ms"].items())
             + f"). Load {s['load']:g} of one replica's batch-1 throughput per deployed replica;"
             f" background bursts `{s['burst']}` (every_ms,duration_ms,delay_ms) on every data "
             f"replica; overheads: rpc {o['rpc']:.3f} ms/task, frontend {o['frontend']:.3f} "
             f"ms/query; SLO {s['slo_ms']:g} ms; AIMD ceiling {s['max_batch']}.\n\n"
             "Modes other than `none` run as many instances as ParM (k = 2): m + m/2. "
             "replication d = 2, reactive re-issue after the timeout in the JSON, berrut and "
             "systematic-berrut K = 2, S = 1. The frontend is unlimited here (its measured "
             "CPU cost per query and per task is added as latency only); `frontend cores` is "
             "the CPU the runtime's single asyncio frontend would need at that rate: above 1 "
             "it saturates and the row describes a sharded frontend, not this one.")
    md = "\n\n".join([intro, markdown_table(rows, _PROJ_COLS), _TRUST])
    paths = write_results("simulate", report, results_dir=args.results_dir, markdown=md)
    plot = _plot_projection(rows, args.results_dir / "simulate-projection.png")
    print(markdown_table(rows, _PROJ_COLS))
    print(f"\nwrote {paths['json']}, {paths['md']} and {plot}")


def _plot_projection(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    fig, ax = new_figure()
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    for colour, mode in zip(colours(len(modes)), modes, strict=True):
        pts = sorted((r["deployed"], r["p99_ms"], r["p999_ms"]) for r in rows
                     if r["mode"] == mode)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "-o", color=colour, label=f"{mode}",
                markersize=3)
        ax.plot([p[0] for p in pts], [p[2] for p in pts], ":", color=colour)
    ax.legend(fontsize="small", title="p99 solid, p99.9 dotted")
    ax.set(xscale="log", yscale="log", ylabel="latency (ms)",
           xlabel="deployed instances m (redundant modes run m + m/2 in all)",
           title="Simulated tail latency vs cluster size (rate scaled with instances)")
    return save_figure(fig, ax, path)


# ---- validation ------------------------------------------------------------------------------
def real_rows(doc: Any) -> Iterator[dict[str, Any]]:
    """Every record of a results JSON that has p50_ms and p99_ms and names a mode.

    Known keys: ``mode`` (or ``redundancy``/``system``), ``rate``/``offered_qps``,
    ``replicas``, ``burst`` ({every_ms, duration_ms, delay_ms}) or ``faults``; missing ones
    are taken from the flags.
    """
    return _dicts_where(doc, _is_real_row)


def _is_real_row(doc: Mapping[str, Any]) -> bool:
    if "p50_ms" not in doc or "p99_ms" not in doc:
        return False
    mode = doc.get("mode") or doc.get("redundancy") or doc.get("system")
    if isinstance(mode, Mapping):
        mode = mode.get("mode")
    return isinstance(mode, str) and mode.split("(")[0] in MODES


def _dicts_where(doc: Any, match: Callable[[Mapping[str, Any]], bool]
                 ) -> Iterator[dict[str, Any]]:
    """Every dict in a JSON document that ``match`` accepts, outermost first; the inside of
    a matching dict is not searched."""
    if isinstance(doc, Mapping):
        if match(doc):
            yield dict(doc)
            return
        for value in doc.values():
            yield from _dicts_where(value, match)
    elif isinstance(doc, list):
        for value in doc:
            yield from _dicts_where(value, match)


def _validate_file(path: Path, doc: Any, args: argparse.Namespace, profile: ServiceProfile,
                   overhead: Mapping[str, float]) -> list[dict[str, Any]]:
    """Validation rows for the stored report ``doc``, read from ``path``."""
    tails = list(_tail_models(doc))
    if tails:
        return [row for model in tails
                for row in _validate_tail(path, model, args, overhead)]
    out = []
    for row in real_rows(doc):
        mode = str(row.get("mode") or row.get("redundancy") or row.get("system")).split("(")[0]
        rate = float(row.get("rate") or row.get("offered_qps") or args.validate_rate)
        replicas = int(row.get("replicas") or 2)
        burst = row.get("burst")
        spec = BurstSpec.from_mapping(burst) if isinstance(burst, Mapping) else _burst(args.burst)
        cfg = sim_config(mode, replicas, burst=spec, rpc_ms=overhead["rpc"],
                         frontend_ms=overhead["frontend"], max_batch=args.max_batch,
                         slo_ms=args.slo_ms, matched=False,
                         query_cpu_ms=overhead.get("query_cpu", 0.0),
                         task_cpu_ms=overhead.get("task_cpu", 0.0),
                         reactive_ms=float(row.get("timeout_ms") or args.reactive_ms or 20.0))
        n = int(row.get("n") or row.get("ok") or args.validate_queries)
        sim = _one(cfg, profile, rate, max(n, 2000), args.seed, 0.0)
        out.append(_compare(f"{path.name}", mode, replicas, rate, row, sim))
    if not out:
        print(f"note: no rows with mode, p50_ms and p99_ms found in {path}", flush=True)
    return out


def _measured_on(doc: Any) -> str | None:
    """When a stored real run was measured (its report's machine date): the simulator is
    calibrated now, and this VM's speed drifts between sessions."""
    machine = (doc.get("machine") if isinstance(doc, Mapping) else None) or {}
    return machine.get("date") if isinstance(machine, Mapping) else None


def _tail_models(doc: Any) -> Iterator[dict[str, Any]]:
    """``benchmarks.tail``'s per-model sections: dicts with points, cases and a burst model."""
    return _dicts_where(doc, lambda d: {"points", "cases", "burst"} <= set(d))


def _validate_tail(path: Path, model: Mapping[str, Any], args: argparse.Namespace,
                   overhead: Mapping[str, float]) -> list[dict[str, Any]]:
    """Simulate each point of a ``benchmarks.tail`` run: its deployments (cases), rates and its
    random-pair burst timeline, drawn by ``bench.tail``'s own helpers."""
    from benchmarks.tail import pair_burst_events

    source = str(model.get("source", ""))
    name = next((k for k, v in _MODELS.items() if v[0] == source), args.model)
    profile = _profile(argparse.Namespace(**{**vars(args), "model": name, "profile": None}),
                       args.validate_clock)
    cases = {c["name"]: c for c in model["cases"]}
    burst = model["burst"]
    n = int(model.get("queries_per_point") or args.validate_queries)
    out = []
    for point in model["points"]:
        case = cases.get(point.get("case"))
        if case is None or case["mode"] not in MODES:
            continue
        rate = float(point["rate"])
        sims = []
        for rep in range(3):
            horizon = n / rate * 1.5 + 5.0
            events = pair_burst_events(int(burst["cluster_slots"]), float(burst["every_ms"]),
                                       horizon, np.random.default_rng([args.seed, 99, rep]))
            windows: dict[int, list[tuple[float, float, float]]] = {}
            for start, pair in events:
                for slot in set(pair):
                    windows.setdefault(slot, []).append(
                        (start, start + float(burst["duration_ms"]) / 1000,
                         float(burst["delay_ms"]) / 1000))
            cfg = _tail_config(case, int(model.get("max_batch") or 1), overhead, windows)
            sims.append(_one(cfg, profile, rate, max(n, 2000), args.seed + rep, 0.0))
        sim = {k: float(np.median([s[k] for s in sims])) for k in ("p50_ms", "p99_ms")}
        out.append({**_compare(f"{path.name} {case['name']}", case["mode"],
                               int(case["instances"]), rate, point, sim), "case": case["name"]})
    return out


def _tail_config(case: Mapping[str, Any], max_batch: int, overhead: Mapping[str, float],
                 windows: Mapping[int, Sequence[tuple[float, float, float]]]) -> SimConfig:
    red = dict(case.get("redundancy") or {})
    parity = dict(case.get("parity") or {})
    kw: dict[str, Any] = {}
    if case["mode"] == "equal-resources":
        kw["extra"] = int(red.get("extra", 1))
    elif case["mode"] == "replication":
        kw["d"] = int(red.get("d", 2))
    elif case["mode"] == "reactive":
        kw["reactive_timeout_s"] = float(red.get("timeout_ms", 20.0)) / 1000
    elif case["mode"] == "parm":
        kw.update(k=int(parity.get("k", 2)), r=int(parity.get("r", 1)),
                  parity_replicas_per_model=parity.get("replicas"))
    elif case["mode"] in ("berrut", "systematic-berrut"):
        kw.update(K=int(red.get("K", 2)), S=int(red.get("S", 1)), E=int(red.get("E", 0)),
                  workers=red.get("workers"))
    return SimConfig(mode=case["mode"], replicas=int(case["replicas"]),
                     max_batch_size=max_batch, slo_s=60.0,
                     rpc_overhead_s=overhead["rpc"] / 1000,
                     frontend_overhead_s=overhead["frontend"] / 1000,
                     frontend_query_cpu_s=overhead.get("query_cpu", 0.0) / 1000,
                     frontend_task_cpu_s=overhead.get("task_cpu", 0.0) / 1000,
                     host_cores=float(overhead.get("host_cores", 0.0)),
                     worker_task_cpu_s=overhead.get("worker_cpu", 0.0) / 1000,
                     client_query_cpu_s=overhead.get("client_cpu", 0.0) / 1000,
                     delay_windows=windows, **kw)


def _compare(source: str, mode: str, replicas: int, rate: float, real: Mapping[str, Any],
             sim: Mapping[str, Any]) -> dict[str, Any]:
    row = {"source": source, "mode": mode, "replicas": replicas, "rate": rate,
           "real_p50_ms": float(real["p50_ms"]), "real_p99_ms": float(real["p99_ms"]),
           "sim_p50_ms": sim["p50_ms"], "sim_p99_ms": sim["p99_ms"]}
    row["p50_error"] = row["sim_p50_ms"] / row["real_p50_ms"] - 1
    row["p99_error"] = row["sim_p99_ms"] / row["real_p99_ms"] - 1
    for q in ("p50", "p99"):
        spread = real.get(f"{q}_spread", run_spread(real.get(f"{q}_ms_runs")))
        if spread is not None:
            row[f"real_{q}_spread"] = spread
    row["within_10pct"] = abs(row["p50_error"]) <= 0.10 and abs(row["p99_error"]) <= 0.10
    print(f"  {mode:<18} real p50 {row['real_p50_ms']:7.2f} p99 {row['real_p99_ms']:7.2f} | "
          f"sim p50 {row['sim_p50_ms']:7.2f} p99 {row['sim_p99_ms']:7.2f} | "
          f"err {row['p50_error']:+.0%} / {row['p99_error']:+.0%}", flush=True)
    return row


def run_spread(runs: Sequence[float] | None) -> float | None:
    """(max - min) / median over a point's repeated runs; None with fewer than two."""
    if not runs or len(runs) < 2:
        return None
    median, low, high = median_and_spread(runs)
    return (high - low) / median


def fit_cpu_cost(rates: Sequence[float], ms_per_query: Sequence[float]) -> dict[str, float]:
    """The frontend's CPU, measured at several loads, as ``background_ms_per_s`` (spent
    whatever the load) plus ``per_query_ms`` (each further query): a least-squares line
    through CPU-ms per second against the rate.

    Why: measured at one low rate, CPU per query carries what a busy frontend shares between
    queries (an idle event loop woken for each one, cold caches, heartbeats). Charged per
    query at four times that rate, it saturated a simulated frontend that the real one never
    saturated. A negative intercept (noise) is not a background: the line is then refitted
    through the origin. One distinct rate cannot split the two: all of it counts per query.
    """
    if len(rates) != len(ms_per_query) or not rates:
        raise ValueError("need one CPU measurement per rate, and at least one")
    r = np.asarray(rates, dtype=float)
    per_s = r * np.asarray(ms_per_query, dtype=float)
    if np.any(r <= 0) or not np.all(np.isfinite(per_s)) or np.any(per_s < 0):
        raise ValueError("rates must be positive and CPU costs finite and non-negative")
    if len(set(r.tolist())) < 2:
        return {"background_ms_per_s": 0.0, "per_query_ms": float(np.mean(ms_per_query))}
    slope, intercept = np.polyfit(r, per_s, 1)
    if intercept < 0 or slope <= 0:
        slope, intercept = float(np.dot(r, per_s) / np.dot(r, r)), 0.0
    return {"background_ms_per_s": float(intercept), "per_query_ms": float(slope)}


_VALIDATION_BURST = "400,60,15"
_VALIDATION_SEEDS = (11, 12, 13, 14, 15)


def _validate_run(args: argparse.Namespace, profile: ServiceProfile) -> dict[str, Any]:
    """Real processes: 2 deployed replicas (3 instances for ParM and the resource-matched
    modes) of the model with burst faults, open-loop Poisson load; then the simulator on the
    same deployment, rate and burst model.

    Calibration, on fault-free ``none`` runs only (``_calibrate``): the frontend's CPU per
    query, its transport per task and the latency outside any queue. The burst runs are the
    validation.
    """
    modes = [m for m in args.validate_modes.split(",") if m]
    burst = _burst(_VALIDATION_BURST)
    rate, n = args.validate_rate, args.validate_queries
    sim_n = max(n, 4000)
    print(f"\n== validation: real processes, {rate:g} q/s, {n} queries per mode ==", flush=True)

    def real_runs(mode: str, fault: BurstSpec | None, at: float, reactive_ms: float = 20.0
                  ) -> dict[str, Any]:
        runs = [_real_run(args, mode, fault, at, n, reactive_ms=reactive_ms, rep=i)
                for i in range(args.validate_repeats)]
        return _median_run(runs)

    calibs = {at: real_runs("none", None, at) for at in _calibration_rates(args)}
    overhead, cal_sim = _calibrate(args, profile, calibs, rate, sim_n)
    points = [{**_compare("calibration (no faults)", "none", 2, at, calibs[at], sim),
               "calibration": True, "real": calibs[at]} for at, sim in cal_sim.items()]
    reactive_ms = args.reactive_ms or 2 * (profile.quantile_ms(1, 0.99) + overhead["rpc"])
    for mode in modes:
        real = real_runs(mode, burst, rate, reactive_ms)
        cfg = _overhead_config(mode, overhead, args, burst, _VALIDATION_SEEDS, reactive_ms)
        sims = [_one(cfg, profile, rate, sim_n, args.seed + s, 0.0) for s in range(3)]
        sim = {k: float(np.median([s[k] for s in sims])) for k in ("p50_ms", "p99_ms")}
        points.append({**_compare("validate-run (bursts)", mode, cfg.instances(), rate, real,
                                  sim),
                       "real": real, "burst": _VALIDATION_BURST,
                       "sim_runs": [{k: s[k] for k in ("p50_ms", "p99_ms", "p999_ms")}
                                    for s in sims]})
    return {"points": points, "overhead_ms": overhead, "rate": rate, "queries": n,
            "burst": _VALIDATION_BURST}


def _calibration_rates(args: argparse.Namespace) -> list[float]:
    extra = [float(v) for v in str(args.calibration_rates).split(",") if v.strip()]
    if any(r <= 0 for r in extra):
        raise ConfigError(f"--calibration-rates must be positive q/s, got {args.calibration_rates}")
    return sorted({args.validate_rate, *extra})


def _median_run(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repeated real runs, the spread of p50 and p99 ((max - min) / median)."""
    keys = ("p50_ms", "p99_ms", "p999_ms", "frontend_cpu_ms_per_query",
            "worker_cpu_ms_per_query", "client_cpu_ms_per_query", "transport_ms_per_task")
    out: dict[str, Any] = {k: float(np.median(values)) for k in keys
                           if (values := [r[k] for r in runs if r.get(k) is not None])}
    for k in ("p50_ms", "p99_ms"):
        spread = run_spread([r[k] for r in runs])
        out[f"{k.removesuffix('_ms')}_spread"] = 0.0 if spread is None else spread  # one run
    out["runs"] = list(runs)
    return out


def _calibrate(args: argparse.Namespace, profile: ServiceProfile,
               calibs: Mapping[float, Mapping[str, Any]], rate: float, sim_n: int
               ) -> tuple[dict[str, Any], dict[float, dict[str, Any]]]:
    """The simulator's overheads from fault-free real runs at several loads.

    - **Frontend CPU**: the marginal cost per query of a line fitted through the frontend's
      CPU at every calibration rate (``fit_cpu_cost``), ``--frontend-task-share`` of it per
      task and the rest per query.
    - **Transport per task** (``rpc``): what each task held its replica beyond the worker's
      own time, from the runtime's per-replica sums at the validation rate. Earlier this was
      the whole p50 residual, which charged the client's and HTTP's time as replica time and
      saturated the simulated replicas at loads the real ones served.
    - **Latency outside any queue** (``frontend``: client, kernel, HTTP): what remains of the
      real p50 over the simulated one at the validation rate.
    - Workers' CPU beyond ``predict`` per task, and the cores every process shares.
    """
    rates = sorted(calibs)
    fit = fit_cpu_cost(rates, [calibs[r]["frontend_cpu_ms_per_query"] for r in rates])
    calib = calibs[rate]
    cpu, share = fit["per_query_ms"], args.frontend_task_share
    model_cpu = load_profile(_profile_path(args), "cpu").median_ms(1)
    transport = calib.get("transport_ms_per_task")
    overhead: dict[str, Any] = {
        "rpc": float(transport) if transport is not None else 0.0, "frontend": 0.0,
        "query_cpu": cpu * (1 - share), "task_cpu": cpu * share,
        "worker_cpu": max(0.0, calib["worker_cpu_ms_per_query"] - model_cpu),
        "client_cpu": float(calib.get("client_cpu_ms_per_query", 0.0)),
        "host_cores": args.host_cores if args.host_cores is not None else float(_usable_cpus()),
        "cpu_fit": fit, "calibration_rates": rates}
    bare = _one(_overhead_config("none", overhead, args, None, None), profile, rate, sim_n,
                args.seed, 0.0)
    overhead["frontend"] = max(0.0, calib["p50_ms"] - bare["p50_ms"])
    print(f"calibration (no faults, {', '.join(f'{r:g}' for r in rates)} q/s): frontend CPU "
          f"{fit['per_query_ms']:.3f} ms/query + {fit['background_ms_per_s']:.1f} ms/s "
          f"background; transport {overhead['rpc']:.3f} ms/task; workers' CPU beyond predict "
          f"{overhead['worker_cpu']:.3f} ms/task; the load generator "
          f"{overhead['client_cpu']:.3f} ms/query; {overhead['host_cores']:g} shared cores; "
          f"latency outside queues {overhead['frontend']:.3f} ms/query", flush=True)
    sims = {r: _one(_overhead_config("none", overhead, args, None, None), profile, r, sim_n,
                    args.seed, 0.0) for r in rates}
    return overhead, sims


def _overhead_config(mode: str, overhead: Mapping[str, Any], args: argparse.Namespace,
                     fault: BurstSpec | None, seeds: Sequence[int] | None,
                     reactive_ms: float = 20.0) -> SimConfig:
    """The validation deployment of ``mode`` with every calibrated overhead."""
    return sim_config(mode, 2, burst=fault, rpc_ms=overhead["rpc"],
                      frontend_ms=overhead["frontend"], max_batch=args.max_batch,
                      slo_ms=args.slo_ms, matched=True, reactive_ms=reactive_ms, seeds=seeds,
                      query_cpu_ms=overhead["query_cpu"], task_cpu_ms=overhead["task_cpu"],
                      host_cores=overhead.get("host_cores", 0.0),
                      worker_cpu_ms=overhead.get("worker_cpu", 0.0),
                      client_cpu_ms=overhead.get("client_cpu", 0.0))


def _real_run(args: argparse.Namespace, mode: str, burst: BurstSpec | None, rate: float,
              n: int, *, reactive_ms: float = 20.0, rep: int = 0) -> dict[str, Any]:
    from parityserve.bench.loadgen import (
        HttpSender,
        encode_bodies,
        json_sender,
        poisson_schedule,
        run_event_loop,
        run_open_loop,
    )
    from parityserve.bench.serverproc import ServerProcess, write_config

    source, weights_file, shape = _MODELS[args.model]
    data_dir = _data_dir(args.data_dir)
    cfg = sim_config(mode, 2, burst=burst, matched=True, reactive_ms=reactive_ms)
    deployment: dict[str, Any] = {"name": "sim", "source": source, "replicas": 2,
                                  "batching": {"max_batch_size": args.max_batch}}
    if data_dir is not None:
        deployment["weights"] = str(data_dir / "weights" / weights_file)
    if mode == "parm":
        deployment["parity"] = {"k": 2}
    elif mode != "none":
        deployment["replicas"] = cfg.replicas
        red: dict[str, Any] = {"mode": mode}
        if mode == "reactive":
            red["timeout_ms"] = reactive_ms
        if mode == "equal-resources":
            red["extra"] = 1
            deployment["replicas"] = 2
        if mode in ("berrut", "systematic-berrut"):
            red.update(K=2, S=1)
        deployment["redundancy"] = red
    if burst is not None:
        deployment["faults"] = {str(i): {"burst": {"every_ms": burst.every_ms,
                                                   "duration_ms": burst.duration_ms,
                                                   "delay_ms": burst.delay_ms},
                                         "seed": _VALIDATION_SEEDS[i % len(_VALIDATION_SEEDS)]}
                                for i in range(cfg.data_replicas())}
    # 512 connections from loopback, one address: past the default per-address cap (256)
    config = {"server": {"http_port": 0, "cache_bytes": 0,
                         "limits": {"max_connections_per_address": 1024}},
              "models": [deployment],
              "applications": [{"name": "sim", "models": ["sim"], "slo_ms": args.slo_ms,
                                "default_output": -1}]}
    path = write_config(config, args.results_dir / ".work" / f"simulate-{mode}.yaml")
    xs = np.random.default_rng(args.seed).random((500, *shape), dtype=np.float32)
    bodies = encode_bodies(list(xs))

    async def go(pid: int, cpu: list[float], replicas: list[Any]) -> Any:
        async with HttpSender(server.url, limit=512) as http:
            send = json_sender(http, "/sim/predict", bodies)
            for i in range(200):  # warm up AIMD and the connections
                await send(i)
            schedule = poisson_schedule(rate, n, np.random.default_rng([args.seed, 7, rep]))
            replicas.append(replica_state(server.url, "sim"))
            cpu[0], cpu[2] = _cpu_seconds(pid), _children_cpu_seconds(pid)
            cpu[4] = time.process_time()  # this process: the load generator
            result = await run_open_loop(send, schedule, progress=f"real {mode} {rate:g} q/s",
                                         timeout_s=60)
            cpu[1], cpu[3] = _cpu_seconds(pid), _children_cpu_seconds(pid)
            cpu[5] = time.process_time()
            replicas.append(replica_state(server.url, "sim"))
            return result

    with ServerProcess(path, data_dir=data_dir) as server:
        assert server.proc is not None
        cpu = [0.0] * 6
        snapshots: list[Any] = []
        result = run_event_loop(go(server.proc.pid, cpu, snapshots))
    s = result.summary()
    s["rate"] = rate
    s["frontend_cpu_ms_per_query"] = (cpu[1] - cpu[0]) * 1e3 / n
    s["worker_cpu_ms_per_query"] = (cpu[3] - cpu[2]) * 1e3 / n  # all workers together
    s["client_cpu_ms_per_query"] = (cpu[5] - cpu[4]) * 1e3 / n
    s["transport_ms_per_task"] = transport_ms_per_task(*snapshots)
    answers = [r for r in result.results if isinstance(r, dict)]
    s["reconstructed"] = sum(1 for r in answers if r.get("reconstructed"))
    s["defaults"] = sum(1 for r in answers if r.get("default"))
    print(f"  real {mode:<16} p50 {s['p50_ms']:.2f} ms p99 {s['p99_ms']:.2f} ms, "
          f"send lag p99 {s['send_lag_p99_ms']:.2f} ms, rebuilt {s['reconstructed']}", flush=True)
    return s


def _children_cpu_seconds(pid: int) -> float:
    """CPU time of every live descendant of ``pid`` (the worker processes)."""
    total, todo = 0.0, [pid]
    while todo:
        parent = todo.pop()
        try:
            kids = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except OSError:
            continue
        for kid in kids:
            todo.append(int(kid))
            with contextlib.suppress(OSError, IndexError, ValueError):
                total += _cpu_seconds(int(kid))
    return total


def _usable_cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process (its own threads, not its children)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_VAL_COLS = [("source", "run", "s"), ("mode", "mode", "s"), ("replicas", "instances", "d"),
             ("rate", "q/s", ".0f"), ("real_p50_ms", "real p50", ".2f"),
             ("sim_p50_ms", "sim p50", ".2f"), ("p50_error", "p50 err", "+.1%"),
             ("real_p99_ms", "real p99", ".2f"), ("sim_p99_ms", "sim p99", ".2f"),
             ("p99_error", "p99 err", "+.1%"), ("within_10pct", "within 10%", ""),
             ("real_p50_spread", "real p50 spread", ".0%"),
             ("real_p99_spread", "real p99 spread", ".0%")]


def _references_note(validation: Mapping[str, Any]) -> str:
    refs = validation.get("references") or {}
    if not refs:
        return ""
    when = ", ".join(f"`{name}` on {date or 'an unknown date'}" for name, date in refs.items())
    return (f" The stored real runs were measured in other sessions ({when}); the calibration "
            f"in this one. A difference in the machine's speed between sessions shows up "
            f"as simulator error.")


def _write_validation(validation: dict[str, Any], args: argparse.Namespace) -> None:
    pts = [p for p in validation["points"] if not p.get("calibration")]
    ok = sum(bool(p["within_10pct"]) for p in pts)
    p50 = sum(abs(p["p50_error"]) <= 0.1 for p in pts)
    p99 = sum(abs(p["p99_error"]) <= 0.1 for p in pts)
    verdict = (f"{ok} of {len(pts)} validation points have p50 and p99 within 10% of the real "
               f"run (p50 alone: {p50} of {len(pts)}, p99 alone: {p99} of {len(pts)})")
    validation["verdict"] = verdict
    md = (f"Simulator vs real processes. {verdict}. The calibration rows (fault-free `none`, "
          "one per calibration rate) fitted the frontend's CPU per query, the transport per "
          "task and the latency outside any queue, and are not validation points. Real "
          "figures are medians over repeated runs; `spread` is (max - min) / median "
          "over those runs: where it exceeds 10%, this machine cannot check a 10% target."
          + _references_note(validation) + "\n\n"
          + markdown_table(validation["points"], _VAL_COLS))
    paths = write_results("simulate-validation", validation, results_dir=args.results_dir,
                          markdown=md)
    print(f"\n{verdict}\nwrote {paths['json']} and {paths['md']}", flush=True)

# ---- python -m benchmarks.simulate ---------------------------------------------------------------

DESCRIPTION = ("A discrete-event simulator of the serving path that drives the runtime's "
               "own decision code (deadline queue, AIMD batching, ParM/Berrut groups and "
               "decoders, burst faults) on a simulated clock, with service times profiled "
               "from a real worker. Validates p50/p99 against real-process runs and "
               "projects p50/p99/p99.9 per mode to ParM's cluster sizes (12+6, 24+12) "
               "and to 100 and 1,000 instances.")
EXAMPLES = (
    ('python -m benchmarks.simulate --quick',
     'small profile, sizes 12 and 24, few queries'),
    ('python -m benchmarks.simulate --model mlp --no-project --validate-run '
     '--validate-real benchmarks/results/tail-mlp.json',
     'validate against real runs (13 min)'),
    ('python -m benchmarks.simulate --overheads-from '
     'benchmarks/results/simulate-validation.json --queries 20000',
     'the projections (2 min)'),
)


def build_parser() -> argparse.ArgumentParser:
    return _cli.build_parser("simulate", DESCRIPTION, _cli.examples(EXAMPLES), add_arguments)


def main(argv: Sequence[str] | None = None) -> int:
    return _cli.main(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
