"""``python -m benchmarks.parm_testbed``: ParM section 6 on an EMULATED-accelerator testbed.

Why a testbed: on this 2-core machine the real-process tail benchmark (``benchmarks.tail``)
shares the cores between the frontend, the load generator and every instance, so a machine
stall delays every copy at once. ParM ran each instance on its own machine, often one with a
GPU that the host CPU only waits on. Here every worker is an *emulated accelerator*
(``deployment.emulation``, see ``parityserve.core.emulation``): it computes the real model's
output, then sleeps until a service time drawn from a profile has passed. The default
profile, ``parm-gpu-resnet18``, is derived from ParM's own GPU-cluster numbers (its
``source`` says how, and what is assumed). The frontend, its queues, the coding, the ZeroMQ
transport and the fault injection are the real code. **Every number this writes is from an
emulation, and each title says so.**

The experiment follows ParM section 6:

* **cluster:** m = 12 deployed instances (ParM's GPU cluster; ``--deployed 24`` for its CPU
  cluster), batch size 1, single-queue load balancing (instances pull), cache off;
* **modes, resource-matched:** ``none`` (m); ``equal-resources`` with m + m/k plain replicas
  (ParM's baseline, one per k); ``replication-2``, ``reactive`` (re-issue a batch not answered
  after ``--reactive-ms``: hedging, the policy production users reach for), ``berrut``
  (K = m, S = m/2) and ``systematic-berrut`` (K = m, S = m/2), each with ParM k = 2's
  instance count; ParM at each k with m + m/k instances;
* **background shuffles, as ParM describes them:** ``--shuffles`` (4) transfers run at all
  times, each between two instances chosen at random, of a size drawn uniformly from
  128-256 MB; at ``--shuffle-gbps`` (1.5, ParM's measured 1-2 Gbps per GPU instance) one
  lasts 0.7-1.4 s, and the next starts when it ends. ParM gives no figure for what a shuffle
  does to a query on a busy link, so while an instance is in one it adds
  ``--shuffle-delay-ms`` (our parameter, default 50) to each batch it serves, through the
  real fault injection (``POST /admin/models/bench/faults``): the same for every batch, or
  with ``--shuffle-delay-distribution exponential`` (or heavy-tailed ``pareto``, with
  ``--shuffle-tail-index``) drawn per batch with that mean.
  ``benchmarks.parm_calibration`` sets the slowdown from ParM's own numbers for its
  baseline, running the baseline alone (see there). The pairs are drawn from a
  fixed set of slots (the largest deployment's), so every mode sees the same per-slot
  timeline, seeded by (seed, repetition, rate);
* **load:** open-loop Poisson, ``--queries`` per point (20,000 by default) and ``--repeats``
  repetitions (3), medians shown. One server per case serves all its repetitions (they
  differ in their Poisson and shuffle seeds), which saves a server start per repetition;
* **sizing (issue 21: the full run in 45 min):** 9 cases x 3 repetitions x 20,000 queries is
  540,000 queries per rate, so every rate r costs 540,000 / r seconds of load: 36 min at
  250 q/s, 51 min at 175, 90 min at 100. The full run therefore measures **one rate, 250 q/s
  (near the knee of ``none`` at 12 instances)**: about 40 min with server starts. "Several
  rates up to the knee" does not fit beside 20,000 x 3: the cheapest second rate (175 q/s)
  makes it about 93 min, 48 over. ``--rates 100,175,250`` is the sweep, in about 3 h; every
  run prints its estimate against the 45-min budget before it starts;
* **headline:** the gap p99.9 - p50 and its ratio to equal-resources with the same number of
  instances, beside ParM's "up to 3.5x" (target: at least 3.5x for ParM k = 2 at 12 + 6);
* **cost:** extra instances over ``none``, and the frontend's CPU per query (the server
  process's own CPU time over the point, divided by its answers) beside ``none``'s.

Parity instances run the deployed model itself on the parity query: with emulation their
service time is the profile's either way, and this experiment measures latency only.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import _cli
from benchmarks.replica_timing import (
    Snapshot,
    replica_state,
    settled_replica_state,
    transport_ms_per_task,
    worker_hold_ms,
)
from benchmarks.report import (
    command_line,
    markdown_table,
    plot_latency_vs_load,
    plot_quantile_cdf,
    write_results,
)
from benchmarks.steal import StealSampler, steal_free
from benchmarks.tail import (
    CDF_PROBABILITIES,
    Case,
    Checkpoint,
    _Injector,
    _loadavg,
    collect_points,
    count_rebuilt,
    estimate_runtime_s,
    gap_rows,
    headline,
    instance_names,
    latency_quantiles_ms,
    middle_rate,
    missing_runs,
    run_seconds,
    saved_runs,
    serving_config,
    settings_key,
)
from parityserve.bench.loadgen import (
    LoadResult,
    encode_bodies,
    poisson_schedule,
    run_event_loop,
    run_open_loop,
    warmed_json_sender,
)
from parityserve.bench.serverproc import ServerProcess, write_config
from parityserve.core.emulation import profile_named

__all__ = [
    "MODES",
    "add_arguments",
    "build_parser",
    "budget_line",
    "cost_rows",
    "main",
    "measure_plan",
    "plan_s",
    "remaining_s",
    "run",
    "run_order",
    "run_seed",
    "shuffle_delay_words",
    "shuffle_distribution",
    "shuffle_faults",
    "shuffle_events",
    "shuffle_horizon_s",
    "shuffle_transitions",
    "steal_gap_rows",
    "steal_line",
    "testbed_cases",
    "testbed_config",
]

MODES = ("none", "equal-resources", "replication", "reactive", "parm", "berrut",
         "systematic-berrut")
SOURCE = "zoo:parm-mlp"  # real outputs; its compute time is replaced by the profile's
RATES = (250.0,)  # q/s, the full run: near the knee of `none` at 12 instances (see sizing)
SWEEP_RATES = (100.0, 175.0, 250.0)  # --quick takes the first and last
BUDGET_MIN = 45.0  # issue 21: the full run's wall time
PARM_HEADLINE = 3.5  # "reduces the gap between 99.9th percentile and median latency by up to"
WARMUP = 100  # queries before each point's load: connections open, first batches past


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", type=Path, help="datasets/weights ($PARITYSERVE_DATA)")
    p.add_argument("--profile", default="parm-gpu-resnet18",
                   help="emulated accelerator profile (parityserve.core.emulation.PROFILES)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma list of {', '.join(MODES)}")
    p.add_argument("--ks", default="2,4", help="ParM group sizes k")
    p.add_argument("--deployed", type=int, default=12, help="deployed instances m (ParM: 12 "
                   "GPU, 24 CPU)")
    p.add_argument("--rates", help=f"offered loads, q/s (default {','.join(map(str, RATES))}: "
                   f"what fits {BUDGET_MIN:g} min; the sweep: "
                   f"{','.join(f'{r:g}' for r in SWEEP_RATES)})")
    p.add_argument("--queries", type=int, default=20_000, help="queries per point")
    p.add_argument("--repeats", type=int, default=3, help="repetitions per point (medians)")
    p.add_argument("--warmup", type=int, default=WARMUP,
                   help="queries sent one after another before each point's load, answers "
                        f"discarded (default {WARMUP}; fewer only to check the harness fast)")
    p.add_argument("--shuffles", type=int, default=4, help="concurrent background shuffles")
    p.add_argument("--shuffle-gbps", type=float, default=1.5,
                   help="link speed a shuffle runs at (sets how long one lasts)")
    p.add_argument("--shuffle-delay-ms", type=float, default=50.0,
                   help="added to each batch an instance serves while in a shuffle (the "
                        "mean, with --shuffle-delay-distribution exponential)")
    p.add_argument("--shuffle-delay-distribution", default="constant",
                   choices=("constant", "exponential", "pareto"),
                   help="constant: every batch in a shuffle waits --shuffle-delay-ms; "
                        "exponential: each batch draws its own wait, with that mean; "
                        "pareto: the same, heavy-tailed (see --shuffle-tail-index)")
    p.add_argument("--shuffle-tail-index", type=float, default=2.0,
                   help="pareto only: the tail index a of P(wait > d) = (1 + d/s)^-a "
                        "(> 1; smaller is heavier; the exponential is the a -> infinity "
                        "limit)")
    p.add_argument("--reactive-ms", type=float, default=60.0,
                   help="reactive: re-issue a batch not answered after this long")
    p.add_argument("--berrut-group-wait-ms", type=float, default=0.0,
                   help="berrut modes: a partial group waits up to this long for more "
                        "queries (redundancy.group_wait_ms; default 0, as before)")
    p.add_argument("--order", default="auto", choices=("auto", "interleaved", "grouped"),
                   help="interleaved: repetition 1 of every case, then repetition 2 in "
                        "reverse order, ..., a fresh server each (a slow spell of the host "
                        "then hits every case alike); grouped: one server per case for all "
                        "its repetitions (fewer starts); auto (default): with --resume or "
                        "--report-only the saved run's order, else interleaved when that "
                        "fits the 45-min budget")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--results-dir", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--quick", action="store_true",
                   help="2,000 queries per point, 1 repetition, the lowest and highest rate: "
                        "checks the harness in under 10 min; not a result to quote")
    p.add_argument("--resume", action="store_true",
                   help="reuse the runs an interrupted run with the same settings saved "
                        "(RESULTS_DIR/parm-testbed-runs/, committed)")
    p.add_argument("--report-only", action="store_true",
                   help="measure nothing; write the report from the saved runs")
    p.set_defaults(func=run)


# ---- pure helpers: cases, configs, shuffles, costs -------------------------------------------
def testbed_cases(modes: Sequence[str], ks: Sequence[int], deployed: int,
                  reactive_ms: float, *, berrut_group_wait_ms: float = 0.0) -> list[Case]:
    """The deployments, resource-matched (see the module docstring)."""
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise ValueError(f"unknown modes {unknown}; use {', '.join(MODES)}")
    if deployed < 2 or not ks or min(ks) < 2:
        raise ValueError("need deployed >= 2 and every k >= 2")
    m = deployed
    extra = {k: -(-m // k) for k in ks}
    s = -(-m // 2)  # ParM k = 2's extra instances: the other redundant modes get as many
    cases: list[Case] = []
    for mode in MODES:
        if mode not in modes:
            continue
        if mode == "none":
            cases.append(Case("none", mode, m, m))
        elif mode == "equal-resources":
            cases += [Case(f"equal-resources-{m + e}", mode, m, m + e, {"mode": mode, "extra": e})
                      for e in sorted(set(extra.values()) | {s})]
        elif mode == "replication":
            cases.append(Case("replication-2", mode, m + s, m + s, {"mode": mode, "d": 2}))
        elif mode == "reactive":
            cases.append(Case("reactive", mode, m + s, m + s,
                              {"mode": mode, "timeout_ms": reactive_ms}))
        elif mode == "parm":
            cases += [Case(f"parm-k{k}", mode, m, m + extra[k], {"mode": "parm"},
                           {"k": k, "replicas": extra[k]}, extra[k]) for k in ks]
        else:
            berrut: dict[str, Any] = {"mode": mode, "K": m, "S": s}
            if berrut_group_wait_ms:
                berrut["group_wait_ms"] = berrut_group_wait_ms
            cases.append(Case(mode, mode, m + s, m + s, berrut))
    return cases


def testbed_config(case: Case, profile: str, seed: int) -> dict[str, Any]:
    """``benchmarks.tail``'s deployment file for ``case``, on emulated accelerators."""
    config = serving_config(case, SOURCE, max_batch=1)
    config["models"][0]["emulation"] = {"profile": profile, "seed": seed}
    return config


