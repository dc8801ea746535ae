"""``python -m benchmarks.sim_testbed``: the SIMULATOR held to the emulated-accelerator testbed.

``benchmarks.parm_testbed`` measures ParM section 6 on emulated accelerators: real frontend,
queues, coding, ZeroMQ transport and fault injection, around workers that sleep for a
service time drawn from a profile. Its CPU is not the bottleneck, so it is where the
discrete-event simulator (``parityserve.core.simulate``, which drives the runtime's own
scheduler) can be checked without the 2-core machine's contention in the way. This module:

* **replays every measured run** of a testbed JSON in the simulator: the same deployment
  (case), the same emulated service-time distribution (``ServiceProfile.from_emulation``),
  the same Poisson arrivals and the same background-shuffle timeline (both are drawn from
  the run's own seed with ``parm_testbed``'s own helpers, so the simulator sees the very
  arrival times and shuffle windows the testbed played), then compares p50 and p99, median
  over repetitions as the testbed reports them, at every point below the knee;
* **calibrates one thing, on one point**: what the testbed adds that the profile does not
  see. The frontend's CPU per query is the testbed's own measurement (a FIFO server ahead of
  the queue, ``frontend_query_cpu_s``); what remains of ``none``'s p50 at the lowest rate
  over the simulator's is latency outside any queue (HTTP, the client, the ZeroMQ hops, the
  sleeping worker's timer): ``frontend_overhead_s``. That p50 is the fit and is not counted
  as a validation;
* **projects** to 100 and 1,000 instances with N sharded frontends: each frontend owns
  instances / N instances and serves rate / N (coding groups never span shards), and its CPU
  per query is the testbed's. It says where the projection stops holding.

Every number is simulated, on an EMULATED-accelerator profile; the measured side is the
testbed's.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from benchmarks import _cli
from benchmarks.parm_testbed import (
    run_seed,
    shuffle_distribution,
    shuffle_events,
    shuffle_horizon_s,
    shuffle_transitions,
    testbed_cases,
)
from benchmarks.replica_timing import replica_state, transport_ms_per_task, worker_hold_ms
from benchmarks.report import colours, markdown_table, new_figure, save_figure, write_results
from benchmarks.tail import Checkpoint, settings_key
from parityserve.bench.loadgen import poisson_schedule
from parityserve.core.emulation import profile_named
from parityserve.core.simulate import ServiceProfile, SimConfig, simulate

__all__ = [
    "Overheads",
    "compare_point",
    "default_testbed",
    "frontends_needed",
    "knee_reason",
    "main",
    "projection_limit",
    "replica_overhead_ms",
    "run",
    "shard_plan",
    "sim_config",
    "steal_free_line",
    "testbed_inputs",
    "verdict",
    "windows_from_transitions",
]

FULL, QUICK = "parm-testbed.json", "parm-testbed-quick.json"
IDLE = "sim-testbed-idle.json"
TARGET = 0.10  # issue 21: p50 and p99 within 10% at every point below the knee
KNEE_THROUGHPUT = 0.95  # below: the point did not keep up with its offered load
KNEE_P50 = 2.0  # above this many idle p50s: the median is queueing, not service
FRONTEND_UTIL_MAX = 0.7  # a frontend shard planned to stay below this CPU utilisation
PROJECT_TOTALS = (100, 1000)


# ---- pure rules ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Overheads:
    """What the testbed adds around the profile's service time, per query (milliseconds).

    ``cpu_ms``: the frontend's CPU (a FIFO server ahead of the deadline queue, so it queues
    under load, and it is what sharding divides); ``latency_ms``: time outside any queue;
    ``rpc_ms``: per task, holding its replica (transport)."""

    cpu_ms: float = 0.0
    latency_ms: float = 0.0
    rpc_ms: float = 0.0


def default_testbed(results_dir: Path) -> Path:
    """The full testbed's JSON if it exists, else the quick one's."""
    full = results_dir / FULL
    return full if full.exists() else results_dir / QUICK


def windows_from_transitions(transitions: Sequence[tuple[float, int, bool]], delay_s: float
                             ) -> dict[int, list[tuple[float, float, float]]]:
    """``parm_testbed.shuffle_transitions``' (time, slot, on) switches as the simulator's
    delay windows: per slot, (start, end, delay) while the slot is in a shuffle. A window
    left open at the end lasts for ever, as the injector leaves it on until the run ends."""
    opened: dict[int, float] = {}
    out: dict[int, list[tuple[float, float, float]]] = {}
    for t, slot, on in sorted(transitions, key=lambda x: (x[0], not x[2], x[1])):
        if on:
            opened.setdefault(slot, t)
        elif slot in opened:
            out.setdefault(slot, []).append((opened.pop(slot), t, delay_s))
    for slot, start in opened.items():
        out.setdefault(slot, []).append((start, math.inf, delay_s))
    return out


def testbed_inputs(testbed: Mapping[str, Any], instances: int, rate: float, rep: int
                   ) -> tuple[np.ndarray, dict[int, list[tuple[float, float, float]]]]:
    """The arrival times and shuffle windows one testbed run played: drawn, as
    ``parm_testbed`` drew them, from the run's own seed."""
    seed = run_seed(int(testbed["seed"]), rep, rate)
    queries = int(testbed["queries_per_point"])
    arrivals = poisson_schedule(rate, queries, np.random.default_rng(seed))
    sh = testbed["shuffle"]
    events = shuffle_events(int(sh["cluster_slots"]), int(sh["concurrent"]),
                            shuffle_horizon_s(queries, rate), float(sh["gbps"]),
                            np.random.default_rng(seed))
    windows = windows_from_transitions(shuffle_transitions(events, instances),
                                       float(sh["delay_ms"]) / 1000)
    return arrivals, windows


