"""``python -m benchmarks.tail``: ParM §6 on this machine: tail latency under background load.

Real worker processes serve a real model (ResNet-20 on CIFAR-10 with the published weights,
or the lighter ParM MNIST MLP) behind the real frontend, one deployment per redundancy mode,
while the bench emulates ParM's background shuffles with the serving core's fault injection:

  **burst model ("random pairs").** Bursts start as a Poisson process with mean gap
  ``--burst-every-ms``. Each burst picks a uniformly random *pair* of instance slots out of a
  fixed cluster of slots (as many as the largest deployment), and both instances in those
  slots add ``--burst-delay-ms`` to every batch they serve for ``--burst-duration-ms`` (set
  and cleared through the admin API, ``POST /admin/models/{m}/faults``). Overlapping bursts on
  one instance merge into one longer window. A slot a smaller deployment does not use is simply
  not hit, so every mode sees the same per-slot background timeline (seeded per repetition
  and rate), whatever its number of instances.

Load is open-loop Poisson (``loadgen``), one query per request, batch size 1 (as in ParM).
Modes are resource-matched: with ``m`` deployed instances, ParM at k has ``m`` + ceil(m/k)
parity instances; equal-resources has that many plain replicas; replication (d=2), Berrut
(K=m, S=1) and systematic Berrut use the same count as ParM at k=2. With the default
``m = 2`` every redundant mode runs 3 instances and ``none`` runs 2.

Without trained parity weights the parity instances run the deployed model itself on the
parity query: a parity model has the deployed architecture, so its latency is the same, and
latency is all this experiment measures (accuracy of rebuilt answers is not reported here).

A second part times the encoder and decoder per coding group at ParM's sizes (224x224x3 float
images, 1000-class outputs) beside a plain-numpy reference implementation of ParM's own
operation (sum of k images; parity minus the sum of the present outputs).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import sys
import threading
import time
import timeit
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import _cli
from benchmarks.report import (
    markdown_table,
    plot_latency_vs_load,
    plot_quantile_cdf,
    write_results,
)
from benchmarks.run_file import RunFile
from parityserve.bench.loadgen import (
    HttpSender,
    LoadResult,
    encode_bodies,
    json_sender,
    poisson_schedule,
    run_event_loop,
    run_open_loop,
)
from parityserve.bench.serverproc import ServerProcess, write_config

__all__ = [
    "Case",
    "add_arguments",
    "build_parser",
    "main",
    "build_cases",
    "collect_points",
    "estimate_runtime_s",
    "missing_runs",
    "run_seconds",
    "saved_runs",
    "fault_transitions",
    "gap_rows",
    "time_interleaved_us",
    "instance_names",
    "median_over_repeats",
    "pair_burst_events",
    "reference_decode",
    "reference_encode",
    "run",
    "serving_config",
]

MODES = ("none", "equal-resources", "replication", "parm", "berrut", "systematic-berrut")
PARM_REPORTED_US = {  # ParM paper (SOSP'19, §6): per-group encode / decode latency
    2: (93.0, 8.0), 3: (153.0, 14.0), 4: (193.0, 19.0)}

# Per model: source, default rates (q/s) and default burst delay (ms). The rates span light
# load up to the knee of the no-redundancy curve on a quiet 2-core machine, measured with
# bursts on (2,000 queries per point): ResNet-20's `none` p50 was 11-13 ms at 100 q/s,
# 21-86 ms at 200 and 1.3 s at 300, and its coded modes saturate the two cores above about
# 100 q/s (they compute more); the MLP's `none` stayed at 3-4.5 ms up to 600 q/s, where its
# 3-instance modes start to saturate the frontend's core.
MODELS: dict[str, dict[str, Any]] = {
    "resnet20": {"source": "zoo:resnet20", "rates": (50.0, 100.0, 200.0),
                 "delay_ms": 50.0, "dataset": "cifar10"},
    "mlp": {"source": "zoo:parm-mlp", "rates": (200.0, 400.0, 600.0),
            "delay_ms": 10.0, "dataset": "mnist"},
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", type=Path, help="datasets/weights ($PARITYSERVE_DATA)")
    p.add_argument("--models", default="resnet20,mlp", help="comma list of resnet20, mlp")
    p.add_argument("--modes", default=",".join(MODES),
                   help=f"comma list of {', '.join(MODES)}")
    p.add_argument("--ks", default="2,3,4", help="ParM group sizes k")
    p.add_argument("--deployed", type=int, default=2, help="deployed instances m")
    p.add_argument("--rates", help="offered loads, q/s (default: per model)")
    p.add_argument("--queries", type=int, default=20_000, help="queries per point")
    p.add_argument("--repeats", type=int, default=3, help="repetitions per point (medians)")
    p.add_argument("--burst-every-ms", type=float, default=250.0,
                   help="mean gap between bursts (Poisson)")
    p.add_argument("--burst-duration-ms", type=float, default=50.0)
    p.add_argument("--burst-delay-ms", type=float, help="added per batch (default: per model)")
    p.add_argument("--max-batch", type=int, default=1, help="batch size ceiling (ParM: 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--part", choices=["all", "load", "codec"], default="all",
                   help="the load experiment, the encoder/decoder timing, or both")
    p.add_argument("--codec-repeats", type=int, default=101,
                   help="timeit repetitions per codec operation (medians)")
    p.add_argument("--results-dir", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--quick", action="store_true",
                   help="2,000 queries per point, 1 repetition, 3 rates: checks the harness")
    p.add_argument("--resume", action="store_true",
                   help="reuse the runs that an interrupted run with the same settings already "
                        "measured (each run is saved as it ends, in RESULTS_DIR/tail-runs/, "
                        "which is committed so that a later session or machine can go on)")
    p.add_argument("--report-only", action="store_true",
                   help="measure nothing: write the report from the runs saved so far "
                        "(same settings), marked partial where repetitions are missing")
    p.add_argument("--recover-from", type=Path, metavar="REPORT.json",
                   help="the run file was lost: seed it from the per-run values an earlier "
                        "report of the same settings kept (flagged as recovered in the "
                        "report), then go on as --resume")
    p.add_argument("--cdf-rate", type=float,
                   help="the offered load whose latency CDF is plotted (default: the middle "
                        "rate; the top rate is often past the knee, where every CDF is a "
                        "backlog)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.quick:
        args.queries, args.repeats = min(args.queries, 2000), 1
        args.codec_repeats = min(args.codec_repeats, 21)
    if args.part in ("all", "codec"):
        _write_codec(bench_codec(args.codec_repeats), args)
    if args.part in ("all", "load"):
        from parityserve.models.datasets import resolve_data_dir

        data_dir = resolve_data_dir(args.data_dir)
        for name in _split(args.models):
            if name not in MODELS:
                raise SystemExit(f"unknown model {name!r}; use {', '.join(MODELS)}")
            _write_load(_bench_model(name, args, data_dir), args)
    return 0


# ---- pure helpers: cases, configs, bursts, statistics -----------------------------------
@dataclass(frozen=True)
class Case:
    """One deployment of the experiment: a redundancy mode and its instance count."""

    name: str  # e.g. "parm-k2"
    mode: str
    replicas: int  # the deployment's ``replicas`` (data instances before equal-resources)
    instances: int  # every instance it runs (data + parity, or plain replicas)
    redundancy: dict[str, Any] = field(default_factory=dict)
    parity: dict[str, Any] | None = None
    parity_instances: int = 0


def build_cases(modes: Sequence[str], ks: Sequence[int], deployed: int = 2) -> list[Case]:
    """The deployments to compare, resource-matched (see the module docstring)."""
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise ValueError(f"unknown modes {unknown}; use {', '.join(MODES)}")
    if deployed < 1:
        raise ValueError("deployed must be >= 1")
    m = deployed
    parity = {k: -(-m // k) for k in ks}
    matched = m + -(-m // 2)  # ParM k=2's count: replication and Berrut get the same
    cases: list[Case] = []
    for mode in MODES:
        if mode not in modes:
            continue
        if mode == "none":
            cases.append(Case("none", mode, m, m))
        elif mode == "equal-resources":
            for extra in sorted(set(parity.values())) or [matched - m]:
                name = "equal-resources" if len(set(parity.values())) <= 1 else \
                    f"equal-resources-{m + extra}"
                cases.append(Case(name, mode, m, m + extra,
                                  {"mode": mode, "extra": extra}))
        elif mode == "replication":
            cases.append(Case("replication-2", mode, matched, matched,
                              {"mode": mode, "d": 2}))
        elif mode == "parm":
            for k in ks:
                cases.append(Case(f"parm-k{k}", mode, m, m + parity[k], {"mode": "parm"},
                                  {"k": k, "replicas": parity[k]}, parity[k]))
        else:  # berrut, systematic-berrut: K = m batches coded onto m + 1 instances
            s = matched - m
            cases.append(Case(mode, mode, m + s, m + s, {"mode": mode, "K": m, "S": s}))
    return cases


def matched_baseline(case: Case, cases: Sequence[Case]) -> Case | None:
    """The equal-resources case with as many instances as ``case`` (None if not run)."""
    for other in cases:
        if other.mode == "equal-resources" and other.instances == case.instances:
            return other
    return None


def serving_config(case: Case, source: str, *, max_batch: int = 1) -> dict[str, Any]:
    """The deployment file for one case: model ``bench``, app ``bench``, cache off."""
    model: dict[str, Any] = {"name": "bench", "source": source, "replicas": case.replicas,
                             "batching": {"max_batch_size": max_batch}}
    if case.redundancy:
        model["redundancy"] = dict(case.redundancy)
    if case.parity is not None:
        model["parity"] = dict(case.parity)
    return {"server": {"http_port": 0, "cache_bytes": 0},
            "models": [model],
            "applications": [{"name": "bench", "models": ["bench"], "slo_ms": 60_000,
                              "default_output": -1}]}


def instance_names(case: Case) -> list[str]:
    """Admin-API replica names in slot order: data replicas, then parity replicas."""
    return [str(i) for i in range(case.instances - case.parity_instances)] + [
        f"parity0-{i}" for i in range(case.parity_instances)]


def pair_burst_events(slots: int, every_ms: float, horizon_s: float,
                      rng: np.random.Generator) -> list[tuple[float, tuple[int, int]]]:
    """Burst start times (Poisson, mean gap ``every_ms``) up to ``horizon_s``, each with a
    uniformly random pair of distinct slots (one slot if the cluster has only one)."""
    if slots < 1:
        raise ValueError("a cluster needs at least one slot")
    events: list[tuple[float, tuple[int, int]]] = []
    t = 0.0
    while True:
        t += float(rng.exponential(every_ms / 1000.0))
        if t >= horizon_s:
            return events
        if slots == 1:
            events.append((t, (0, 0)))
            continue
        a, b = rng.choice(slots, size=2, replace=False)
        events.append((t, (int(min(a, b)), int(max(a, b)))))


def fault_transitions(events: Sequence[tuple[float, tuple[int, int]]], duration_s: float,
                      instances: int) -> list[tuple[float, int, bool]]:
    """(time, slot, on) switches for the slots a deployment has, overlaps merged per slot."""
    windows: dict[int, list[list[float]]] = {}
    for start, pair in sorted(events):
        for slot in sorted(set(pair)):
            if slot >= instances:
                continue
            spans = windows.setdefault(slot, [])
            if spans and start <= spans[-1][1]:
                spans[-1][1] = max(spans[-1][1], start + duration_s)
            else:
                spans.append([start, start + duration_s])
    out = [(t, slot, on) for slot, spans in windows.items()
           for a, b in spans for t, on in ((a, True), (b, False))]
    return sorted(out, key=lambda x: (x[0], not x[2], x[1]))


def burst_fraction(transitions: Sequence[tuple[float, int, bool]], horizon_s: float) -> float:
    """Mean fraction of the horizon that each hit slot spent in a burst (0 if none)."""
    on: dict[int, float] = {}
    total: dict[int, float] = {}
    for t, slot, is_on in transitions:
        if is_on:
            on[slot] = t
        else:
            start = min(on.pop(slot), horizon_s)  # windows past the run count nothing
            total[slot] = total.get(slot, 0.0) + min(t, horizon_s) - start
    if not total or horizon_s <= 0:
        return 0.0
    return float(np.mean(list(total.values()))) / horizon_s


_MEDIANS = ("p50_ms", "p99_ms", "p999_ms", "mean_ms", "throughput_qps", "rebuilt_fraction",
            "send_lag_p99_ms", "steal_share", "steal_stalls", "clean_share", "clean_p50_ms",
            "clean_p99_ms", "clean_p999_ms", "frontend_cpu_us", "frontend_cores",
            "transport_ms_per_task", "worker_hold_ms")


RUN_OVERHEADS = ("frontend_cpu_us", "transport_ms_per_task", "worker_hold_ms")


def median_over_repeats(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One row per (case, rate): medians over repetitions, each run's values kept beside."""
    if not rows:
        raise ValueError("no rows to combine")
    out = dict(rows[0])
    for key in _MEDIANS:
        values = [float(r[key]) for r in rows if r.get(key) is not None]  # None: unmeasured
        if values:
            out[key] = float(np.median(values))
            out[f"{key}_runs"] = values
    # Each repetition's own overheads, by its number, for a replay of that very run (the
    # *_runs lists above skip a run without the value, so they need not line up).
    out["run_overheads"] = [{"rep": r.get("rep"), **{k: r.get(k) for k in RUN_OVERHEADS}}
                            for r in rows]
    out.pop("rep", None)
    out.pop("latency_quantiles_ms", None)  # a run's CDF, not the point's
    out.pop("recovered", None)
    out["errors"] = sum(int(r.get("errors", 0)) for r in rows)
    out["n"] = sum(int(r.get("n", 0)) for r in rows)
    if any(r.get("clean_n") is not None for r in rows):
        out["clean_n"] = sum(int(r.get("clean_n") or 0) for r in rows)
    out["repeats"] = len(rows)
    return out