def shuffle_events(slots: int, concurrent: int, horizon_s: float, gbps: float,
                   rng: np.random.Generator, size_mb: tuple[float, float] = (128.0, 256.0)
                   ) -> list[tuple[float, float, tuple[int, int]]]:
    """(start s, duration s, slot pair) of every shuffle up to ``horizon_s``: ``concurrent``
    lanes, each running one shuffle after another between a random pair of distinct slots,
    its size uniform in ``size_mb`` at ``gbps``."""
    if slots < 2 or concurrent < 0 or gbps <= 0:
        raise ValueError("shuffles need 2+ slots, concurrent >= 0 and gbps > 0")
    events = []
    for _ in range(concurrent):
        t = 0.0
        while t < horizon_s:
            duration = float(rng.uniform(*size_mb)) * 8 / 1000 / gbps
            a, b = sorted(int(v) for v in rng.choice(slots, size=2, replace=False))
            events.append((t, duration, (a, b)))
            t += duration
    return sorted(events)


def run_seed(seed: int, rep: int, rate: float) -> list[int]:
    """The seed of one run's Poisson schedule and shuffle timeline (each draws from a fresh
    generator on it), so that ``benchmarks.sim_testbed`` replays the very same run."""
    return [seed, rep, int(rate * 1000)]