def sim_config(case: Mapping[str, Any], reactive_ms: float, overheads: Overheads,
               windows: Mapping[int, Sequence[tuple[float, float, float]]], *,
               replicas: int | None = None,
               shuffle: Mapping[str, Any] | None = None) -> SimConfig:
    """The simulated deployment of a testbed case (``parm_testbed.testbed_cases``' fields),
    batch size 1, the testbed's 60-s SLO; ``replicas`` overrides its data replicas (the
    projection's shards), the extra and parity instances scaled alike. ``shuffle`` (the
    testbed's settings) says how a window's slowdown is drawn: constant, or per batch."""
    red, parity = dict(case.get("redundancy") or {}), dict(case.get("parity") or {})
    m = int(case["replicas"])
    scale = (replicas / m) if replicas else 1.0
    kw: dict[str, Any] = {}
    mode = str(case["mode"])
    if mode == "equal-resources":
        kw["extra"] = max(1, round(int(red.get("extra", 1)) * scale))
    elif mode == "replication":
        kw["d"] = int(red.get("d", 2))
    elif mode == "reactive":
        kw["reactive_timeout_s"] = float(red.get("timeout_ms", reactive_ms)) / 1000
    elif mode == "parm":
        kw.update(k=int(parity.get("k", 2)), r=int(parity.get("r", 1)),
                  parity_replicas_per_model=max(1, round(int(parity.get("replicas") or 1)
                                                         * scale)))
    elif mode in ("berrut", "systematic-berrut"):
        kw.update(K=int(red.get("K", 2)), S=int(red.get("S", 1)), E=int(red.get("E", 0)),
                  workers=red.get("workers"),
                  berrut_group_wait_s=float(red.get("group_wait_ms", 0.0)) / 1000)
    if shuffle is not None:  # a tail index is recorded only where it applies (pareto)
        kw["window_distribution"] = shuffle_distribution(shuffle)
        if "tail_index" in shuffle:
            kw["window_tail_index"] = float(shuffle["tail_index"])
    return SimConfig(mode=mode, replicas=max(1, round(m * scale)), max_batch_size=1,
                     slo_s=60.0, delay_windows=windows,
                     frontend_query_cpu_s=overheads.cpu_ms / 1000,
                     frontend_overhead_s=overheads.latency_ms / 1000,
                     rpc_overhead_s=overheads.rpc_ms / 1000, **kw)


def knee_reason(point: Mapping[str, Any], idle_p50_ms: float) -> str | None:
    """Why a measured point is past its case's knee, or None when it is below it: it served
    under ``KNEE_THROUGHPUT`` of its offered load, or its median is more than ``KNEE_P50``
    idle medians (queueing, not service, sets it)."""
    offered = float(point.get("offered_qps") or point["rate"])
    served = float(point.get("throughput_qps") or offered)
    if served < KNEE_THROUGHPUT * offered:
        return f"served {served:.0f} of {offered:.0f} q/s"
    if float(point["p50_ms"]) > KNEE_P50 * idle_p50_ms:
        return f"p50 {float(point['p50_ms']):.0f} ms > {KNEE_P50:g}x idle {idle_p50_ms:.0f} ms"
    return None


def compare_point(point: Mapping[str, Any], sims: Sequence[Mapping[str, Any]],
                  past_knee: str | None, calibration: bool = False) -> dict[str, Any]:
    """One table row: measured p50/p99 (medians over repetitions, as the testbed reports
    them) beside the simulator's (median over the same repetitions' replays), the error
    sim / measured - 1, and whether it counts toward the target."""
    row: dict[str, Any] = {"case": point["case"], "mode": point["mode"],
                           "instances": int(point["instances"]), "rate": float(point["rate"]),
                           "measured_n": int(point["n"]),
                           "sim_n": int(sum(int(s["n"]) for s in sims)),
                           "repeats": len(sims), "past_knee": past_knee,
                           "calibration": calibration}
    for q in ("p50", "p99", "p999"):
        row[f"measured_{q}_ms"] = float(point[f"{q}_ms"])
        row[f"sim_{q}_ms"] = float(np.median([float(s[f"{q}_ms"]) for s in sims]))
        row[f"{q}_error"] = row[f"sim_{q}_ms"] / row[f"measured_{q}_ms"] - 1
    row["within"] = abs(row["p50_error"]) <= TARGET and abs(row["p99_error"]) <= TARGET
    row["counted"] = past_knee is None
    row.update(_steal_free_errors(point, row))
    return row


def _steal_free_errors(point: Mapping[str, Any], row: Mapping[str, Any]) -> dict[str, Any]:
    """The simulator against the answers that met no hypervisor steal (a diagnostic: the
    simulator has no host that stops every process at once); empty where the testbed did not
    measure steal."""
    if point.get("clean_p99_ms") is None or point.get("clean_p50_ms") is None:
        return {}
    out: dict[str, Any] = {"steal_share": point.get("steal_share"),
                           "clean_share": point.get("clean_share")}
    for q in ("p50", "p99"):
        out[f"clean_{q}_ms"] = float(point[f"clean_{q}_ms"])
        out[f"clean_{q}_error"] = row[f"sim_{q}_ms"] / out[f"clean_{q}_ms"] - 1
    out["clean_within"] = (abs(out["clean_p50_error"]) <= TARGET
                           and abs(out["clean_p99_error"]) <= TARGET)
    return out


