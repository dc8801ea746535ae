"""``python -m benchmarks.serf_noise``: the noise floor any latency model faces on this machine.

Issue 18 asks SERF's Eq. 13 to predict measured mean latency within mean ≤ 3%, p90 ≤ 8% and
p95 ≤ 10% relative error, and to report honestly where this shared 2-core VM makes that
impossible. Two measurements say how far a prediction can get here at all:

1. **repeatability** (per model, through the real server, exactly as ``benchmarks.serf``'s
   accuracy part: the same profile step, cases, warm-up, 10% dropped): configurations
   (c=1, intra=1), (c=2, intra=1), (c=1, intra=2), (c=3, intra=1) at every other load level
   (k = 1, 3, 5, 7, 9 of serf's 10), those that are stable. Each case is measured
   ``--repeats`` times with a different Poisson seed each time; repetition is the outer loop
   and the cases are shuffled within it, so drift hits them alike. The **oracle error** of a
   case is |m_r − m_s| / m_s over every ordered pair of distinct repetitions: how well a
   second run of the very same case "predicts" the first. It sits beside Eq. 13's error
   (plus the profiled overhead, as serf predicts) against each repetition.
2. **cold** (in-process, no server, one thread): the compute time of one ``predict`` after
   sleeping g ms, g in 0 … 50, gaps interleaved in shuffled rounds; and a socketpair
   ping-pong between two processes after the same gaps (the wake-up cost alone). A closed-
   loop profile only ever sees g = 0.

Time on this machine (2 cores): ``--quick`` (ResNet-20, 2 repetitions of 400 queries, 3
levels, 20 cold calls per gap) takes about 2 min. The full run took 50.3 min on 2026-11-25
(ResNet-20 about 20 min, ResNet-56 about 30; 3 repetitions of 2,000 queries, where the
lowest level's runs at λ_1 dominate, plus server starts, profiles and the cold calls). The
profile sets the rates, so one taken while the machine is slow (lower λ_max) makes every run
longer; the estimate printed after each profile says how long that model will take, and
``--models resnet20``, then ``--resume`` with both, splits the run.
"""

from __future__ import annotations

import argparse
import math
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import _cli
from benchmarks.report import (
    colours,
    command_line,
    markdown_table,
    new_figure,
    save_figure,
    write_results,
)
from benchmarks.serf import (
    MODELS,
    _accuracy_run,
    _case_row,
    _configure,
    _data_dir,
    _inputs,
    _profile,
    _Runs,
    _settings,
    _split,
    add_profile_arguments,
    kept_latencies,
    profile_cases,
    serving_config,
)
from benchmarks.serf_analysis import Case
from benchmarks.serf_noise_analysis import (
    CONFIGS,
    FULL_LEVELS,
    QUICK_LEVELS,
    TARGETS,
    case_summary,
    cold_plan,
    drift,
    estimate_seconds,
    fingerprint,
    gap_summary,
    measurement_order,
    model_summary,
    parse_configs,
    poisson_seed,
    run_key,
    select_cases,
)
from parityserve.bench.loadgen import encode_bodies, poisson_schedule
from parityserve.bench.serverproc import ServerProcess, write_config
from parityserve.errors import ConfigError

__all__ = ["add_arguments", "build_parser", "main", "run"]