def gap_rows(points: Sequence[dict[str, Any]], cases: Sequence[Case]) -> list[dict[str, Any]]:
    """Per point: the gap p99.9 - p50, and how it compares with the matched equal-resources.

    ``gap_reduction`` is gap(equal-resources) / gap(this case): 3.5 means a 3.5x smaller gap,
    ParM's headline. ``p50_ratio`` is p50(this) / p50(equal-resources), to read it "at the
    same median".
    """
    by_name = {c.name: c for c in cases}
    index = {(p["case"], p["rate"]): p for p in points}
    out = []
    for p in points:
        row = {**p, "gap_ms": p["p999_ms"] - p["p50_ms"], "baseline": None,
               "gap_reduction": None, "p50_ratio": None}
        case = by_name.get(p["case"])
        base = matched_baseline(case, cases) if case is not None else None
        ref = index.get((base.name, p["rate"])) if base is not None else None
        if ref is not None:
            gap, ref_gap = row["gap_ms"], ref["p999_ms"] - ref["p50_ms"]
            row["baseline"] = base.name if base is not None else None
            row["gap_reduction"] = ref_gap / gap if gap > 0 else None
            row["p50_ratio"] = p["p50_ms"] / ref["p50_ms"] if ref["p50_ms"] > 0 else None
        out.append(row)
    return out