def steal_free_line(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """How many points below the knee the simulator matches on the steal-free answers."""
    counted = [r for r in rows if r["counted"] and "clean_within" in r]
    if not counted:
        return None
    ok = [r for r in counted if r["clean_within"]]
    worst = max(counted, key=lambda r: max(abs(r["clean_p50_error"]), abs(r["clean_p99_error"])))
    return (f"Diagnostic, not the target: against the answers that met no hypervisor steal, "
            f"{len(ok)} of {len(counted)} points are within {TARGET:.0%} at p50 and p99 "
            f"(worst {worst['case']}: p50 {worst['clean_p50_error']:+.1%}, p99 "
            f"{worst['clean_p99_error']:+.1%}).")


def verdict(rows: Sequence[Mapping[str, Any]]) -> str:
    """The target, met or missed, over the points below the knee (the calibration point's
    p50 is the fit, so only its p99 is judged)."""
    counted = [r for r in rows if r["counted"]]
    if not counted:
        return "No measured point is below the knee: nothing to validate."
    ok_p50 = [r for r in counted if r["calibration"] or abs(r["p50_error"]) <= TARGET]
    ok_p99 = [r for r in counted if abs(r["p99_error"]) <= TARGET]
    both = [r for r in counted if r in ok_p50 and r in ok_p99]
    worst = max(counted, key=lambda r: max(abs(r["p99_error"]),
                                           0.0 if r["calibration"] else abs(r["p50_error"])))
    met = "met" if len(both) == len(counted) else "missed"
    return (f"Target (p50 and p99 within {TARGET:.0%} at every point below the knee): "
            f"**{met}**: {len(both)} of {len(counted)} points (p50: {len(ok_p50)}, p99: "
            f"{len(ok_p99)}); worst {worst['case']} at {worst['rate']:g} q/s (p50 "
            f"{worst['p50_error']:+.1%}, p99 {worst['p99_error']:+.1%}).")


def frontends_needed(rate: float, cpu_ms_per_query: float,
                     max_util: float = FRONTEND_UTIL_MAX) -> int:
    """The fewest frontend shards, each one core, that keep every shard's CPU utilisation
    (rate / N x CPU per query) at or below ``max_util``."""
    if rate <= 0 or cpu_ms_per_query <= 0:
        return 1
    return max(1, math.ceil(rate * cpu_ms_per_query / 1000 / max_util))


def shard_plan(total: int, deployed: int, instances: int, n_frontends: int
               ) -> tuple[int, float]:
    """For ``total`` instances of a mode that runs ``instances`` per ``deployed`` data
    replicas, split over ``n_frontends`` shards: (data replicas per shard, the share of the
    total load each shard serves)."""
    if n_frontends < 1 or total < 1:
        raise ValueError("need at least one frontend and one instance")
    per_shard = total * deployed / instances / n_frontends
    return max(1, round(per_shard)), 1.0 / n_frontends


def projection_limit(frontend_util: float, measured_util_max: float,
                     shard_replicas: int, measured_replicas: int) -> str | None:
    """Why a projected point is outside what the testbed validated, or None: its frontend
    would run busier than any measured testbed point (the FIFO CPU model and the per-query
    cost are then extrapolated; at 1 it saturates), or one frontend would schedule far more
    instances than the testbed's (its per-query CPU was measured at that size only; the
    runtime's pump walks every replica)."""
    reasons = []
    if frontend_util >= 1:
        reasons.append(f"frontend saturated ({frontend_util:.1f} cores needed)")
    elif frontend_util > max(FRONTEND_UTIL_MAX, 2 * measured_util_max):
        reasons.append(f"frontend {frontend_util:.0%} busy, measured up to "
                       f"{measured_util_max:.0%}")
    if shard_replicas > 4 * measured_replicas:
        reasons.append(f"{shard_replicas} data replicas per frontend, measured "
                       f"{measured_replicas}")
    return "; ".join(reasons) or None


# ---- replaying the testbed --------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--testbed", type=Path,
                   help=f"a benchmarks.parm_testbed results JSON (default: RESULTS_DIR/{FULL} "
                        f"if present, else RESULTS_DIR/{QUICK})")
    p.add_argument("--sim-seeds", type=int, default=1,
                   help="service-time draws per replayed run (each a separate simulation)")
    p.add_argument("--cpu-ms", type=float, default=None,
                   help="frontend CPU per query, ms (default: each point's measured "
                        "frontend_cpu_us)")
    p.add_argument("--latency-ms", type=float, default=None,
                   help="latency outside any queue, ms (default: calibrated on none's p50 at "
                        "the lowest rate)")
    p.add_argument("--rpc-ms", type=float, default=None,
                   help="per-task transport that holds a replica, ms (default: the idle "
                        "point's; without one 0: the testbed JSON cannot tell it apart from "
                        "latency)")
    p.add_argument("--idle", type=Path,
                   help="the testbed's idle point (default RESULTS_DIR/sim-testbed-idle.json): "
                        "calibrates the overheads on a run no validation point is; without "
                        "one, none's p50 at the lowest rate is the fit")
    p.add_argument("--measure-idle", action="store_true",
                   help="measure the idle point now (a real server: `none` on 12 emulated "
                        "instances, no shuffles, --idle-rate for --idle-queries; about 2 min)")
    p.add_argument("--idle-rate", type=float, default=20.0)
    p.add_argument("--idle-queries", type=int, default=1000)
    p.add_argument("--data-dir", type=Path, help="datasets/weights, for --measure-idle")
    p.add_argument("--totals", default=",".join(map(str, PROJECT_TOTALS)),
                   help="projected cluster sizes, in instances")
    p.add_argument("--project-queries", type=int, default=20_000,
                   help="queries per projected shard")
    p.add_argument("--no-project", action="store_true", help="validation only")
    p.add_argument("--results-dir", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--quick", action="store_true",
                   help="one repetition per point, 4,000 queries per projected shard: checks "
                        "the tool in a few minutes; not a result to quote")
    p.add_argument("--resume", action="store_true",
                   help="reuse the simulations an interrupted run with the same settings saved")
    p.set_defaults(func=run, calibrated_on_idle=False, idle_timer_ms=0.0)


def run(args: argparse.Namespace) -> int:
    path = args.testbed or default_testbed(args.results_dir)
    if not path.exists():
        raise SystemExit(f"no testbed results at {path}: run python -m benchmarks.parm_testbed "
                         "(--quick) first, or give --testbed")
    testbed = orjson.loads(path.read_bytes())
    if args.quick:
        args.project_queries = min(args.project_queries, 4000)
    emulated = profile_named(str(testbed["profile"]))
    profile = ServiceProfile.from_emulation(emulated, 1)
    repeats = 1 if args.quick else int(testbed["repeats"])
    name = "sim-testbed-quick" if args.quick else "sim-testbed"
    print(f"== SIMULATOR vs {path} ({testbed['label']})", flush=True)
    started = time.monotonic()
    idle_path = args.idle or args.results_dir / IDLE
    if args.measure_idle:
        _write_idle(measure_idle(testbed, args), idle_path)
    idle = orjson.loads(idle_path.read_bytes()) if idle_path.exists() else None
    if idle is not None and idle.get("profile") != testbed["profile"]:
        print(f"note: {idle_path} measured profile {idle.get('profile')!r}, not "
              f"{testbed['profile']!r}: not used", flush=True)
        idle = None
    base = _calibrate_idle(testbed, idle, profile, args) if idle else _calibrate(
        testbed, profile, args)
    fingerprint = {"testbed": str(path), "testbed_date": _date(testbed),
                   "queries": testbed["queries_per_point"], "seed": testbed["seed"],
                   "shuffle": testbed["shuffle"], "overheads": base.__dict__,
                   "cpu_ms": args.cpu_ms, "sim_seeds": args.sim_seeds,
                   "overheads_from": "each run's own", "idle_timer_ms": args.idle_timer_ms}
    saved = Checkpoint(args.results_dir / "sim-testbed-runs" /
                       f"{name}-{settings_key(fingerprint)}.jsonl", fingerprint,
                       resume=args.resume)
    rows = _validate(testbed, profile, base, repeats, saved, args)
    report: dict[str, Any] = {
        "label": f"SIMULATED vs EMULATED testbed: {testbed['label']}",
        "testbed": str(path), "testbed_date": _date(testbed),
        "testbed_quick": bool(testbed.get("quick")), "repeats": repeats,
        "overheads_ms": base.__dict__, "cpu_ms": args.cpu_ms, "rpc_ms": args.rpc_ms,
        "rows": rows,
        "idle": idle, "calibrated_on": "idle point" if idle else "none at the lowest rate",
        "verdict": verdict(rows), "quick": args.quick, "run_file": str(saved.path)}
    print(report["verdict"], flush=True)
    if not args.no_project:
        report["projection"] = _project(testbed, profile, base, args, saved)
        report["project_per_replica_qps"] = max(float(p["rate"]) for p in testbed["points"])
    report["wall_s"] = time.monotonic() - started
    _write(name, report, args)
    return 0