NAME = "serf-noise"
DEFAULT_RESULTS = Path("benchmarks/results/serf-noise")
DEFAULT_MODELS = "resnet20,resnet56"
PARTS = ("repeatability", "cold")
RUN_OVERHEAD_S = 1.0  # per run beyond its queries (reconfigure, warm-up); 0.34 s measured
COLD_WARMUP = 30  # untimed calls before the cold part's timed ones
# The other end of the ping-pong: a fresh interpreter that echoes every byte back.
_ECHO = ("import socket, sys\n"
         "s = socket.socket(fileno=int(sys.argv[1]))\n"
         "while True:\n"
         "    b = s.recv(1)\n"
         "    if not b:\n"
         "        break\n"
         "    s.sendall(b)\n")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", default=DEFAULT_MODELS,
                   help="comma-separated, from: " + ", ".join(MODELS))
    p.add_argument("--parts", default=",".join(PARTS),
                   help="comma-separated, from: repeatability (each case measured again "
                        "and again through the server), cold (one predict after an idle "
                        "gap, in-process)")
    p.add_argument("--repeats", type=int, default=3,
                   help="measured runs of every case (at least 2: the oracle needs a pair)")
    p.add_argument("--queries", type=int, default=2000,
                   help="queries per run, as serf's accuracy part (the first 10%% dropped)")
    p.add_argument("--levels", type=int, default=10,
                   help="serf's load grid: λ_k = k·λ_max/(levels+1), k = 1..levels")
    p.add_argument("--pick-levels", default=",".join(map(str, FULL_LEVELS)),
                   help="the k of that grid that are measured")
    p.add_argument("--configs", default=",".join(f"{c.c}/{c.intra}" for c in CONFIGS),
                   help="c/intra pairs measured, where stable at a level")
    add_profile_arguments(p)
    p.add_argument("--gaps-ms", default="0,0.5,1,2,5,10,20,50",
                   help="cold part: idle gaps before a call, in ms (must include 0)")
    p.add_argument("--cold-calls", type=int, default=60,
                   help="cold part: timed calls per gap and series")
    p.add_argument("--cold-per-visit", type=int, default=4,
                   help="cold part: calls per visit of a gap within a shuffled round")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run (<= 10 min): ResNet-20 only, 2 repetitions of 400 "
                        "queries, levels 1,5,9, 20 cold calls per gap; results in "
                        "serf-noise-quick")
    p.add_argument("--resume", action="store_true",
                   help="keep the runs already measured under the same settings")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS,
                   help="where results and the resumable run files go")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    _apply_quick(args)
    models, parts, configs, levels, gaps = _check(args)
    data_dir = _data_dir(args.data_dir)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    command = command_line()
    cold = _cold(models, gaps, args, data_dir) if "cold" in parts else None
    reports = {}
    if "repeatability" in parts:
        reports = {m: _repeatability(m, configs, levels, args, data_dir) for m in models}
    doc = {"models": reports, "cold": cold, "targets": TARGETS, "settings": _settings(args),
           "wall_s": time.monotonic() - started}
    write_results(NAME, doc, results_dir=args.results_dir, markdown=_markdown(doc, args),
                  command=command)
    for name, report in reports.items():
        _plot_errors(report, args.results_dir / f"{NAME}-errors-{name}.png")
    if cold:
        _plot_cold(cold, args.results_dir / f"{NAME}-cold.png")
    print(f"\nresults in {args.results_dir}/{NAME}.md ({doc['wall_s'] / 60:.1f} min)",
          flush=True)
    return 0


def _apply_quick(args: argparse.Namespace) -> None:
    if not args.quick:
        return
    if args.models == DEFAULT_MODELS:
        args.models = "resnet20"
    if args.results_dir == DEFAULT_RESULTS:  # a smoke run never mixes with the real one
        args.results_dir = DEFAULT_RESULTS.with_name(f"{NAME}-quick")
    args.repeats = min(args.repeats, 2)
    args.queries = min(args.queries, 400)
    if args.pick_levels == ",".join(map(str, FULL_LEVELS)):
        args.pick_levels = ",".join(map(str, QUICK_LEVELS))
    args.cold_calls = min(args.cold_calls, 20)


def _check(args: argparse.Namespace
           ) -> tuple[list[str], set[str], tuple[Any, ...], list[int], list[float]]:
    """The parsed lists, or a ConfigError that says which flag is wrong and how."""
    models, parts = _split(args.models), set(_split(args.parts))
    if not models or any(m not in MODELS for m in models):
        raise ConfigError(f"--models {args.models!r}: choose from {', '.join(MODELS)}")
    if not parts or parts - set(PARTS):
        raise ConfigError(f"--parts {args.parts!r}: choose from {', '.join(PARTS)}")
    if args.repeats < 2:
        raise ConfigError(f"--repeats {args.repeats}: the oracle needs at least 2 runs a case")
    if args.queries < 20:
        raise ConfigError(f"--queries {args.queries}: at least 20 (the first 10% is dropped)")
    try:
        configs = parse_configs(args.configs)
        levels = [int(k) for k in _split(args.pick_levels)]
        gaps = sorted({float(g) for g in _split(args.gaps_ms)})
    except ValueError as exc:
        raise ConfigError(f"--configs, --pick-levels or --gaps-ms: {exc}") from exc
    if not levels or any(not 1 <= k <= args.levels for k in levels):
        raise ConfigError(f"--pick-levels {args.pick_levels!r}: each k in 1..{args.levels}")
    if not gaps or gaps[0] != 0.0 or gaps[-1] > 1000:
        raise ConfigError(f"--gaps-ms {args.gaps_ms!r}: include 0 (the back-to-back "
                          "reference), none above 1000")
    if args.cold_calls < 1 or args.cold_per_visit < 1:
        raise ConfigError("--cold-calls and --cold-per-visit must be >= 1")
    return models, parts, configs, levels, gaps