def shuffle_horizon_s(queries: int, rate: float) -> float:
    """How far ahead a run's shuffle timeline is drawn: past its last arrival."""
    return queries / rate * 1.5 + 5.0


def shuffle_transitions(events: Sequence[tuple[float, float, tuple[int, int]]],
                        instances: int) -> list[tuple[float, int, bool]]:
    """(time, slot, on) switches for the slots a deployment has, overlapping shuffles on one
    slot merged into one window."""
    windows: dict[int, list[list[float]]] = {}
    for start, duration, pair in sorted(events):
        for slot in pair:
            if slot >= instances:
                continue
            spans = windows.setdefault(slot, [])
            if spans and start <= spans[-1][1]:
                spans[-1][1] = max(spans[-1][1], start + duration)
            else:
                spans.append([start, start + duration])
    out = [(t, slot, on) for slot, spans in windows.items()
           for a, b in spans for t, on in ((a, True), (b, False))]
    return sorted(out, key=lambda x: (x[0], not x[2], x[1]))


def shuffle_distribution(shuffle: Mapping[str, Any]) -> str:
    """How a run's shuffle slowdown was drawn: the committed constant runs say nothing of a
    distribution (it joins the settings only when not constant), so its absence means
    constant."""
    return str(shuffle.get("delay_distribution", "constant"))


def shuffle_delay_words(shuffle: Mapping[str, Any]) -> str:
    """What a shuffle does to each batch, for the report."""
    distribution = shuffle_distribution(shuffle)
    if distribution == "exponential":
        return f"an exponential wait with mean {shuffle['delay_ms']:g} ms, drawn per batch,"
    if distribution == "pareto":
        return (f"a heavy-tailed (Lomax, tail index {shuffle['tail_index']:g}) wait with mean "
                f"{shuffle['delay_ms']:g} ms, drawn per batch,")
    return f"{shuffle['delay_ms']:g} ms"