def _date(testbed: Mapping[str, Any]) -> str | None:
    machine = testbed.get("machine") or {}
    return machine.get("date") if isinstance(machine, Mapping) else None


def _cases(testbed: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(c["name"]): dict(c) for c in testbed["cases"]}


def none_case(testbed: Mapping[str, Any]) -> dict[str, Any]:
    """The testbed's ``none`` deployment, which the idle point runs: its own when it ran
    one, else the one ``parm_testbed`` would have run at its size (a run of, say,
    equal-resources and ParM alone is still calibrated on the same idle point)."""
    ran = _cases(testbed).get("none")
    if ran is not None:
        return ran
    (case,) = testbed_cases(["none"], [2], int(testbed["deployed"]),
                            float(testbed["reactive_ms"]))
    return dict(case.__dict__)


def _point_cpu_ms(point: Mapping[str, Any], args: argparse.Namespace) -> float:
    if args.cpu_ms is not None:
        return float(args.cpu_ms)
    return float(point.get("frontend_cpu_us") or 0.0) / 1000


def _run_value(point: Mapping[str, Any], key: str, rep: int) -> float | None:
    """Repetition ``rep``'s own ``key`` (None where that run did not record it), or the
    point's value for a testbed JSON that kept no per-run overheads (before 2026-11-27)."""
    runs = point.get("run_overheads")
    if isinstance(runs, list):
        value = next((r.get(key) for r in runs if r.get("rep") == rep), None)
    else:
        value = point.get(key)
    return None if value is None else float(value)


def replayed_reps(point: Mapping[str, Any], repeats: int) -> list[int]:
    """The repetitions of a point to replay, by their numbers (a run file may lack one),
    at most ``repeats`` of them."""
    runs = point.get("run_overheads")
    reps = ([int(r["rep"]) for r in runs if r.get("rep") is not None]
            if isinstance(runs, list) else list(range(int(point["repeats"]))))
    return reps[:repeats]


def _own_transport_ms(point: Mapping[str, Any], args: argparse.Namespace,
                      rep: int | None) -> float | None:
    """The transport per task a run (``rep``; None: the point's median) recorded, where the
    replay takes it: calibrated on an idle point (which gives the timer to add) and no
    ``--rpc-ms``; None otherwise, or where the run recorded none (before 2026-11-27)."""
    if args.rpc_ms is not None or not args.calibrated_on_idle:
        return None
    if rep is None:
        value = point.get("transport_ms_per_task")
        return None if value is None else float(value)
    return _run_value(point, "transport_ms_per_task", rep)


def point_rpc_ms(point: Mapping[str, Any], base: Overheads, args: argparse.Namespace,
                 rep: int | None = None) -> float:
    """What holds a replica per task at a measured point: the transport the testbed
    measured there (it grows with the frontend's load: an answer waits for the event loop)
    plus what the idle point measured beyond it (the sleeping worker's timer), or the idle
    point's whole figure where ``_own_transport_ms`` has none."""
    transport = _own_transport_ms(point, args, rep)
    return base.rpc_ms if transport is None else transport + args.idle_timer_ms


def run_overheads(point: Mapping[str, Any], rep: int, base: Overheads,
                  args: argparse.Namespace) -> Overheads:
    """The overheads one measured repetition ran under: its own frontend CPU per query and
    transport per task where the testbed recorded them, the calibrated latency outside any
    queue."""
    own = None if args.cpu_ms is not None else _run_value(point, "frontend_cpu_us", rep)
    cpu = own / 1000 if own is not None else _point_cpu_ms(point, args)
    return Overheads(cpu, base.latency_ms, point_rpc_ms(point, base, args, rep))


def own_transport(point: Mapping[str, Any], rep: int, args: argparse.Namespace) -> bool:
    """Whether the replay of ``rep`` holds a replica for that run's own measured transport
    (else for the idle point's, or ``--rpc-ms``)."""
    return _own_transport_ms(point, args, rep) is not None


def _replay(testbed: Mapping[str, Any], case: Mapping[str, Any], rate: float, rep: int,
            profile: ServiceProfile, overheads: Overheads, sim_seed: int) -> dict[str, Any]:
    """One testbed run replayed in the simulator: its arrivals, its shuffles."""
    arrivals, windows = testbed_inputs(testbed, int(case["instances"]), rate, rep)
    config = sim_config(case, float(testbed["reactive_ms"]), overheads, windows,
                        shuffle=testbed["shuffle"])
    result = simulate(config, profile, arrivals,
                      np.random.default_rng([int(testbed["seed"]), rep, int(rate), sim_seed]))
    s = result.summary()
    return {k: s[k] for k in ("n", "p50_ms", "p90_ms", "p99_ms", "p999_ms", "mean_ms")} | {
        "utilisation": s["utilisation"], "answered": s["answered"]}


def _calibrate(testbed: Mapping[str, Any], profile: ServiceProfile,
               args: argparse.Namespace) -> Overheads:
    """Latency outside any queue: ``none``'s measured p50 at the lowest rate over the
    simulator's (its measured frontend CPU included), over the same runs."""
    points = [p for p in testbed["points"] if p["case"] == "none"]
    if args.latency_ms is not None or not points:
        latency = float(args.latency_ms or 0.0)
        return Overheads(cpu_ms=float(args.cpu_ms or 0.0), latency_ms=latency,
                         rpc_ms=args.rpc_ms or 0.0)
    point = min(points, key=lambda p: float(p["rate"]))
    cpu = _point_cpu_ms(point, args)
    bare = Overheads(cpu_ms=cpu, rpc_ms=args.rpc_ms or 0.0)
    case = _cases(testbed)["none"]
    reps = 1 if args.quick else int(point["repeats"])
    sims = [_replay(testbed, case, float(point["rate"]), rep, profile, bare, 0)
            for rep in range(reps)]
    latency = max(0.0, float(point["p50_ms"]) - float(np.median([s["p50_ms"] for s in sims])))
    print(f"calibration on none at {float(point['rate']):g} q/s: measured p50 "
          f"{float(point['p50_ms']):.2f} ms, simulated {np.median([s['p50_ms'] for s in sims]):.2f}"
          f" ms with {cpu:.3f} ms frontend CPU per query: {latency:.3f} ms outside any queue",
          flush=True)
    return Overheads(cpu_ms=cpu, latency_ms=latency, rpc_ms=args.rpc_ms or 0.0)