def headline(gaps: Sequence[dict[str, Any]]) -> list[str]:
    """One line per case: its best and worst gap reduction over the rates."""
    lines = []
    for name in dict.fromkeys(r["case"] for r in gaps):
        rows = [r for r in gaps if r["case"] == name and r["gap_reduction"] is not None]
        if not rows or rows[0]["baseline"] == name:
            continue
        best = max(rows, key=lambda r: r["gap_reduction"])
        worst = min(rows, key=lambda r: r["gap_reduction"])
        lines.append(
            f"{name}: p99.9 - p50 gap {_times(best['gap_reduction'])} than {best['baseline']}"
            f" at best ({best['rate']:g} q/s: {best['gap_ms']:.2f} vs "
            f"{best['gap_ms'] * best['gap_reduction']:.2f} ms, p50 ratio "
            f"{best['p50_ratio']:.2f}), {_times(worst['gap_reduction'])} at worst "
            f"({worst['rate']:g} q/s)")
    return lines


def _times(reduction: float) -> str:
    return f"{reduction:.2f}x smaller" if reduction >= 1 else f"{1 / reduction:.2f}x larger"


def estimate_runtime_s(point_rates: Sequence[float], queries: int, server_starts: int, *,
                       startup_s: float = 20.0, per_point_s: float = 3.0) -> float:
    """Wall time of load points at ``point_rates`` (one entry per point to run): each
    point's schedule (queries / rate) with its warm-up and drain, plus the server starts."""
    return server_starts * startup_s + sum(queries / r + per_point_s for r in point_rates)


def count_rebuilt(results: Sequence[Any]) -> int:
    """Answers the server flags as reconstructed (ParM or Berrut decoding)."""
    return sum(1 for r in results if isinstance(r, dict) and r.get("reconstructed"))


# ---- the encoder/decoder microbenchmark ---------------------------------------------------
def reference_encode(queries: Sequence[np.ndarray]) -> np.ndarray:
    """ParM's encoder as plain numpy: the sum of the k queries."""
    out = queries[0] + queries[1] if len(queries) > 1 else queries[0].copy()
    for q in queries[2:]:
        out += q
    return out


def reference_decode(parity: np.ndarray, present: Sequence[np.ndarray]) -> np.ndarray:
    """ParM's subtraction decoder as plain numpy: parity output minus the present outputs."""
    out = parity - present[0] if present else parity.copy()
    for y in present[1:]:
        out -= y
    return out


@dataclass(frozen=True)
class Prepared:
    """An operation that needs fresh state each call: ``prepare()`` builds it, untimed, and
    only ``run(state)`` is timed (a coding group's last step, after its first k - 1 joins)."""

    prepare: Callable[[], Any]
    run: Callable[[Any], object]


Op = Callable[[], object] | Prepared