def shuffle_faults(shuffle: Mapping[str, Any]) -> dict[str, Any]:
    """The fault settings an instance in a shuffle gets (``POST .../faults``)."""
    faults: dict[str, Any] = {"delay_ms": shuffle["delay_ms"],
                              "delay_distribution": shuffle_distribution(shuffle)}
    if "tail_index" in shuffle:
        faults["delay_tail_index"] = shuffle["tail_index"]
    return faults


def plan_s(cases: int, rates: Sequence[float], queries: int, repeats: int, *,
           interleaved: bool = False) -> float:
    """Estimated wall time: every (case, repetition, rate) point's load, and the server
    starts: one per case (its repetitions share it), or one per case and repetition when the
    repetitions are interleaved across cases."""
    starts = cases * repeats if interleaved else cases
    return estimate_runtime_s(list(rates) * repeats * cases, queries, starts)


def run_order(order: str, cases: int, rates: Sequence[float], queries: int,
              repeats: int) -> str:
    """``interleaved`` or ``grouped``. Interleaving (repetition 1 of every case, then
    repetition 2 in the reverse order, ...) keeps a slow spell of the host (see
    ``benchmarks.steal``) from landing on one case's repetitions only; it costs a
    server start per case and repetition. ``auto`` interleaves when that fits the budget."""
    if order != "auto":
        return order
    fits = plan_s(cases, rates, queries, repeats, interleaved=True) <= BUDGET_MIN * 60
    return "interleaved" if fits or repeats == 1 else "grouped"


def resumed_order(order: str, resuming: bool, saved: Callable[[str], bool]) -> str | None:
    """With ``--order auto`` on a resume, the order of the run being resumed (``saved(o)``:
    whether a run file for order ``o`` exists), interleaved first; None when there is none
    or the order was named. The order is part of a run's settings, so without this a resume
    that adds cases (and so no longer fits the budget interleaved) would start a new run
    file grouped instead of going on with the saved one."""
    if order != "auto" or not resuming:
        return None
    return next((o for o in ("interleaved", "grouped") if saved(o)), None)


def remaining_s(cases: Sequence[Case], rates: Sequence[float], saved: Checkpoint,
                repeats: int, order: str, queries: int) -> float:
    """Estimated wall time of what a resumed run still has to measure: the unsaved points
    and the server starts they need."""
    points: list[float] = []
    starts = 0
    for case, reps in measure_plan(cases, repeats, order):
        todo = [r for rep in reps for r in rates if saved.get(case.name, r, rep) is None]
        points += todo
        starts += bool(todo)
    return estimate_runtime_s(points, queries, starts)


def budget_line(estimate_s: float, budget_min: float = BUDGET_MIN) -> str:
    """The estimate against the issue's budget, in words."""
    minutes = estimate_s / 60
    if minutes <= budget_min:
        return f"about {minutes:.0f} min in all: within the {budget_min:g}-min budget"
    return (f"about {minutes:.0f} min in all: over the {budget_min:g}-min budget by "
            f"{minutes - budget_min:.0f} min")


def cost_rows(points: Sequence[dict[str, Any]], deployed: int) -> list[dict[str, Any]]:
    """Per point: extra instances over ``none`` and frontend CPU per query beside ``none``'s
    at the same rate (None where ``none`` was not run)."""
    base = {p["rate"]: p for p in points if p["case"] == "none"}
    out = []
    for p in points:
        ref = base.get(p["rate"])
        cpu, ref_cpu = p.get("frontend_cpu_us"), ref.get("frontend_cpu_us") if ref else None
        out.append({"case": p["case"], "rate": p["rate"],
                    "extra_instances": p["instances"] - deployed,
                    "extra_fraction": (p["instances"] - deployed) / deployed,
                    "frontend_cpu_us": cpu,
                    "cpu_vs_none": cpu / ref_cpu if cpu and ref_cpu else None})
    return out