def _calibrate_idle(testbed: Mapping[str, Any], idle: Mapping[str, Any],
                    profile: ServiceProfile, args: argparse.Namespace) -> Overheads:
    """The overheads from the idle point: transport per task and frontend CPU as measured
    there, and what remains of its p50 over the simulator's as latency outside any queue."""
    args.calibrated_on_idle, args.idle_timer_ms = True, idle_timer_ms(idle)
    rpc = replica_overhead_ms(idle) if args.rpc_ms is None else args.rpc_ms
    # CPU per query as the loaded points measure it: at the idle rate the frontend's fixed
    # work (every worker's heartbeats) is shared by few queries and inflates it.
    nones = [p for p in testbed["points"] if p["case"] == "none"]
    cpu = _point_cpu_ms(min(nones, key=lambda p: float(p["rate"])), args) if nones else (
        float(idle["frontend_cpu_us"]) / 1000 if args.cpu_ms is None else args.cpu_ms)
    if args.latency_ms is not None:
        return Overheads(cpu, args.latency_ms, rpc)
    rate, n = float(idle["rate"]), int(idle["n"])
    arrivals = poisson_schedule(rate, n, np.random.default_rng(run_seed(int(testbed["seed"]),
                                                                        0, rate)))
    case = none_case(testbed)
    config = sim_config(case, float(testbed["reactive_ms"]), Overheads(cpu, 0.0, rpc), {})
    sim = simulate(config, profile, arrivals, np.random.default_rng([0, 1])).summary()
    latency = max(0.0, float(idle["p50_ms"]) - float(sim["p50_ms"]))
    print(f"calibration on the idle point ({rate:g} q/s, {n} queries): measured p50 "
          f"{float(idle['p50_ms']):.2f} ms, simulated {sim['p50_ms']:.2f} ms with {cpu:.3f} ms "
          f"frontend CPU and {rpc:.3f} ms holding a replica per task: {latency:.3f} ms outside any "
          "queue", flush=True)
    return Overheads(cpu, latency, rpc)


def replica_overhead_ms(idle: Mapping[str, Any]) -> float:
    """What holds a replica per task beyond the drawn service time, from the idle point:
    the transport (the frontend's round trip beyond the worker's own hold) plus the worker's
    hold beyond the profile's mean (``idle_timer_ms``)."""
    return float(idle.get("transport_ms_per_task") or 0.0) + idle_timer_ms(idle)


def idle_timer_ms(idle: Mapping[str, Any]) -> float:
    """The idle point's worker hold beyond the profile's mean: the sleeping worker's timer
    overshoot, its real compute where it outlasts the draw. Only the idle point shows it:
    a loaded point's hold also carries the shuffles' injected delays."""
    hold, mean = idle.get("worker_hold_ms"), float(idle.get("profile_mean_ms") or 0.0)
    return max(0.0, float(hold) - mean) if hold is not None else 0.0