# ---- part 1: repeatability ----
def _repeatability(name: str, configs: Sequence[Any], levels: Sequence[int],
                   args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    spec = MODELS[name]
    bodies = encode_bodies(list(_inputs(spec["dataset"], data_dir)))
    config = write_config(serving_config(spec["source"], args.max_c,
                                         oversubscribe=args.oversubscribe),
                          args.results_dir / ".work" / f"{NAME}-{name}.yaml")
    saved = _Runs(args.results_dir / f"{NAME}-{name}-runs.jsonl",
                  fingerprint(name, _settings(args)), resume=args.resume)
    print(f"\n== serf-noise repeatability: {name} ({spec['source']}) ==", flush=True)
    with ServerProcess(config, data_dir=data_dir) as server:
        profile = _profile(server.url, name, args, saved)
        _, _, cases, _ = profile_cases(profile, args)
        chosen, missing = select_cases(cases, configs, levels)
        if not chosen:
            raise ConfigError(f"{name}: no stable case among --configs {args.configs} at "
                              f"--pick-levels {args.pick_levels}")
        _measure(server.url, chosen, bodies, args, saved)
    runs = {c.key: [saved.rows[run_key(c.key, r)] for r in range(args.repeats)]
            for c in chosen}
    summaries = [case_summary(reps) for reps in runs.values()]
    return {"model": name, "source": spec["source"],
            "profile": {k: profile.get(k) for k in ("rates", "cores", "wall_s", "file")},
            "cases": summaries, "missing": missing, "summary": model_summary(summaries),
            "runs": [{k: v for k, v in row.items() if k != "latencies_us"}
                     for reps in runs.values() for row in reps]}


def _measure(url: str, chosen: Sequence[Case], bodies: list[bytes],
             args: argparse.Namespace, saved: _Runs) -> None:
    order = measurement_order(chosen, args.repeats, args.seed)
    todo = [(rep, case) for rep, case in order if saved.get(run_key(case.key, rep)) is None]
    eta = estimate_seconds([case for _, case in todo], args.queries, 1, RUN_OVERHEAD_S)
    print(f"repeatability: {len(chosen)} cases x {args.repeats} repetitions = {len(order)} "
          f"runs ({len(order) - len(todo)} already measured); about {eta / 60:.0f} min to go",
          flush=True)
    for i, (rep, case) in enumerate(todo, start=1):
        started = time.monotonic()
        _configure(url, case.config)
        rng = np.random.default_rng(poisson_seed(args.seed, case, rep))
        label = f"c={case.config.c} intra={case.config.intra} λ{case.level}={case.rate:.0f}/s"
        result = _accuracy_run(url, bodies, poisson_schedule(case.rate, args.queries, rng),
                               f"{label} #{rep + 1}", args)
        row = _case_row(case, result, time.monotonic() - started)
        row["rep"] = rep
        row["latencies_us"] = np.rint(kept_latencies(result) * 1e6).astype(int).tolist()
        saved.put(run_key(case.key, rep), row)
        print(f"[{i}/{len(todo)}] repetition {rep + 1}, {label}: mean "
              f"{row['measured_ms']:.2f} ms, Eq. 13 {row['predicted_ms']:.2f} ms "
              f"({row['wall_s']:.0f} s)", flush=True)


# ---- part 2: cold ----
def _cold(models: Sequence[str], gaps: Sequence[float], args: argparse.Namespace,
          data_dir: Path) -> dict[str, Any]:
    """Per model, and for the socketpair: the time of a call after each idle gap."""
    saved = _Runs(args.results_dir / f"{NAME}-cold-runs.jsonl",
                  {"gaps_ms": list(gaps), "calls": args.cold_calls,
                   "per_visit": args.cold_per_visit, "seed": args.seed}, resume=args.resume)
    print(f"\n== serf-noise cold: gaps {', '.join(f'{g:g}' for g in gaps)} ms, "
          f"{args.cold_calls} calls each ==", flush=True)
    series: dict[str, Any] = {}
    for i, name in enumerate([*models, "socketpair"]):
        if saved.get(name) is None:
            rng = np.random.default_rng([args.seed, 23, i])
            plan = cold_plan(gaps, args.cold_calls, args.cold_per_visit, rng)
            call = _pingpong if name == "socketpair" else _predictor(name, data_dir, rng)
            times, slept = call(plan)
            rows = gap_summary(plan, times, slept)
            moved = drift(plan, times)
            saved.put(name, {"rows": rows, "drift": moved, "plan_ms": plan,
                             "times_us": np.rint(np.asarray(times) * 1e6).astype(int).tolist()})
            ratios = ", ".join(f"{r['gap_ms']:g}: {r['median_ratio']:.2f}x" for r in rows)
            print(f"{name}: median ÷ back-to-back by gap (ms) {ratios}; back-to-back visits "
                  f"{moved['min_ms']:.3f}-{moved['max_ms']:.3f} ms", flush=True)
        series[name] = saved.rows[name]
    return {"gaps_ms": list(gaps), "calls_per_gap": args.cold_calls,
            "per_visit": args.cold_per_visit, "series": series}


Timings = tuple[list[float], list[float]]  # per call in plan order: its time, time slept


def _timed(plan: Sequence[float], call: Callable[[], object]) -> Timings:
    """Sleep each planned gap (ms), then time ``call``; the call times and the time slept."""
    times: list[float] = []
    slept: list[float] = []
    for gap in plan:
        before = time.perf_counter()
        if gap > 0:
            time.sleep(gap / 1e3)
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
        slept.append(start - before)
    return times, slept


def _predictor(name: str, data_dir: Path, rng: np.random.Generator
               ) -> Callable[[Sequence[float]], Timings]:
    """The model loaded as a worker loads it (one thread), and a random input shaped as
    one query of its dataset (CIFAR-10: 1x3x32x32)."""
    from parityserve.models.loader import load_model

    spec = MODELS[name]
    model = load_model(spec["source"], data_dir=data_dir, threads=1)
    shape = (1, *_inputs(spec["dataset"], data_dir).shape[1:])
    x = rng.standard_normal(shape).astype(np.float32)

    def measure(plan: Sequence[float]) -> Timings:
        for _ in range(COLD_WARMUP):
            model.predict(x)
        return _timed(plan, lambda: model.predict(x))

    return measure


def _pingpong(plan: Sequence[float]) -> Timings:
    """One byte to an echoing process and back over a socketpair, after each gap."""
    mine, theirs = socket.socketpair()
    echo = subprocess.Popen([sys.executable, "-c", _ECHO, str(theirs.fileno())],
                            pass_fds=(theirs.fileno(),))
    theirs.close()
    try:
        def round_trip() -> None:
            mine.sendall(b"x")
            if mine.recv(1) != b"x":
                raise RuntimeError("the echo process answered something else")

        for _ in range(COLD_WARMUP * 10):
            round_trip()
        return _timed(plan, round_trip)
    finally:
        mine.close()
        echo.wait(timeout=10)


# ---- report ----
def _pct(value: float) -> str:
    return f"{value:.1%}"


def _markdown(doc: dict[str, Any], args: argparse.Namespace) -> str:
    parts = [
        "Machine: the shared 2-core VM; the load generator, the frontend and the workers "
        "share both cores.", "",
        f"**Oracle error**: each case is measured {args.repeats} times ({args.queries} "
        "open-loop Poisson queries a run, another seed each time, the first 10% dropped as in "
        "serf's accuracy part; repetition is the outer loop and the cases are shuffled within "
        "it). For every ordered pair of distinct runs (r, s) of a case, |m_r − m_s| / m_s: "
        "how well one run of the very same case predicts another. No model fed by a separate "
        "measurement can be expected to beat it, in the typical case; it is not a strict "
        "bound, since an error relative to the measured value is at most 100% for a "
        "prediction below it and unbounded above, so where runs differ by multiples (near "
        "saturation) a rerun can score worse than a model that predicts too little. "
        "**Eq. 13 error**: |Eq. 13 + profiled overhead − m_r| / m_r against each run.", ""]
    for report in doc["models"].values():
        parts.append(_model_markdown(report))
    if doc.get("cold"):
        parts.append(_cold_markdown(doc["cold"]))
    return "\n".join(parts)


def _model_markdown(report: dict[str, Any]) -> str:
    summary = report["summary"]
    rows = [{"who": "a second run of the same case (oracle)", "n": summary["oracle"]["n"],
             **summary["oracle"]},
            {"who": "Eq. 13 + overhead (SERF)", **summary["eq13"]},
            *([{"who": "idle-aware model (ours, core/idle_queueing)", **summary["idle"]}]
              if "idle" in summary else []),
            {"who": "issue 18's target", "n": None, **summary["targets"]}]
    table = markdown_table(rows, [("who", "predictor of a run's mean latency", "s"),
                                  ("n", "pairs or runs", "d"), ("mean", "mean error", _pct),
                                  ("p90", "p90", _pct), ("p95", "p95", _pct)])
    missing = ", ".join(f"c={m['c']},intra={m['intra']} k={m['level']}"
                        for m in report["missing"]) or "none"
    lines = [f"\n## {report['model']} (`{report['source']}`)\n", table, "",
             f"Within the target: the oracle on {_verdict(summary['oracle_meets'])}; "
             f"Eq. 13 on {_verdict(summary['eq13_meets'])}.", "",
             f"Wanted but not measured (ρ > 0.95 at that level): {missing}.", "",
             *([f"The idle-aware model predicts an unbounded queue for "
                f"{summary['idle_unstable']} of the runs, all measured stable: its "
                "back-to-back rates, timed with the frontend and the generator busy too, "
                "are below the closed-loop ones near saturation. Those runs are left out of "
                "its row's n.", ""] if summary.get("idle_unstable") else []),
             _bands_markdown(summary["by_rho"]), _cases_markdown(report["cases"])]
    return "\n".join(lines)


def _bands_markdown(bands: Sequence[dict[str, Any]]) -> str:
    rows = [{"band": f"{b['lo']:g} < ρ ≤ {min(b['hi'], 0.95):g}", "cases": b["cases"],
             **{f"{who}_{k}": b[who][k] for who in ("oracle", "eq13", "idle") if who in b
                for k in ("n", "mean", "p90", "p95")}} for b in bands]
    columns: list[Any] = [("band", "utilisation", "s"), ("cases", "cases", "d")]
    whos = [("oracle", "oracle"), ("eq13", "Eq. 13"),
            *([("idle", "idle-aware")] if all("idle" in b for b in bands) else [])]
    for who, label in whos:
        columns += [(f"{who}_n", f"{label} n", "d"), (f"{who}_mean", f"{label} mean", _pct),
                    (f"{who}_p90", "p90", _pct), (f"{who}_p95", "p95", _pct)]
    return "By utilisation:\n\n" + markdown_table(rows, columns) + "\n"


def _verdict(meets: dict[str, bool | None]) -> str:
    met = [k for k, v in meets.items() if v]
    missed = [k for k, v in meets.items() if v is False]
    text = ", ".join(met) if met else "none of mean, p90, p95"
    return text + (f" (misses {', '.join(missed)})" if met and missed else "")


def _cases_markdown(cases: Sequence[dict[str, Any]]) -> str:
    rows = [{**c, "runs": " / ".join(f"{m:.2f}" for m in c["means_ms"]),
             "eq13_mean_error": float(np.mean(c["eq13_errors"]))} for c in cases]
    table = markdown_table(rows, [
        ("config", "config", "s"), ("level", "k", "d"), ("rate", "λ /s", ".0f"),
        ("rho", "ρ", ".2f"), ("runs", "mean ms per run", "s"), ("mean_ms", "mean ms", ".2f"),
        ("spread", "spread (max−min)/mean", _pct), ("oracle_max", "worst oracle pair", _pct),
        ("predicted_ms", "Eq. 13 ms", ".2f"), ("eq13_mean_error", "Eq. 13 error", _pct),
        ("n_pooled", "n pooled", "d"), ("p50_ms", "p50", ".2f"), ("p99_ms", "p99", ".2f"),
        ("p999_ms", "p99.9", ".2f")])
    return ("Every case (Eq. 13 error: the mean over runs of its error against each; "
            "percentiles over the runs' pooled latencies, n of them):\n\n" + table + "\n")


def _cold_markdown(cold: dict[str, Any]) -> str:
    parts = ["\n## Cold: one call after an idle gap (in-process, no server)\n",
             f"Each series: {cold['calls_per_gap']} timed calls per gap, in rounds that visit "
             f"every gap in a shuffled order, {cold['per_visit']} calls a visit; before each "
             "call the process sleeps the gap (slept: the mean actually slept). Models: "
             "`predict` of one random input on one thread, after 30 untimed calls. "
             "socketpair: one byte to an echoing second process and back (the wake-up cost "
             "alone). A closed-loop profile only sees gap 0.\n"]
    for name, series in cold["series"].items():
        moved = series["drift"]
        parts.append(f"{name}: back-to-back (gap 0) medians over its {moved['visits']} "
                     f"visits, one a round: {moved['min_ms']:.3f} to {moved['max_ms']:.3f} ms, "
                     f"{moved['max_over_min']:.2f}x apart (the machine's own drift during "
                     "the series).\n")
        parts.append(markdown_table(series["rows"], [
            ("gap_ms", "gap ms", "g"), ("slept_ms", "slept ms", ".2f"), ("n", "n", "d"),
            ("median_ms", "median ms", ".3f"), ("median_ratio", "÷ gap 0", ".2f"),
            ("mean_ms", "mean ms", ".3f"), ("mean_ratio", "÷ gap 0", ".2f")]) + "\n")
    return "\n".join(parts)


def _plot_errors(report: dict[str, Any], path: Path) -> None:
    """Per case: every oracle pair's error and Eq. 13's error against every run, log-y,
    with the issue's targets as lines."""
    fig, ax = new_figure()
    floor = 1e-4  # a zero error drawn at 0.01%, the axis' floor
    for i, case in enumerate(report["cases"]):
        oracle = [max(e, floor) for e in case["oracle_errors"] if math.isfinite(e)]
        eq13 = [max(e, floor) for e in case["eq13_errors"] if math.isfinite(e)]
        ax.scatter([i] * len(oracle), oracle, s=12, color="tab:blue",
                   label="a second run of the same case (oracle)" if i == 0 else None)
        ax.scatter([i] * len(eq13), eq13, s=22, marker="x", color="tab:red",
                   label="Eq. 13 + overhead" if i == 0 else None)
    for key, style in (("mean", ":"), ("p90", "--"), ("p95", "-.")):
        ax.axhline(TARGETS[key], color="grey", linestyle=style, linewidth=0.8,
                   label=f"target {key} ≤ {TARGETS[key]:.0%}")
    labels = [f"c{c['c']}t{c['intra']} k{c['level']}" for c in report["cases"]]
    ax.set_xticks(range(len(labels)), labels, rotation=60, fontsize="x-small")
    ax.set(yscale="log", ylabel="relative error of mean latency",
           title=f"{report['model']}: a rerun of the same case against Eq. 13")
    ax.legend(fontsize="x-small")
    save_figure(fig, ax, path)


def _plot_cold(cold: dict[str, Any], path: Path) -> None:
    """Median (solid) and mean (dashed) time per call against the idle gap, as a ratio to
    back-to-back calls."""
    fig, ax = new_figure()
    for colour, (name, series) in zip(colours(len(cold["series"])), cold["series"].items(),
                                      strict=True):
        gaps = [r["gap_ms"] for r in series["rows"]]
        ax.plot(gaps, [r["median_ratio"] for r in series["rows"]], color=colour, marker="o",
                markersize=3, label=f"{name} median")
        ax.plot(gaps, [r["mean_ratio"] for r in series["rows"]], color=colour,
                linestyle="--", linewidth=0.8, label=f"{name} mean")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xscale("symlog", linthresh=0.5)
    ax.set_xlim(0.0, 1.3 * max(cold["gaps_ms"]))
    ax.set(xlabel="idle gap before the call (ms)", ylabel="time per call ÷ back-to-back",
           title="The cost of waking up: one call after an idle gap")
    ax.legend(fontsize="x-small")
    save_figure(fig, ax, path)


def build_parser() -> argparse.ArgumentParser:
    return _cli.build_parser(
        "serf_noise", __doc__.split("\n\n")[0].split(": ", 1)[1], _cli.examples([
            ("python -m benchmarks.serf_noise --quick --data-dir ../shared/data",
             "a smoke run (<= 10 min): ResNet-20, 2 repetitions of 400 queries, 3 levels"),
            ("python -m benchmarks.serf_noise --data-dir ../shared/data",
             "the full run (about 35-40 min): ResNet-20 and ResNet-56, 3 x 2,000 queries"),
            ("python -m benchmarks.serf_noise --parts cold --data-dir ../shared/data",
             "only the idle-gap curves (about a minute, no server)"),
            ("python -m benchmarks.serf_noise --resume --data-dir ../shared/data",
             "go on from the runs an interrupted run measured")]), add_arguments)


def main(argv: Sequence[str] | None = None) -> int:
    return _cli.main(build_parser(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