# ---- measuring ----------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    from parityserve.models.datasets import load_mnist, resolve_data_dir

    if args.quick:
        args.queries, args.repeats = min(args.queries, 2000), 1
    rates = [float(r) for r in _split(args.rates)] if args.rates else list(RATES)
    if args.quick and not args.rates:
        rates = [SWEEP_RATES[0], SWEEP_RATES[-1]]
    profile = profile_named(args.profile)
    cases = testbed_cases(_split(args.modes), [int(k) for k in _split(args.ks)],
                          args.deployed, args.reactive_ms,
                          berrut_group_wait_ms=args.berrut_group_wait_ms)
    slots = max(c.instances for c in cases)
    shuffle = {"concurrent": args.shuffles, "size_mb": [128, 256], "gbps": args.shuffle_gbps,
               "delay_ms": args.shuffle_delay_ms, "cluster_slots": slots}
    if args.shuffle_delay_distribution != "constant":  # absent: the committed runs' constant
        shuffle["delay_distribution"] = args.shuffle_delay_distribution
    if args.shuffle_delay_distribution == "pareto":
        if not args.shuffle_tail_index > 1:
            raise SystemExit(f"--shuffle-tail-index must be > 1 (a finite mean), got "
                             f"{args.shuffle_tail_index:g}")
        shuffle["tail_index"] = args.shuffle_tail_index
    settings = {"profile": profile.label, "source": SOURCE, "queries": args.queries,
                "shuffle": shuffle, "seed": args.seed, "deployed": args.deployed,
                "reactive_ms": args.reactive_ms}
    if args.berrut_group_wait_ms:
        settings["berrut_group_wait_ms"] = args.berrut_group_wait_ms
    if args.warmup != WARMUP:  # absent: the committed runs' 100
        if args.warmup < 0:
            raise SystemExit(f"--warmup must be >= 0, got {args.warmup}")
        settings["warmup"] = args.warmup
    name = "parm-testbed-quick" if args.quick else "parm-testbed"
    folder = args.results_dir / (".work" if args.quick else "parm-testbed-runs")

    def run_file(order: str) -> tuple[Path, dict[str, Any]]:
        fingerprint = {**settings, "server": _SERVER_WORDS[order]}
        return folder / f"{name}-{settings_key(fingerprint)}.jsonl", fingerprint

    resuming = args.resume or args.report_only
    order = resumed_order(args.order, resuming, lambda o: run_file(o)[0].exists()) or run_order(
        args.order, len(cases), rates, args.queries, args.repeats)
    path, fingerprint = run_file(order)
    saved = Checkpoint(path, fingerprint, resume=resuming)
    estimate = plan_s(len(cases), rates, args.queries, args.repeats,
                      interleaved=order == "interleaved")
    left = remaining_s(cases, rates, saved, args.repeats, order, args.queries)
    resumed = f"; {left / 60:.0f} min of it left to measure" if left < estimate else ""
    print(f"== {profile.label}\n== ParM testbed: m = {args.deployed}, rates {rates} q/s, "
          f"{args.queries} queries x {args.repeats}, cases {[c.name for c in cases]}, "
          f"repetitions {order}; {budget_line(estimate)}{resumed} ==", flush=True)
    started = time.monotonic()
    if not args.report_only:
        data_dir = resolve_data_dir(args.data_dir)
        x, _ = load_mnist("test", data_dir=data_dir)
        bodies = encode_bodies(list(x[::10][:1000]))
        _measure(cases, rates, saved, args, shuffle, bodies, data_dir, profile.name, order)
    runs = saved_runs(saved, cases, rates, args.repeats)
    points = collect_points(runs)
    if not points:
        raise SystemExit(f"no saved runs for these settings in {saved.path}")
    for p in points:
        print(f"  {p['case']:<22} {p['rate']:5.0f} q/s  p50 {p['p50_ms']:7.2f}  p99 "
              f"{p['p99_ms']:7.2f}  p99.9 {p['p999_ms']:7.2f} ms  cpu/q "
              f"{p.get('frontend_cpu_us', float('nan')):.0f} us", flush=True)
    cdf_rate = middle_rate(rates)
    report = {"label": profile.label, "profile": profile.name, "source": SOURCE,
              "rates": rates, "queries_per_point": args.queries, "repeats": args.repeats,
              "warmup": args.warmup,
              "deployed": args.deployed, "shuffle": shuffle, "reactive_ms": args.reactive_ms,
              "seed": args.seed, "quick": args.quick, "cases": [c.__dict__ for c in cases],
              "points": points, "gaps": gap_rows(points, cases),
              "steal_gaps": steal_gap_rows(points, cases),
              "costs": cost_rows(points, args.deployed),
              "missing": missing_runs(runs, args.repeats), "run_file": str(saved.path),
              "load_s": sum(run_seconds(r) for found in runs.values() for r in found),
              "estimated_s": estimate, "wall_s": time.monotonic() - started,
              "cdf_rate": cdf_rate, "order": order, "measured_by": list(saved.commands)}
    _write(name, report, saved, cases, args)
    return 0


_SERVER_WORDS = {"grouped": "one per case",
                 "interleaved": "one per case and repetition, repetitions interleaved"}


def measure_plan(cases: Sequence[Case], repeats: int, order: str
                 ) -> list[tuple[Case, list[int]]]:
    """The server runs in order: (case, the repetitions that one server measures)."""
    if order == "grouped":
        return [(case, list(range(repeats))) for case in cases]
    return [(case, [rep]) for rep in range(repeats)
            for case in (cases if rep % 2 == 0 else cases[::-1])]


def _measure(cases: Sequence[Case], rates: Sequence[float], saved: Checkpoint,
             args: argparse.Namespace, shuffle: dict[str, Any], bodies: list[bytes],
             data_dir: Path, profile: str, order: str) -> None:
    """Every (case, repetition, rate) not saved yet, in ``measure_plan``'s order."""
    for case, reps in measure_plan(cases, args.repeats, order):
        todo = [(rep, r) for rep in reps for r in rates if saved.get(case.name, r, rep) is None]
        if not todo:
            continue
        config = testbed_config(case, profile, args.seed)
        path = write_config(config, args.results_dir / ".work" / f"testbed-{case.name}.yaml")
        with ServerProcess(path, data_dir=data_dir) as server:
            for rep, rate in todo:
                row, lat = _point(server, case, bodies, rate, rep, args, shuffle)
                saved.put({**row, "latency_quantiles_ms": latency_quantiles_ms(lat)}, rep)