def measure_idle(testbed: Mapping[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The testbed's ``none`` deployment, lightly loaded and without shuffles: its p50 is
    the service time plus what the system adds; ``/admin/state``'s per-replica sums split
    that into transport per task (round trip beyond the worker's hold) and the worker's
    hold beyond the drawn service time (the sleeping worker's timer)."""
    from benchmarks.parm_testbed import testbed_config
    from benchmarks.tail import Case
    from parityserve.bench.loadgen import (
        encode_bodies,
        run_event_loop,
        run_open_loop,
        warmed_json_sender,
    )
    from parityserve.bench.serverproc import ServerProcess, write_config
    from parityserve.models.datasets import load_mnist, resolve_data_dir

    case = Case(**none_case(testbed))
    data_dir = resolve_data_dir(args.data_dir)
    x, _ = load_mnist("test", data_dir=data_dir)
    bodies = encode_bodies(list(x[::10][:1000]))
    config = testbed_config(case, str(testbed["profile"]), int(testbed["seed"]))
    path = write_config(config, args.results_dir / ".work" / "sim-testbed-idle.yaml")
    rate, n = args.idle_rate, args.idle_queries
    schedule = poisson_schedule(rate, n, np.random.default_rng(
        run_seed(int(testbed["seed"]), 0, rate)))
    with ServerProcess(path, data_dir=data_dir) as server:
        if server.proc is None:
            raise RuntimeError("the server is not running")
        pid = server.proc.pid

        async def go() -> tuple[Any, list[Any], float]:
            from benchmarks.parm_testbed import _cpu_s

            async with warmed_json_sender(server.url, "/bench/predict", bodies, warmup=100,
                                          limit=64) as send:
                before, cpu0 = replica_state(server.url, "bench"), _cpu_s(pid)
                result = await run_open_loop(send, schedule, progress=f"idle {rate:g} q/s",
                                             rate_qps=rate, timeout_s=60)
                return result, [before, replica_state(server.url, "bench")], _cpu_s(pid) - cpu0

        result, (before, after), cpu_s = run_event_loop(go())
    s = result.summary()
    held = worker_hold_ms(before, after)
    return {"profile": testbed["profile"], "rate": rate, "n": n, "p50_ms": s["p50_ms"],
            "p99_ms": s["p99_ms"], "p999_ms": s["p999_ms"], "mean_ms": s["mean_ms"],
            "errors": sum(s["errors"].values()),
            "frontend_cpu_us": cpu_s / max(1, s["ok"]) * 1e6,
            "transport_ms_per_task": transport_ms_per_task(before, after),
            "worker_hold_ms": held,
            "profile_mean_ms": profile_named(str(testbed["profile"])).mean_ms(1)}


def _write_idle(idle: Mapping[str, Any], path: Path) -> None:
    from benchmarks.report import command_line, machine_info

    doc = {**idle, "command": command_line(), "machine": machine_info()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    print(f"idle point: p50 {idle['p50_ms']:.2f} ms, p99 {idle['p99_ms']:.2f} ms, frontend "
          f"CPU {idle['frontend_cpu_us']:.0f} us/query, transport "
          f"{idle['transport_ms_per_task']} ms/task, worker hold {idle['worker_hold_ms']} ms "
          f"(profile mean {idle['profile_mean_ms']:.2f} ms); wrote {path}", flush=True)


def _validate(testbed: Mapping[str, Any], profile: ServiceProfile, base: Overheads,
              repeats: int, saved: Checkpoint, args: argparse.Namespace
              ) -> list[dict[str, Any]]:
    from tqdm import tqdm

    cases = _cases(testbed)
    idle = profile.median_ms(1) + base.cpu_ms + base.latency_ms
    low = min(float(p["rate"]) for p in testbed["points"])
    rows = []
    bar = tqdm(testbed["points"], desc="replay", unit="point")
    for point in bar:
        case, rate = cases[str(point["case"])], float(point["rate"])
        bar.set_postfix_str(f"{case['name']} {rate:g} q/s")
        sims, reps = [], replayed_reps(point, repeats)
        for rep in reps:
            overheads = run_overheads(point, rep, base, args)
            for s in range(args.sim_seeds):
                key = rep * args.sim_seeds + s
                found = saved.get(case["name"], rate, key)
                if found is None:
                    found = {"case": case["name"], "rate": rate,
                             **_replay(testbed, case, rate, rep, profile, overheads, s)}
                    saved.put(found, key)
                sims.append(found)
        calibration = (case["name"] == "none" and rate == low and args.latency_ms is None
                       and not args.calibrated_on_idle)
        row = compare_point(point, sims, knee_reason(point, idle), calibration)
        row["cpu_ms"] = _point_cpu_ms(point, args)
        row["rpc_ms"] = point_rpc_ms(point, base, args)
        row["replayed_runs"] = len(reps)
        row["own_transport_runs"] = sum(own_transport(point, rep, args) for rep in reps)
        rows.append(row)
        tqdm.write(f"  {row['case']:<20} {rate:5.0f} q/s  measured p50 "
                   f"{row['measured_p50_ms']:7.2f} p99 {row['measured_p99_ms']:7.2f} | sim "
                   f"{row['sim_p50_ms']:7.2f} {row['sim_p99_ms']:7.2f} | "
                   f"{row['p50_error']:+.1%} {row['p99_error']:+.1%}"
                   + (f"  (past the knee: {row['past_knee']})" if row["past_knee"] else ""))
    return rows


# ---- projection ---------------------------------------------------------------------------------
def _project(testbed: Mapping[str, Any], profile: ServiceProfile, base: Overheads,
             args: argparse.Namespace, saved: Checkpoint) -> list[dict[str, Any]]:
    """Every case at 100 and 1,000 instances, at the testbed's highest load per instance,
    over 1 frontend, the fewest that stay under ``FRONTEND_UTIL_MAX`` and testbed-sized
    shards; one shard is simulated (shards share nothing)."""
    from tqdm import tqdm

    rate_top = max(float(p["rate"]) for p in testbed["points"])
    measured_util = max(float(p.get("frontend_cores") or 0.0) for p in testbed["points"])
    points = {(str(p["case"]), float(p["rate"])): p for p in testbed["points"]}
    totals = [int(t) for t in str(args.totals).split(",") if t.strip()]
    plan = []
    for case in testbed["cases"]:
        point = points.get((str(case["name"]), rate_top))
        if point is None:
            continue
        cpu = _point_cpu_ms(point, args)
        for total in totals:
            full_rate = rate_top * total / int(case["instances"])
            # A shard holds at least the testbed's deployment (a Berrut group needs all of
            # its K + S replicas in one shard).
            sized = max(1, total // int(case["instances"]))
            for n in sorted({1, min(sized, frontends_needed(full_rate, cpu)), sized}):
                plan.append((case, point, cpu, total, n))
    rows = []
    bar = tqdm(plan, desc="project", unit="shard")
    for case, point, cpu, total, n in bar:
        bar.set_postfix_str(f"{case['name']} {total} instances, {n} frontends")
        replicas, _ = shard_plan(total, int(case["replicas"]), int(case["instances"]), n)
        # The testbed's load per instance of this case, whatever its mode adds per query.
        rate = rate_top * replicas / int(case["replicas"])
        key = f"project|{case['name']}|{total}|{n}"
        found = saved.get(key, rate, 0)
        if found is None:
            found = {"case": key, "rate": rate,
                     **_project_one(testbed, case, replicas, rate, profile,
                                    Overheads(cpu, base.latency_ms,
                                              point_rpc_ms(point, base, args)),
                                    args.project_queries)}
            saved.put(found, 0)
        util = rate * cpu / 1000
        rows.append({"case": case["name"], "mode": case["mode"], "total": total,
                     "frontends": n, "shard_replicas": replicas,
                     "shard_instances": found["instances"], "rate_qps": rate * n,
                     "shard_rate_qps": rate, "cpu_ms": cpu, "frontend_util": util,
                     "testbed_past_knee": knee_reason(point, profile.median_ms(1)
                                                      + base.cpu_ms + base.latency_ms),
                     "limit": projection_limit(util, measured_util, replicas,
                                               int(case["replicas"])),
                     **{k: found[k] for k in ("n", "p50_ms", "p99_ms", "p999_ms")},
                     "util_data": found["utilisation"].get("data")})
    return rows


def _project_one(testbed: Mapping[str, Any], case: Mapping[str, Any], replicas: int,
                 rate: float, profile: ServiceProfile, overheads: Overheads,
                 queries: int) -> dict[str, Any]:
    """One frontend shard: its replicas, its share of the load, ParM's shuffles at the
    testbed's density (the same concurrent shuffles per slot)."""
    sh = testbed["shuffle"]
    probe = sim_config(case, float(testbed["reactive_ms"]), overheads, {}, replicas=replicas)
    slots = probe.instances()
    concurrent = max(1, round(int(sh["concurrent"]) * slots / int(sh["cluster_slots"])))
    rng = np.random.default_rng([int(testbed["seed"]), slots, queries])
    arrivals = poisson_schedule(rate, queries, rng)
    events = shuffle_events(max(2, slots), concurrent, shuffle_horizon_s(queries, rate),
                            float(sh["gbps"]), rng)
    windows = windows_from_transitions(shuffle_transitions(events, slots),
                                       float(sh["delay_ms"]) / 1000)
    config = sim_config(case, float(testbed["reactive_ms"]), overheads, windows,
                        replicas=replicas, shuffle=sh)
    result = simulate(config, profile, arrivals, np.random.default_rng([slots, 2]),
                      warmup=queries // 10)
    s = result.summary()
    return {k: s[k] for k in ("n", "p50_ms", "p99_ms", "p999_ms")} | {
        "instances": config.instances(), "utilisation": s["utilisation"]}


# ---- output -------------------------------------------------------------------------------------
_COLUMNS = [("case", "case", "s"), ("instances", "instances", "d"), ("rate", "q/s", ".0f"),
            ("measured_n", "measured n", "d"), ("sim_n", "sim n", "d"),
            ("measured_p50_ms", "measured p50", ".2f"), ("sim_p50_ms", "sim p50", ".2f"),
            ("p50_error", "p50 err", "+.1%"), ("measured_p99_ms", "measured p99", ".2f"),
            ("sim_p99_ms", "sim p99", ".2f"), ("p99_error", "p99 err", "+.1%"),
            ("measured_p999_ms", "measured p99.9", ".2f"), ("sim_p999_ms", "sim p99.9", ".2f"),
            ("cpu_ms", "frontend CPU ms/query", ".2f"), ("rpc_ms", "held per task ms", ".2f"),
            ("note", "", "s")]
_STEAL_COLUMNS = [("case", "case", "s"), ("rate", "q/s", ".0f"),
                  ("steal_share", "CPU stolen", ".1%"), ("clean_share", "answers kept", ".1%"),
                  ("clean_p50_ms", "steal-free p50", ".2f"), ("sim_p50_ms", "sim p50", ".2f"),
                  ("clean_p50_error", "p50 err", "+.1%"),
                  ("clean_p99_ms", "steal-free p99", ".2f"), ("sim_p99_ms", "sim p99", ".2f"),
                  ("clean_p99_error", "p99 err", "+.1%")]
_PROJ_COLUMNS = [("case", "case", "s"), ("total", "instances", "d"),
                 ("frontends", "frontends", "d"), ("shard_instances", "per frontend", "d"),
                 ("rate_qps", "q/s", ".0f"), ("frontend_util", "frontend CPU (cores)", ".2f"),
                 ("p50_ms", "p50", ".2f"), ("p99_ms", "p99", ".2f"), ("p999_ms", "p99.9", ".2f"),
                 ("n", "sim n", "d"), ("holds", "holds?", "s")]


def _note(row: Mapping[str, Any]) -> str:
    if row["past_knee"]:
        return f"past the knee ({row['past_knee']}): not counted"
    if row["calibration"]:
        return "calibration point (its p50 is the fit)"
    return "within 10%" if row["within"] else "**missed**"


def _write(name: str, report: dict[str, Any], args: argparse.Namespace) -> None:
    for row in report["rows"]:
        row["note"] = _note(row)
    for row in report.get("projection", []):
        past = row["testbed_past_knee"]
        row["holds"] = "no: " + "; ".join(x for x in (row["limit"], past and
                                                      f"past the knee on the testbed ({past})")
                                          if x) if (row["limit"] or past) else "yes"
    plots = [_plot_validation(report["rows"], args.results_dir / f"{name}.png",
                              report["testbed"])]
    if report.get("projection"):
        plots.append(_plot_projection(report["projection"],
                                      args.results_dir / f"{name}-projection.png"))
    report["plots"] = [p.name for p in plots]
    paths = write_results(name, report, results_dir=args.results_dir,
                          markdown=_markdown(report))
    print(f"\nwrote {paths['json']}, {paths['md']}, {', '.join(map(str, plots))}")


def _markdown(r: Mapping[str, Any]) -> str:
    o = r["overheads_ms"]
    cpu = (f"{r['cpu_ms']:.3f} ms" if r["cpu_ms"] is not None
           else "each point's measured `frontend_cpu_us`")
    quick = ("\n\n**Quick run**: one repetition per point replayed, few queries per "
             "projected shard. Not a result to quote." if r["quick"] else "")
    if r["testbed_quick"]:
        quick += ("\n\n**Measured side is the testbed's quick run** (2,000 queries, one "
                  "repetition per point): its p99 rests on 20 answers.")
    text = f"""# SIMULATED vs EMULATED: the simulator held to the ParM testbed

**{r['label']}.** Measured: `{r['testbed']}` (measured {r['testbed_date']}). Simulated:
`parityserve.core.simulate` driving the runtime's own scheduler, replaying each measured run
with the same deployment, the same service-time distribution
(`ServiceProfile.from_emulation`), the same Poisson arrival times and the same
background-shuffle windows (drawn from the run's own seed by `parm_testbed`'s helpers).
{r['repeats']} repetition(s) per point; the medians over repetitions are compared, as the
testbed reports them.{quick}

Overheads the profile does not see: frontend CPU per query {cpu} (a FIFO server ahead of the
queue); latency outside any queue {o['latency_ms']:.3f} ms per query; what holds a replica
per task beyond its drawn service time {_held_text(r)} Calibrated on
{_calibration_text(r)}

## Validation

{r['verdict']}

{markdown_table(r['rows'], _COLUMNS)}

Errors are simulated / measured - 1. A point is past the knee when it served under
{KNEE_THROUGHPUT:.0%} of its offered load or its measured p50 is over {KNEE_P50:g}x the idle
p50 (profile median + overheads); those are shown, not counted.

Plot: `{r['plots'][0]}` (simulated against measured, p50 and p99, the 10% band shaded)."""
    text += _steal_text(r)
    if r.get("projection"):
        text += f"""

## Projection: 100 and 1,000 instances, sharded frontends (SIMULATED)

Each frontend owns its share of the instances and serves its share of the load (coding
groups never span frontends), so one shard is simulated. Load: the testbed's highest rate
per instance of each case ({r['project_per_replica_qps']:.0f} q/s over that case's
instances), so every mode keeps the testbed's utilisation; each shard sees ParM's
shuffles at the testbed's density (concurrent shuffles scaled with its slots); frontend
CPU per query is the testbed's measured cost for that mode at that rate. Frontend counts:
1, the fewest that keep each under {FRONTEND_UTIL_MAX:.0%} of a core, and testbed-sized shards.

{markdown_table(r['projection'], _PROJ_COLUMNS)}

A projected row **holds** only where nothing in it lies outside what the testbed measured:
a frontend busier than {FRONTEND_UTIL_MAX:.0%} of a core and more than twice the busiest
measured one is extrapolated (at 1 core it saturates: the frontend, not the instances, is the
bottleneck, and latency grows with the run's length); a frontend scheduling more than 4x the
testbed's replicas runs outside its measured CPU per query (the runtime's pump walks every
replica for each query, so the real cost grows with shard size; the simulator charges the
testbed's constant); a mode past its knee on the testbed is past it here too.

Plot: `{r['plots'][1]}`."""
    return text


def _steal_text(r: Mapping[str, Any]) -> str:
    line = steal_free_line(r["rows"])
    if line is None:
        return ""
    rows = [row for row in r["rows"] if "clean_within" in row]
    return f"""

## Against the answers that met no hypervisor steal (a diagnostic)

The testbed records the CPU this VM's host took during each point (`benchmarks.steal`)
and the latencies of the answers that were in flight while it took none. The simulator has
no host, so this is where it should match best. The target above stays judged on every
answer.

{line}

{markdown_table(rows, _STEAL_COLUMNS)}"""


def _held_text(r: Mapping[str, Any]) -> str:
    """How the per-task hold (and the CPU) of each replayed run was set."""
    figure = f"{r['overheads_ms']['rpc_ms']:.3f} ms"
    runs = sum(int(row.get("replayed_runs") or 0) for row in r["rows"])
    own = sum(int(row.get("own_transport_runs") or 0) for row in r["rows"])
    cpu = ("" if r["cpu_ms"] is not None else
           " Each run is replayed with its own measured frontend CPU per query; the table "
           "shows the points' medians.")
    if own == 0:
        why = (" for every run, the idle point's (this testbed run recorded no transport per "
               "point)" if r.get("idle") and r.get("rpc_ms") is None else " for every run")
        return figure + why + "." + cpu
    measured = ("each run's own measured transport per task (`transport_ms_per_task`: it "
                "grows with the frontend's load, as an answer waits for the event loop) plus "
                f"the idle point's timer overshoot ({idle_timer_ms(r['idle']):.3f} ms)")
    if own < runs:
        measured += (f", in {own} of the {runs} replayed runs; the others, which recorded "
                     f"none, {figure}, the idle point's figure")
    return measured + "." + cpu


def _calibration_text(r: Mapping[str, Any]) -> str:
    idle = r.get("idle")
    if not idle:
        return ("`none`'s measured p50 at the lowest rate (its p50 is the fit, so that point "
                "counts by its p99 only); no idle point, so nothing holds a replica beyond "
                "its draw.")
    return (f"the testbed's **idle point** (`{IDLE}`: `none` on the same 12 emulated "
            f"instances, {idle['rate']:g} q/s, {idle['n']} queries, no shuffles), which no "
            f"validation point is: p50 {idle['p50_ms']:.2f} ms; per task, transport "
            f"{float(idle['transport_ms_per_task'] or 0):.3f} ms (the frontend's round trip "
            f"beyond the worker's hold) and the worker's hold "
            f"{float(idle['worker_hold_ms'] or 0):.3f} ms against the profile's mean "
            f"{idle['profile_mean_ms']:.2f} ms (the sleeping worker's timer); the latency "
            "outside any queue is what remains of its p50 over the simulator's. The frontend "
            "CPU per query is the loaded points' own: at the idle rate the workers' "
            "heartbeats, shared by few queries, inflate it "
            f"({idle['frontend_cpu_us']:.0f} us there).")


def _plot_validation(rows: Sequence[Mapping[str, Any]], path: Path, testbed: str) -> Path:
    fig, ax = new_figure()
    for q, marker in (("p50", "o"), ("p99", "s")):
        for counted, colour in ((True, "tab:blue"), (False, "tab:grey")):
            pts = [(r[f"measured_{q}_ms"], r[f"sim_{q}_ms"]) for r in rows
                   if bool(r["counted"]) == counted]
            if pts:
                ax.scatter(*zip(*pts, strict=True), marker=marker, color=colour,
                           label=f"{q}, {'below' if counted else 'past'} the knee", s=18)
    values = [v for r in rows for q in ("p50", "p99") for v in
              (r[f"measured_{q}_ms"], r[f"sim_{q}_ms"])]
    lo, hi = min(values) * 0.8, max(values) * 1.25
    xs = np.geomspace(lo, hi, 50)
    ax.plot(xs, xs, "k-", linewidth=0.8)
    ax.fill_between(xs, xs * (1 - TARGET), xs * (1 + TARGET), color="k", alpha=0.1)
    ax.legend(fontsize="small")
    ax.set(xscale="log", yscale="log", xlabel="measured on the EMULATED testbed (ms)",
           ylabel="simulated (ms)", title=f"Simulator vs testbed ({Path(testbed).name})")
    return save_figure(fig, ax, path)


def _plot_projection(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    fig, ax = new_figure()
    cases = list(dict.fromkeys(r["case"] for r in rows))
    for colour, case in zip(colours(len(cases)), cases, strict=True):
        for total, style in zip(sorted({r["total"] for r in rows}), ("-o", ":s"), strict=False):
            pts = sorted((r["frontends"], r["p99_ms"]) for r in rows
                         if r["case"] == case and r["total"] == total)
            ax.plot(*zip(*pts, strict=True), style, color=colour, markersize=3,
                    label=f"{case} ({total})")
    ax.legend(fontsize="x-small", ncol=2, title="p99; instances: 100 solid, 1,000 dotted")
    ax.set(xscale="log", yscale="log", xlabel="frontends (shards)", ylabel="p99 (ms)",
           title="SIMULATED p99 at 100 and 1,000 instances vs frontend shards")
    return save_figure(fig, ax, path)


# ---- python -m benchmarks.sim_testbed ---------------------------------------------------------
DESCRIPTION = ("The SIMULATOR held to the EMULATED-accelerator ParM testbed: replays every "
               "measured run of a benchmarks.parm_testbed JSON (same cases, service-time "
               "profile, arrival times and shuffle windows), compares p50 and p99 at every "
               "point below the knee (target: within 10%), then projects each mode to 100 "
               "and 1,000 instances over sharded frontends and says where that stops holding.")
EXAMPLES = (
    ("python -m benchmarks.sim_testbed --quick",
     "check the tool against the newest testbed JSON: one repetition, small projection"),
    ("python -m benchmarks.sim_testbed --testbed benchmarks/results/parm-testbed.json",
     "the full comparison and projection against the full testbed run"),
    ("python -m benchmarks.sim_testbed --resume",
     "go on from the simulations an interrupted run saved"),
    ("python -m benchmarks.sim_testbed --latency-ms 2.0 --cpu-ms 0.6 --no-project",
     "validate with overheads of your own instead of the calibrated ones"),
)


def build_parser() -> argparse.ArgumentParser:
    return _cli.build_parser("sim_testbed", DESCRIPTION, _cli.examples(EXAMPLES),
                             add_arguments)


def main(argv: Sequence[str] | None = None) -> int:
    return _cli.main(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