def _codec_ops(k: int, xs: list[np.ndarray], ys: list[np.ndarray]) -> dict[str, Op]:
    """The timed operations for one group; output 0 is the late one.

    Ours is what the serving path runs, ``ParmGroup``: its parity is summed as queries join
    (``encode_ours`` times the k-th join plus ``close``, the step between the group filling
    and its parity leaving; ``encode_ours_total`` the whole group's CPU, all k joins), and
    its decode takes the lean path of one late output and one parity output.
    """
    from parityserve.core.coding import LinearCode
    from parityserve.core.redundancy import ParmGroup

    code = LinearCode.addition(k)
    parity_y = reference_encode(ys)
    present = ys[1:]
    tiny = np.zeros((1, 1), dtype=np.float32)  # the decode touches outputs only

    def open_group() -> ParmGroup:
        group = ParmGroup(code)
        for x in xs[:-1]:
            group.add(x, 0.0)
        return group

    def last_joins(group: ParmGroup) -> list[np.ndarray]:
        group.add(xs[-1], 0.0)
        return group.close()

    def whole_group() -> list[np.ndarray]:
        return last_joins(open_group())

    def decodable() -> ParmGroup:
        group = ParmGroup(code)
        for _ in range(k):
            group.add(tiny, 0.0)
        group.close()
        for slot in range(1, k):
            group.arrive(slot, ys[slot])
        group.arrive_parity(0, parity_y)
        return group

    def rebuild(group: ParmGroup) -> object:
        return group.decode([0])

    np.testing.assert_allclose(whole_group()[0], reference_encode(xs), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(decodable().decode([0]).outputs[0], ys[0], rtol=1e-4, atol=1e-4)
    return {
        "encode_reference": lambda: reference_encode(xs),
        "encode_ours": Prepared(open_group, last_joins),
        "encode_ours_total": whole_group,
        "decode_reference": lambda: reference_decode(parity_y, present),
        "decode_ours": Prepared(decodable, rebuild),
    }


def _seconds(op: Op, number: int) -> float:
    """Total seconds ``number`` calls of ``op`` take (for a Prepared op, its runs only)."""
    if not isinstance(op, Prepared):
        return timeit.Timer(op).timeit(number)
    total = 0.0
    enabled = gc.isenabled()
    gc.disable()  # as timeit does for the plain operations: same conditions for both
    try:
        for _ in range(number):
            state = op.prepare()
            t0 = time.perf_counter()
            op.run(state)
            total += time.perf_counter() - t0
    finally:
        if enabled:
            gc.enable()
    return total


def time_interleaved_us(ops: dict[str, Op], repeats: int,
                        target_s: float = 0.005) -> dict[str, tuple[float, float]]:
    """timeit-style medians, microseconds per call, for several operations: calls per
    repetition calibrated to about ``target_s``, and the operations' repetitions interleaved
    (A, B, ..., then A again), so that on a shared machine load that comes and goes hits
    every operation alike instead of whichever happened to run at the time. Returns
    (median, minimum) per operation; the minimum is the least disturbed repetition."""
    numbers = {}
    for name, op in ops.items():
        number = 1
        while _seconds(op, number) < target_s and number < 100_000:
            number *= 2
        numbers[name] = number
    samples: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(repeats):
        for name, op in ops.items():
            samples[name].append(_seconds(op, numbers[name]) / numbers[name])
    return {name: (float(np.median(v)) * 1e6, float(np.min(v)) * 1e6)
            for name, v in samples.items()}


def bench_codec(repeats: int, ks: Sequence[int] = (2, 3, 4), *,
                image: tuple[int, ...] = (3, 224, 224), classes: int = 1000,
                seed: int = 0) -> dict[str, Any]:
    """Per group, batch size 1: ours (the serving path, ``ParmGroup``) beside the
    plain-numpy reference of ParM's op."""
    rng = np.random.default_rng(seed)
    rows = []
    for k in ks:
        xs = [rng.standard_normal((1, *image), dtype=np.float32) for _ in range(k)]
        ys = [rng.standard_normal((1, classes), dtype=np.float32) for _ in range(k)]
        row: dict[str, Any] = {"k": k}
        for name, (median, best) in time_interleaved_us(_codec_ops(k, xs, ys),
                                                        repeats).items():
            row[f"{name}_us"], row[f"{name}_min_us"] = median, best
        row["encode_parm_paper_us"], row["decode_parm_paper_us"] = PARM_REPORTED_US.get(
            k, (None, None))
        rows.append(row)
        print(f"  k={k}: encode ours {row['encode_ours_us']:.1f} us "
              f"(reference {row['encode_reference_us']:.1f}), decode ours "
              f"{row['decode_ours_us']:.1f} us "
              f"(reference {row['decode_reference_us']:.1f})", flush=True)
    return {"image_shape": list(image), "classes": classes, "dtype": "float32",
            "batch_size": 1, "repeats": repeats, "rows": rows, "loadavg_1m": _loadavg()}


# ---- the load experiment -------------------------------------------------------------------
def _split(text: str) -> list[str]:
    return [v.strip() for v in str(text).split(",") if v.strip()]


def _inputs(name: str, data_dir: Path) -> np.ndarray:
    from parityserve.models.datasets import load_cifar10, load_mnist

    if MODELS[name]["dataset"] == "cifar10":
        x, _ = load_cifar10("test", data_dir=data_dir)
    else:
        x, _ = load_mnist("test", data_dir=data_dir)
    return x[::10][:1000]


def _bench_model(name: str, args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    spec = MODELS[name]
    rates = [float(r) for r in _split(args.rates)] if args.rates else list(spec["rates"])
    if args.quick and not args.rates:
        rates = rates[:3]
    cases = build_cases(_split(args.modes), [int(k) for k in _split(args.ks)], args.deployed)
    delay = args.burst_delay_ms or spec["delay_ms"]
    slots = max(c.instances for c in cases)
    burst = {"model": "random pairs", "every_ms": args.burst_every_ms,
             "duration_ms": args.burst_duration_ms, "delay_ms": delay, "cluster_slots": slots}
    starts = args.repeats * len(cases)  # one server start per case and repetition
    estimate = estimate_runtime_s(list(rates) * starts, args.queries, starts)
    print(f"\n== tail: {name} ({spec['source']}), rates {rates} q/s, {args.queries} queries x "
          f"{args.repeats}, cases {[c.name for c in cases]}"
          + ("; report only ==" if args.report_only
             else f"; about {estimate / 3600:.1f} h in all =="), flush=True)
    started = time.monotonic()
    cdf_rate = args.cdf_rate if args.cdf_rate is not None else middle_rate(rates)
    fingerprint = {"model": name, "source": spec["source"], "queries": args.queries,
                   "burst": burst, "max_batch": args.max_batch, "seed": args.seed,
                   "deployed": args.deployed}
    saved = Checkpoint(checkpoint_path(args.results_dir, name, fingerprint, quick=args.quick),
                       fingerprint,
                       resume=args.resume or args.report_only or bool(args.recover_from))
    if args.recover_from:
        _recover(saved, args.recover_from, fingerprint)
    if saved.rows:
        print(f"resuming: {len(saved.rows)} runs already measured ({saved.path})", flush=True)
    if not args.report_only:
        _measure(name, spec["source"], cases, rates, saved, args, burst, data_dir)
    runs = saved_runs(saved, cases, rates, args.repeats)
    points = collect_points(runs)
    cdfs = {c.name: cdf for c in cases if (cdf := saved.cdf(c.name, cdf_rate)) is not None}
    if not points:
        raise SystemExit(f"no saved points for these settings in {saved.path}: run the "
                         "measurement first (without --report-only)")
    for point in points:
        _print_row(point)
    return {"model": name, "source": spec["source"], "rates": rates,
            "queries_per_point": args.queries, "repeats": args.repeats,
            "max_batch": args.max_batch, "deployed": args.deployed, "burst": burst,
            "seed": args.seed, "cases": [c.__dict__ for c in cases], "points": points,
            "gaps": gap_rows(points, cases), "cdf_rate": cdf_rate, "_cdfs": cdfs,
            "cdf_missing": [c.name for c in cases if c.name not in cdfs],
            "missing": missing_runs(runs, args.repeats),
            "recovered_runs": sum(1 for found in runs.values() for row in found
                                  if row.get("recovered")),
            "recovered_from": sorted({str(row["recovered"]) for found in runs.values()
                                      for row in found if row.get("recovered")}),
            "run_file": str(saved.path),
            "load_s": sum(run_seconds(row) for found in runs.values() for row in found),
            "estimated_s": estimate, "wall_s": time.monotonic() - started}


def _measure(name: str, source: str, cases: Sequence[Case], rates: Sequence[float],
             saved: Checkpoint, args: argparse.Namespace, burst: dict[str, Any],
             data_dir: Path) -> None:
    """Measure every (repetition, case, rate) not saved yet, one repetition of all cases at a
    time: a run stopped part way leaves every case at the same number of repetitions, so
    its partial report compares like with like, and each repetition gets a fresh server."""
    plan = [(rep, case, [rate for rate in rates if saved.get(case.name, rate, rep) is None])
            for rep in range(args.repeats) for case in cases]
    plan = [(rep, case, todo) for rep, case, todo in plan if todo]
    if not plan:
        return
    left = estimate_runtime_s([r for *_, todo in plan for r in todo], args.queries, len(plan))
    print(f"to measure: {sum(len(t) for *_, t in plan)} points, about {left / 3600:.1f} h",
          flush=True)
    bodies = encode_bodies(list(_inputs(name, data_dir)))
    configs = args.results_dir / ".work"  # rewritten by every run: not a result
    for rep, case, todo in plan:
        config = serving_config(case, source, max_batch=args.max_batch)
        path = write_config(config, configs / f"tail-{name}-{case.name}.yaml")
        with ServerProcess(path, data_dir=data_dir) as server:
            for rate in todo:
                row, lat = _point(server.url, case, bodies, rate, rep, args, burst)
                saved.put({**row, "latency_quantiles_ms": latency_quantiles_ms(lat)}, rep)


def saved_runs(saved: Checkpoint, cases: Sequence[Case], rates: Sequence[float],
               repeats: int) -> dict[tuple[str, float], list[dict[str, Any]]]:
    """The saved runs of every (case, rate), in report order (cases, then rates)."""
    return {(case.name, rate): [{**row, "rep": rep} for rep in range(repeats)
                                if (row := saved.get(case.name, rate, rep)) is not None]
            for case in cases for rate in rates}


def collect_points(runs: dict[tuple[str, float], list[dict[str, Any]]]
                   ) -> list[dict[str, Any]]:
    """The report's points: medians over the saved repetitions; a (case, rate) with no
    saved run is left out, not invented."""
    return [median_over_repeats(found) for found in runs.values() if found]


def missing_runs(runs: dict[tuple[str, float], list[dict[str, Any]]],
                 repeats: int) -> list[dict[str, Any]]:
    """Each (case, rate) short of its repetitions, and how many it has: a partial report
    says so instead of passing for a finished one."""
    return [{"case": case, "rate": rate, "repeats": len(found)}
            for (case, rate), found in runs.items() if len(found) < repeats]


def run_seconds(row: dict[str, Any]) -> float:
    """How long one point's load ran: its answers over its throughput."""
    throughput = float(row.get("throughput_qps") or 0.0)
    return float(row.get("n", 0)) / throughput if throughput > 0 else 0.0


def settings_key(fingerprint: dict[str, Any]) -> str:
    """A short, stable name for a run's settings: runs with other settings get another file."""
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:12]


def checkpoint_path(results_dir: Path, name: str, fingerprint: dict[str, Any], *,
                    quick: bool) -> Path:
    """Where a run's measured points live. A full run's file is a result, committed under
    ``tail-runs/``: the experiment outlasts one working session, and a fresh clone must be
    able to go on from it. A quick run's file is scratch (``.work/``, git-ignored)."""
    folder = results_dir / (".work" if quick else "tail-runs")
    return folder / f"tail-{name}-{settings_key(fingerprint)}.jsonl"


def middle_rate(rates: Sequence[float]) -> float:
    """The default CDF rate: the middle one. The top rate is often past the knee, where every
    mode's CDF is a backlog, and the lowest rarely shows a tail."""
    ordered = sorted(rates)
    return ordered[len(ordered) // 2]


# Each run keeps its latency CDF as quantiles on this grid rather than all its latencies: the
# committed run file stays small (about 7 kB a run) and a CDF plot needs no more.
CDF_PROBABILITIES: tuple[float, ...] = (
    *(round(0.001 * i, 3) for i in range(1, 1000)), 0.9995, 0.9999, 1.0)


def latency_quantiles_ms(latencies_s: np.ndarray | Sequence[float]) -> list[float] | None:
    """A run's latencies (seconds) as milliseconds at ``CDF_PROBABILITIES`` (None if none)."""
    lat = np.asarray(latencies_s, dtype=float)
    lat = lat[np.isfinite(lat)]
    if lat.size == 0:
        return None
    return [round(float(v) * 1e3, 3) for v in np.quantile(lat, CDF_PROBABILITIES)]


class Checkpoint(RunFile):
    """The finished runs of a load experiment by (case, rate, repetition); each row carries
    its own latency quantiles for the CDF plot."""

    def key_of(self, saved: dict[str, Any]) -> tuple[str, float, int]:
        row = saved["row"]
        return (row["case"], float(row["rate"]), int(saved["rep"]))

    def get(self, case: str, rate: float, rep: int) -> dict[str, Any] | None:
        return self.rows.get((case, float(rate), rep))

    def put(self, row: dict[str, Any], rep: int) -> None:
        self.append((row["case"], float(row["rate"]), rep), {"rep": rep}, row)

    def cdf(self, case: str, rate: float) -> list[float] | None:
        """The latency quantiles of the first repetition at ``rate`` that kept them."""
        found = [(key, row) for key, row in self.rows.items() if isinstance(key, tuple)]
        for (name, at, _), row in sorted(found, key=lambda kv: kv[0]):
            if name == case and at == float(rate) and row.get("latency_quantiles_ms"):
                return list(row["latency_quantiles_ms"])
        return None


# ---- recovering lost runs from a report --------------------------------------------------
_IDENTITY = ("case", "mode", "instances", "rate", "offered_qps")
_SETTINGS_IN_REPORT = {"model": "model", "source": "source", "queries": "queries_per_point",
                       "burst": "burst", "max_batch": "max_batch", "deployed": "deployed",
                       "seed": "seed"}


def recovered_runs(report: dict[str, Any], fingerprint: dict[str, Any], source: str
                   ) -> list[tuple[int, dict[str, Any]]]:
    """(repetition, row) for every run an earlier report kept, for a lost run file.

    A report keeps, per point, each run's p50, p99, p99.9, mean, throughput, rebuilt share
    and client lag (``*_runs``, in repetition order), and every other field of the first
    run only. So the first repetition's row is whole, and later ones carry just those values.
    A run's own error count is not kept: the point's total goes on its first repetition, so
    the report's sum stays exact. Its latencies were not kept either, so a recovered run has
    no CDF. Repetitions are numbered in order, which holds because runs are measured one
    repetition of every case at a time. Every row is marked ``recovered: source``.
    Raises ``ValueError`` when the report ran other settings (a report that predates keeping
    its seed is taken to have run the fingerprint's).
    """
    _check_settings(report, fingerprint)
    out: list[tuple[int, dict[str, Any]]] = []
    for point in report.get("points", []):
        reps = int(point["repeats"])
        base = {k: v for k, v in point.items() if not k.endswith("_runs") and k != "repeats"}
        for rep in range(reps):
            row = dict(base) if rep == 0 else {k: base[k] for k in _IDENTITY if k in base}
            for key in _MEDIANS:
                values = point.get(f"{key}_runs")
                if values is not None:
                    if len(values) != reps:
                        raise ValueError(f"{point['case']} at {point['rate']:g} q/s: {key} has "
                                         f"{len(values)} runs for {reps} repetitions")
                    row[key] = values[rep]
            row["n"] = int(point["n"]) // reps
            row["errors"] = int(point.get("errors", 0)) if rep == 0 else 0
            row["recovered"] = source
            out.append((rep, row))
    return out


def _check_settings(report: dict[str, Any], fingerprint: dict[str, Any]) -> None:
    for key, field_name in _SETTINGS_IN_REPORT.items():
        if field_name not in report and key == "seed":
            continue  # older reports did not keep their seed
        if json.loads(json.dumps(report.get(field_name))) != fingerprint.get(key):
            raise ValueError(f"the report ran {field_name} = {report.get(field_name)!r}, this "
                             f"run {key} = {fingerprint.get(key)!r}: runs of other settings "
                             "cannot be recovered into this one")


def _recover(saved: Checkpoint, report_path: Path, fingerprint: dict[str, Any]) -> None:
    try:
        report = json.loads(report_path.read_text())
        rows = recovered_runs(report, fingerprint, report_path.name)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"cannot recover runs from {report_path}: {exc}") from exc
    added = 0
    for rep, row in rows:
        if saved.get(row["case"], row["rate"], rep) is None:
            saved.put(row, rep)
            added += 1
    print(f"recovered {added} runs from {report_path} ({len(rows) - added} were saved already)",
          flush=True)


def _point(url: str, case: Case, bodies: list[bytes], rate: float, rep: int,
           args: argparse.Namespace, burst: dict[str, Any]
           ) -> tuple[dict[str, Any], np.ndarray]:
    seed = [args.seed, rep, int(rate * 1000)]
    horizon = args.queries / rate * 1.5 + 5.0
    events = pair_burst_events(burst["cluster_slots"], burst["every_ms"], horizon,
                               np.random.default_rng(seed))
    transitions = fault_transitions(events, burst["duration_ms"] / 1000.0, case.instances)
    injector = _Injector(url, instance_names(case), transitions,
                         {"delay_ms": burst["delay_ms"]})

    async def go() -> LoadResult:
        async with HttpSender(url, limit=256) as http:
            send = json_sender(http, "/bench/predict", bodies)
            for i in range(100):  # warm-up, unfaulted
                await send(i)
            schedule = poisson_schedule(rate, args.queries, np.random.default_rng(seed))
            injector.start()
            try:
                return await run_open_loop(
                    send, schedule, progress=f"{case.name} {rate:g} q/s #{rep + 1}",
                    rate_qps=rate, max_in_flight=10_000, timeout_s=60)
            finally:
                injector.stop()

    result = run_event_loop(go())
    s = result.summary()
    row = {"case": case.name, "mode": case.mode, "instances": case.instances, "rate": rate,
           **{k: v for k, v in s.items() if k != "errors"},
           "errors": sum(s["errors"].values()), "error_kinds": s["errors"],
           "rebuilt_fraction": count_rebuilt(result.results) / max(1, result.n),
           "fault_switches": injector.done, "fault_errors": injector.errors,
           "burst_fraction": burst_fraction(transitions, result.duration_s),
           "loadavg_1m": _loadavg()}
    return row, result.latencies_s[result.ok]


def _loadavg() -> float | None:
    """The machine's 1-minute load average after a point: other work shows in the tail."""
    try:
        return float(os.getloadavg()[0])
    except OSError:
        return None


class _Injector:
    """Plays the burst transitions through the admin API from a thread, then clears all."""

    def __init__(self, url: str, names: list[str], transitions: list[tuple[float, int, bool]],
                 faults: Mapping[str, Any]) -> None:
        self.url, self.names, self.transitions = url, names, transitions
        self.faults = dict(faults)  # what an instance gets while on (delay_ms, distribution...)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="burst-injector", daemon=True)
        self.done = 0
        self.errors = 0

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        from parityserve.client import Client

        with Client(self.url, timeout=10.0) as client:
            for t, slot, on in self.transitions:
                if self._stop.wait(max(0.0, self._t0 + t - time.perf_counter())):
                    break
                self._set(client, self.names[slot], on)
            for name in self.names:  # leave the deployment clean for the next point
                self._set(client, name, False)

    def _set(self, client: Any, name: str, on: bool) -> None:
        try:
            if on:
                client.set_faults("bench", name, **self.faults)
            else:
                client.set_faults("bench", name)
            self.done += 1
        except Exception:  # a failed switch is counted, never fatal to the run
            self.errors += 1


def _print_row(row: dict[str, Any]) -> None:
    print(f"  {row['case']:<22} {row['rate']:6.0f} q/s  p50 {row['p50_ms']:8.3f}  "
          f"p99 {row['p99_ms']:8.3f}  p99.9 {row['p999_ms']:8.3f} ms  "
          f"rebuilt {row['rebuilt_fraction']:.1%}  errors {row['errors']}", flush=True)


# ---- output ---------------------------------------------------------------------------------
_LOAD_COLUMNS = [("case", "case", "s"), ("instances", "instances", "d"),
                 ("rate", "offered q/s", ".0f"), ("throughput_qps", "q/s", ".0f"),
                 ("p50_ms", "p50 ms", ".2f"), ("p99_ms", "p99 ms", ".2f"),
                 ("p999_ms", "p99.9 ms", ".2f"), ("gap_ms", "p99.9-p50 ms", ".2f"),
                 ("gap_reduction", "gap: equal-res / this", ".2f"),
                 ("p50_ratio", "p50 / equal-res", ".2f"),
                 ("rebuilt_fraction", "rebuilt", ".1%"),
                 ("burst_fraction", "time in burst", ".1%"),
                 ("send_lag_p99_ms", "client lag p99 ms", ".1f"), ("errors", "errors", "d")]


def _result_name(kind: str, args: argparse.Namespace) -> str:
    return f"tail-quick-{kind}" if args.quick else f"tail-{kind}"


def _write_load(report: dict[str, Any], args: argparse.Namespace) -> None:
    name = _result_name(report["model"], args)
    cdfs = report.pop("_cdfs")
    series = {}
    for case in dict.fromkeys(p["case"] for p in report["points"]):
        series[case] = [(p["rate"], p["p50_ms"], p["p99_ms"], p["p999_ms"])
                        for p in report["points"] if p["case"] == case]
    latency_png = plot_latency_vs_load(
        series, args.results_dir / f"{name}-latency.png",
        f"{report['source']}: latency vs load, random-pair bursts")
    lacking = report["cdf_missing"]
    cdf_png = plot_quantile_cdf(
        cdfs, CDF_PROBABILITIES, args.results_dir / f"{name}-cdf.png",
        f"{report['source']}: latency CDF at {report['cdf_rate']:g} q/s",
        note=f"no latencies kept: {', '.join(lacking)}" if lacking else None)
    report["headline"] = headline(report["gaps"])
    report["plots"] = [latency_png.name, cdf_png.name]
    paths = write_results(name, report, results_dir=args.results_dir,
                          markdown=_load_markdown(report, args))
    print(f"\nwrote {paths['json']}, {paths['md']}, {latency_png}, {cdf_png}")
    print("\n".join(report["headline"]))


def _load_markdown(r: dict[str, Any], args: argparse.Namespace) -> str:
    b = r["burst"]
    cases = "\n".join(
        f"- `{c['name']}`: {c['instances']} instances ({_describe_case(c)})" for c in r["cases"])
    quick = ("\n\n**Quick run**: a harness check with few queries and one repetition; "
             "p99.9 rests on a handful of queries per point. Not a result to quote."
             if args.quick else "")
    loads = [p["loadavg_1m"] for p in r["points"] if p.get("loadavg_1m") is not None]
    if loads:
        quick += (f" The machine's 1-minute load average after each point ranged "
                  f"{min(loads):.1f} to {max(loads):.1f} on {os.cpu_count()} CPUs: anything "
                  "above the CPU count means other processes competed for them.")
    quick += _partial_note(r) + _recovered_note(r)
    thin = [f"{p['case']} at {p['rate']:g} q/s" for p in r["points"]
            if not p.get("p999_reliable", True)]
    if thin:
        quick += f" p99.9 is only the maximum (under 1,000 answers) for: {', '.join(thin)}."
    return f"""## Setup

{r['source']}, real worker processes behind the real frontend (cache off), batch size {r['max_batch']}, {r['deployed']} deployed instances. Open-loop Poisson load at {', '.join(f'{x:g}' for x in r['rates'])} q/s, {r['queries_per_point']} queries per point, {r['repeats']} repetition(s) (medians shown; each run's values are in the JSON). The load ran {r['load_s'] / 60:.0f} min in all (the points' runs summed; server starts and warm-ups excluded).{quick}

**Burst model (random pairs, emulating ParM's background shuffles):** bursts start as a Poisson process with mean gap {b['every_ms']:g} ms; each picks a uniformly random pair of the {b['cluster_slots']} instance slots, and both instances add {b['delay_ms']:g} ms to every batch they serve for {b['duration_ms']:g} ms (set and cleared through the admin API, `POST /admin/models/bench/faults`; overlapping bursts on one instance merge). Slots a smaller deployment lacks are not hit, so every mode sees the same per-slot timeline, seeded by (seed, repetition, rate). `time in burst` is the mean share of the run each hit instance spent in a burst.

Parity instances run the deployed model itself on the parity query (no trained parity weights are deployed): a parity model has the deployed architecture, so its latency is the same, and latency is all this experiment measures; the rebuilt answers' accuracy is not meaningful here and is not reported.

Cases (resource-matched: equal instance counts compare like for like):

{cases}

## Latency

{markdown_table(r['gaps'], _LOAD_COLUMNS)}

`gap: equal-res / this` is gap(equal-resources with the same instance count) / gap(this case), where gap = p99.9 - p50: above 1 means a smaller gap than equal-resources. ParM's headline is up to 3.5x at the same median (`p50 / equal-res` near 1). `rebuilt`: answers decoded from parity (ParM) or from a Berrut code (Berrut decodes every answer). `client lag p99`: how late the load generator itself sent its queries (p99); it counts in the latency, and a large value means the client was starved of CPU, so that point measures the machine, not the mode.

## Headline
{_partial_warning(r)}
{chr(10).join('- ' + line for line in r['headline']) or '- (no equal-resources baseline run)'}

Plots: `{r['plots'][0]}` (p50 solid, p99 dashed, p99.9 dotted, against offered load) and `{r['plots'][1]}` (CDF at {r['cdf_rate']:g} q/s, first repetition)."""  # noqa: E501


def _partial_note(r: dict[str, Any]) -> str:
    missing = r.get("missing") or []
    if not missing:
        return ""
    listed = "; ".join(f"{m['case']} at {m['rate']:g} q/s: {m['repeats']} of {r['repeats']}"
                       for m in missing)
    return (f"\n\n**Partial run**: {len(missing)} of {len(r['cases']) * len(r['rates'])} "
            f"points have fewer than {r['repeats']} repetitions ({listed}). Their medians "
            "are over the repetitions measured, and a point with none is left out. "
            "`--resume` measures the rest.")


def _recovered_note(r: dict[str, Any]) -> str:
    recovered = r.get("recovered_runs", 0)
    if not recovered:
        return ""
    total = sum(p["repeats"] for p in r["points"])
    named = ", ".join(f"`{s}`" for s in r.get("recovered_from", [])) or "an earlier report"
    return (f"\n\n**Recovered runs**: {recovered} of {total} runs were recovered from {named} "
            "after their run file was lost (`--recover-from`). Their p50, p99, p99.9, mean, "
            "throughput, rebuilt share and client lag are exact; their other fields come from "
            "the first repetition of their point, their errors are counted on it, and their "
            "latencies were not kept (the CDF uses the first repetition that kept them).")


def _partial_warning(r: dict[str, Any]) -> str:
    if not r.get("missing"):
        return ""
    return ("\n**Not a result yet**: this partial run compares medians over different numbers "
            "of repetitions (one run decides a point with one repetition), so a single "
            "disturbed run can flip a ratio. Quote these after `--resume` completes them.\n")


def _describe_case(c: dict[str, Any]) -> str:
    red = c["redundancy"]
    if c["mode"] == "none":
        return "no redundancy"
    if c["mode"] == "equal-resources":
        return f"{c['replicas']} + {red['extra']} plain replicas"
    if c["mode"] == "replication":
        return f"every batch to d = {red['d']} replicas, first answer wins"
    if c["mode"] == "parm":
        return (f"k = {c['parity']['k']}: {c['replicas']} deployed + "
                f"{c['parity_instances']} parity")
    return f"K = {red['K']}, S = {red['S']}"


_CODEC_COLUMNS = [("k", "k", "d"),
                  ("encode_reference_us", "encode: ParM op, numpy (us)", ".1f"),
                  ("encode_ours_us", "encode: ours, after the k-th query (us)", ".1f"),
                  ("encode_ours_total_us", "encode: ours, whole group CPU (us)", ".1f"),
                  ("encode_parm_paper_us", "encode: ParM paper (us)", ".0f"),
                  ("decode_reference_us", "decode: ParM op, numpy (us)", ".1f"),
                  ("decode_ours_us", "decode: ours (us)", ".1f"),
                  ("decode_parm_paper_us", "decode: ParM paper (us)", ".0f")]


def codec_verdicts(rows: Sequence[dict[str, Any]], stat: str = "") -> list[str]:
    """Ours (the serving path, ``ParmGroup``) against the reference and ParM's reported numbers.

    ``stat`` "" compares medians, "min" the least disturbed repetitions."""
    out = []
    suffix = f"_{stat}_us" if stat else "_us"
    for r in rows:
        for op in ("encode", "decode"):
            ours, ref = r[f"{op}_ours{suffix}"], r[f"{op}_reference{suffix}"]
            paper = r.get(f"{op}_parm_paper_us")
            vs_paper = "" if paper is None else (
                f" ParM reported {paper:g} us on its hardware: ours is "
                f"{'faster' if ours < paper else 'slower'} than that here.")
            speed = (f"{ref / ours:.2f}x faster" if ours < ref else
                     f"{ours / ref:.2f}x slower. Why: {_WHY_SLOWER[op]}")
            total = r.get(f"{op}_ours_total{suffix}")
            cpu = "" if total is None else (
                f" (the whole group's CPU, all k queries summed as they joined: "
                f"{total:.1f} us, {total / ref:.2f}x the reference's)")
            out.append(f"k={r['k']} {op}{' (best of)' if stat else ''}: ours {ours:.1f} us"
                       f"{cpu}, ParM's op in plain numpy {ref:.1f} us: {speed}.{vs_paper}")
    return out


_WHY_SLOWER = {
    "encode": "after the k-th query ours does one float32 addition in place, the reference "
              "k - 1 into a new array; at k = 2 that is the same addition, plus ours' shape "
              "and dtype checks and the group's bookkeeping",
    "decode": "at 1,000 floats one subtraction takes about a microsecond; ours adds a fixed "
              "cost per call in Python (the group's shape, dtype and finite checks and its "
              "bookkeeping), which dominates at this size",
}


def _write_codec(report: dict[str, Any], args: argparse.Namespace) -> None:
    name = "tail-codec-quick" if args.quick else "tail-codec"
    report["verdicts"] = codec_verdicts(report["rows"])
    report["verdicts_best_of"] = codec_verdicts(report["rows"], "min")
    best_cols = [(key.replace("_us", "_min_us") if key.endswith("_us") and "paper" not in key
                  else key, head, fmt) for key, head, fmt in _CODEC_COLUMNS]
    load = report.get("loadavg_1m")
    load_note = "" if load is None else (
        f" The machine's 1-minute load average at the end was {load:.1f} on {os.cpu_count()} "
        "CPUs shared with other work, so single repetitions vary by several times; the "
        "minimum (second table) is the least disturbed repetition.")
    shape = "x".join(map(str, report["image_shape"]))
    md = f"""## Encoder and decoder latency per coding group

One group at ParM's sizes: k float32 images of {shape} (batch size 1) encoded into one parity query; one missing {report['classes']}-class float32 output rebuilt from the parity output and the k - 1 present outputs. Median of {report['repeats']} repetitions (each calibrated to about 5 ms of calls; the operations' repetitions interleaved, so that load from other processes on this shared machine hits them alike), in microseconds per group, all measured in this run on this machine.{load_note}

- **ParM op, numpy**: a plain reference of ParM's operation (sum of the k arrays; parity output minus the present outputs), float32 throughout, no checks.
- **ours**: what the serving path runs, `ParmGroup` with the sum code. Its parity is summed as the queries join the group, so **after the k-th query** only that query's addition (in place) and `close` remain: that is the latency between the group filling and its parity leaving, timed with the first k - 1 joins done beforehand, untimed. **Whole group CPU** times all k joins and `close`: the total work, to set beside the reference's. The decode is the group's lean path for one late output and one parity output; it checks shapes, dtypes and that the rebuilt output is finite (anything unusual falls back to the validating path, which names the problem), and returns a fresh array.
- **ParM paper**: the numbers ParM reports (SOSP'19) on its own hardware, for scale only.

Medians:

{markdown_table(report['rows'], _CODEC_COLUMNS)}

Minimum over the repetitions:

{markdown_table(report['rows'], best_cols)}

## Verdicts

{chr(10).join('- ' + v for v in report['verdicts'])}

Best of the repetitions:

{chr(10).join('- ' + v for v in report['verdicts_best_of'])}"""  # noqa: E501
    paths = write_results(name, report, results_dir=args.results_dir, markdown=md)
    print(f"wrote {paths['json']}, {paths['md']}")

# ---- python -m benchmarks.tail -------------------------------------------------------------------

DESCRIPTION = ("Open-loop Poisson load on real workers (ResNet-20 on CIFAR-10, the ParM "
               "MNIST MLP) with bursts of delay on random pairs of instances; p50, p99 "
               "and p99.9 for none, equal-resources, replication, ParM (k = 2, 3, 4), "
               "Berrut and systematic Berrut, resource-matched; plus encoder and decoder "
               "latency per group at ParM's sizes beside a numpy reference.")
EXAMPLES = (
    ('python -m benchmarks.tail --part codec',
     'encoder/decoder latency only (25 s)'),
    ('python -m benchmarks.tail --part load --models mlp --quick',
     'check the harness (minutes)'),
    ('python -m benchmarks.tail --part load --models mlp',
     'the MLP table (1 h 20 min)'),
    ('python -m benchmarks.tail --part load --models resnet20 --resume',
     'ResNet-20, going on from the runs saved so far (about 5 h in all)'),
)


def build_parser() -> argparse.ArgumentParser:
    return _cli.build_parser("tail", DESCRIPTION, _cli.examples(EXAMPLES), add_arguments)


def main(argv: Sequence[str] | None = None) -> int:
    return _cli.main(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