def _point(server: ServerProcess, case: Case, bodies: list[bytes], rate: float, rep: int,
           args: argparse.Namespace, shuffle: dict[str, Any]
           ) -> tuple[dict[str, Any], np.ndarray]:
    seed = run_seed(args.seed, rep, rate)
    horizon = shuffle_horizon_s(args.queries, rate)
    events = shuffle_events(shuffle["cluster_slots"], shuffle["concurrent"], horizon,
                            shuffle["gbps"], np.random.default_rng(seed))
    transitions = shuffle_transitions(events, case.instances)
    injector = _Injector(server.url, instance_names(case), transitions, shuffle_faults(shuffle))
    pid = _pid(server)

    schedule = poisson_schedule(rate, args.queries, np.random.default_rng(seed))

    async def go() -> tuple[LoadResult, float, float, list[Snapshot]]:
        async with warmed_json_sender(server.url, "/bench/predict", bodies,
                                      warmup=args.warmup) as send:  # no shuffles yet
            # Per-task timing sums around the load alone (blocking calls, before it starts
            # and after it ends): the transport the simulator takes for this point.
            snapshots: list[Snapshot] = [replica_state(server.url, "bench")]
            cpu0, injector_t0 = _cpu_s(pid), time.monotonic()
            injector.start()
            try:
                result = await run_open_loop(
                    send, schedule, progress=f"{case.name} {rate:g} q/s #{rep + 1}",
                    rate_qps=rate, max_in_flight=10_000, timeout_s=60)
            finally:
                injector.stop()
            cpu_s, wall_s = _cpu_s(pid) - cpu0, time.monotonic() - injector_t0
            snapshots.append(settled_replica_state(server.url, "bench"))
            return result, cpu_s, wall_s, snapshots

    with StealSampler() as sampler:
        result, cpu_s, wall_s, (replicas_before, replicas_after) = run_event_loop(go())
    stolen = sampler.samples()
    s = result.summary()
    return {"case": case.name, "mode": case.mode, "instances": case.instances, "rate": rate,
            **{k: v for k, v in s.items() if k != "errors"},
            "errors": sum(s["errors"].values()), "error_kinds": s["errors"],
            "rebuilt_fraction": count_rebuilt(result.results) / max(1, result.n),
            "frontend_cpu_us": cpu_s / max(1, s["ok"]) * 1e6,
            "frontend_cores": cpu_s / wall_s if wall_s > 0 else None,
            "fault_switches": injector.done, "fault_errors": injector.errors,
            "transport_ms_per_task": transport_ms_per_task(replicas_before, replicas_after),
            "worker_hold_ms": worker_hold_ms(replicas_before, replicas_after),
            "loadavg_1m": _loadavg(), **stolen.summary(),
            **steal_free(result.latencies_s, result.ok, result.started_at + schedule, stolen),
            }, result.latencies_s[result.ok]


def _pid(server: ServerProcess) -> int:
    if server.proc is None:
        raise RuntimeError("the server is not running")
    return server.proc.pid


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (Linux /proc), its children not counted."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _split(text: str | None) -> list[str]:
    return [v.strip() for v in str(text or "").split(",") if v.strip()]


# ---- output -------------------------------------------------------------------------------------
_COLUMNS = [("case", "case", "s"), ("instances", "instances", "d"),
            ("rate", "offered q/s", ".0f"), ("throughput_qps", "q/s", ".0f"),
            ("p50_ms", "p50 ms", ".2f"), ("p99_ms", "p99 ms", ".2f"),
            ("p999_ms", "p99.9 ms", ".2f"), ("gap_ms", "p99.9-p50 ms", ".2f"),
            ("gap_reduction", "gap: equal-res / this", ".2f"),
            ("p50_ratio", "p50 / equal-res", ".2f"), ("rebuilt_fraction", "rebuilt", ".1%"),
            ("n", "queries", "d"), ("send_lag_p99_ms", "client lag p99 ms", ".1f"),
            ("errors", "errors", "d")]
_COST_COLUMNS = [("case", "case", "s"), ("rate", "offered q/s", ".0f"),
                 ("extra_instances", "extra instances", "d"),
                 ("extra_fraction", "extra / m", ".0%"),
                 ("frontend_cpu_us", "frontend CPU us/query", ".0f"),
                 ("cpu_vs_none", "CPU / none's", ".2f")]


_STEAL_COLUMNS = [("case", "case", "s"), ("rate", "offered q/s", ".0f"),
                  ("steal_share", "CPU stolen", ".1%"), ("steal_stalls", "stalls", ".0f"),
                  ("clean_share", "answers kept", ".1%"), ("p50_ms", "p50 ms", ".2f"),
                  ("p99_ms", "p99 ms", ".2f"), ("p999_ms", "p99.9 ms", ".2f"),
                  ("gap_ms", "p99.9-p50 ms", ".2f"),
                  ("gap_reduction", "gap: equal-res / this", ".2f"),
                  ("clean_n", "queries", "d")]


def steal_gap_rows(points: Sequence[dict[str, Any]], cases: Sequence[Case]
                   ) -> list[dict[str, Any]]:
    """``gap_rows`` over each point's steal-free answers (``benchmarks.steal``); empty
    where steal was not measured. A diagnostic beside the headline, never in its place."""
    clean = [{**p, "p50_ms": p["clean_p50_ms"], "p99_ms": p["clean_p99_ms"],
              "p999_ms": p["clean_p999_ms"]}
             for p in points if p.get("clean_p999_ms") is not None]
    return gap_rows(clean, cases) if clean else []


def steal_line(steal_gaps: Sequence[dict[str, Any]]) -> str | None:
    """ParM k = 2's gap reduction over the steal-free answers, labelled as what it is."""
    rows = [g for g in steal_gaps if g["case"] == "parm-k2" and g["gap_reduction"]]
    if not rows:
        return None
    best = max(rows, key=lambda g: g["gap_reduction"])
    return (f"Diagnostic, not the target: over the answers in flight while the host stole no "
            f"CPU from this VM ({best['clean_share']:.0%} of ParM k = 2's), ParM k = 2's gap is "
            f"{best['gap_reduction']:.2f}x smaller than equal-resources at {best['rate']:g} q/s.")


def target_line(gaps: Sequence[dict[str, Any]], deployed: int) -> str:
    """The issue's target, met or missed, from ParM k = 2's gap reductions."""
    rows = [g for g in gaps if g["case"] == "parm-k2" and g["gap_reduction"] is not None]
    if not rows:
        return "Target (ParM k = 2 gap >= 3.5x smaller than equal-resources): not run."
    best = max(rows, key=lambda g: g["gap_reduction"])
    verdict = "met" if best["gap_reduction"] >= PARM_HEADLINE else "missed"
    return (f"Target, ParM k = 2 at {deployed} + {-(-deployed // 2)}: p99.9 - p50 gap at "
            f"least {PARM_HEADLINE:g}x smaller than equal-resources: **{verdict}** (best "
            f"{best['gap_reduction']:.2f}x at {best['rate']:g} q/s, p50 ratio "
            f"{best['p50_ratio']:.2f}).")


def _write(name: str, report: dict[str, Any], saved: Checkpoint, cases: Sequence[Case],
           args: argparse.Namespace) -> None:
    label, results = report["label"], args.results_dir
    series = {}
    for case in dict.fromkeys(p["case"] for p in report["points"]):
        series[case] = [(p["rate"], p["p50_ms"], p["p99_ms"], p["p999_ms"])
                        for p in report["points"] if p["case"] == case]
    latency_png = plot_latency_vs_load(
        series, results / f"{name}-latency.png",
        f"EMULATED accelerators ({report['profile']}): latency vs load, background shuffles")
    cdfs = {c.name: cdf for c in cases
            if (cdf := saved.cdf(c.name, report["cdf_rate"])) is not None}
    cdf_png = plot_quantile_cdf(
        cdfs, CDF_PROBABILITIES, results / f"{name}-cdf.png",
        f"EMULATED accelerators ({report['profile']}): CDF at {report['cdf_rate']:g} q/s")
    stolen = steal_line(report.get("steal_gaps", []))
    report["headline"] = [*headline(report["gaps"]), target_line(report["gaps"],
                                                                  report["deployed"]),
                          *([stolen] if stolen else [])]
    report["plots"] = [latency_png.name, cdf_png.name]
    paths = write_results(name, report, results_dir=results, markdown=_markdown(report))
    print(f"\nwrote {paths['json']}, {paths['md']}, {latency_png}, {cdf_png}")
    print(label)
    print("\n".join(report["headline"]))


def _markdown(r: dict[str, Any]) -> str:
    sh = r["shuffle"]
    cases = "\n".join(f"- `{c['name']}`: {c['instances']} instances" for c in r["cases"])
    quick = ("\n\n**Quick run**: a harness check with few queries and one repetition; p99.9 "
             "rests on a handful of queries per point. Not a result to quote."
             if r["quick"] else "")
    if r["missing"]:
        quick += (f"\n\n**Partial run**: {len(r['missing'])} points have fewer than "
                  f"{r['repeats']} repetitions; `--resume` measures the rest.")
    thin = [f"{p['case']} at {p['rate']:g} q/s" for p in r["points"]
            if not p.get("p999_reliable", True)]
    if thin:
        quick += f" p99.9 is only the maximum (under 1,000 answers) for: {', '.join(thin)}."
    return f"""# EMULATED accelerators: ParM section 6 on a testbed

**{r['label']}.** Every worker computes the real output of `{r['source']}` and then sleeps
until its drawn service time has passed; the frontend, queues, coding, ZeroMQ transport and
fault injection are the real code. These are measurements of the serving system around
emulated devices, not of any accelerator.

## Setup

{r['deployed']} deployed instances, batch size 1, cache off. Open-loop Poisson load at {', '.join(f'{x:g}' for x in r['rates'])} q/s, {r['queries_per_point']} queries per point, {r['repeats']} repetition(s) (medians; each run's values are in the JSON), {_ORDER_WORDS[r.get('order', 'grouped')]}. The load ran {r['load_s'] / 60:.0f} min in all.{quick}{_measured_by(r)}

**Background shuffles (ParM section 6.1):** {sh['concurrent']} shuffles at all times, each between two instances chosen at random among {sh['cluster_slots']} slots, 128-256 MB at {sh['gbps']:g} Gbps (0.7-1.4 s at 1.5 Gbps), the next starting when one ends. An instance in a shuffle adds {shuffle_delay_words(sh)} to each batch it serves (our parameter: ParM gives no per-query figure), set and cleared through the admin API. Slots a smaller deployment lacks are not hit, so every mode sees the same per-slot timeline. `reactive` re-issues after {r['reactive_ms']:g} ms.

Cases (resource-matched):

{cases}

## Latency (EMULATED accelerators)

{markdown_table(r['gaps'], _COLUMNS)}

`gap: equal-res / this` is gap(equal-resources with the same instance count) / gap(this case), gap = p99.9 - p50: above 1 is a smaller gap. ParM reports up to {PARM_HEADLINE:g}x at the same median (`p50 / equal-res` near 1).

## Cost (EMULATED accelerators)

{markdown_table(r['costs'], _COST_COLUMNS)}

`frontend CPU us/query`: the server process's own CPU time over the point (workers excluded) divided by its answers.

{_steal_section(r)}## Headline (EMULATED accelerators)

{chr(10).join('- ' + line for line in r['headline'])}

Plots: `{r['plots'][0]}` (p50 solid, p99 dashed, p99.9 dotted) and `{r['plots'][1]}` (CDF at {r['cdf_rate']:g} q/s)."""  # noqa: E501


def _measured_by(r: dict[str, Any]) -> str:
    """The commands that measured the runs, where this report's own command (above) is not
    the only one: a report rewritten with --report-only, or runs added with --resume."""
    commands = r.get("measured_by") or []
    if not commands or commands == [command_line()]:
        return ""
    listed = "\n".join(f"    {c}" for c in commands)
    return f"\n\nThe runs were measured by:\n\n{listed}"


_ORDER_WORDS = {"grouped": "one server per case for all its repetitions",
                "interleaved": "repetitions interleaved across cases (repetition 1 of every "
                               "case, then repetition 2 in reverse order, ...), a fresh server "
                               "for each"}


def _steal_section(r: dict[str, Any]) -> str:
    if not r.get("steal_gaps"):
        return ("## Hypervisor steal\n\nNot measured (no `/proc/stat` steal counter here).\n\n")
    return f"""## Hypervisor steal: what the host took (a diagnostic, not the headline)

On a shared VM the host at times runs another guest on our cores, and every process here
stops at once, for 10-30 ms; no serving design hides that. `CPU stolen` is the share of the
VM's CPU time the host took while the point ran, and `stalls` the 5-ms intervals in which it
took 20 ms or more (medians over repetitions). The latencies below keep only the answers
during whose flight nothing was stolen (`answers kept`). A longer query meets a steal more
often by chance, so this drops a slow baseline's long queries a little more often than a
fast mode's: if anything, the ratio here is understated. The headline is the table above.

{markdown_table(r['steal_gaps'], _STEAL_COLUMNS)}

"""


# ---- python -m benchmarks.parm_testbed ------------------------------------------------------

DESCRIPTION = ("ParM section 6 on an EMULATED-accelerator testbed: 12 (or 24) deployed "
               "instances that compute real outputs but hold each batch for a profiled "
               "service time, asleep; ParM's background shuffles; none, equal-resources, "
               "replication, reactive, ParM k = 2 and 4, Berrut and systematic Berrut, "
               "resource-matched; p50, p99, p99.9, the p99.9 - p50 gap against "
               "equal-resources, and each mode's cost in instances and frontend CPU.")
EXAMPLES = (
    ("python -m benchmarks.parm_testbed --quick",
     "check the harness: 2,000 queries per point, 1 repetition, 2 rates (about 8 min)"),
    ("python -m benchmarks.parm_testbed",
     "the full run: 20,000 queries x 3 repetitions x 9 cases at 250 q/s (about 40 min)"),
    ("python -m benchmarks.parm_testbed --rates 100,175,250",
     "the rate sweep, about 3 h (it prints its estimate first)"),
    ("python -m benchmarks.parm_testbed --resume",
     "go on from the runs an interrupted full run saved"),
    ("python -m benchmarks.parm_testbed --deployed 24 --ks 2",
     "ParM's CPU-cluster size, 24 + 12"),
    ("python -m benchmarks.parm_testbed --modes equal-resources,parm --ks 2 --rates 150 "
     "--shuffle-delay-ms 50",
     "ParM k = 2 against its baseline at the slowdown benchmarks.parm_calibration set for "
     "150 q/s"),
)


def build_parser() -> argparse.ArgumentParser:
    return _cli.build_parser("parm_testbed", DESCRIPTION, _cli.examples(EXAMPLES),
                             add_arguments)


def main(argv: Sequence[str] | None = None) -> int:
    return _cli.main(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
