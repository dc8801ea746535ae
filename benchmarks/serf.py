"""``python -m benchmarks.serf``: SERF on this machine, with real models behind the real server.

SERF (``../shared/papers/SERF.txt``; digest ``serf-hams-spec.md`` Part A) profiles a handful of
service rates and predicts every configuration's mean latency with the M/D_interf/c model.
This experiment checks that on CIFAR-10 ResNet-20 and ResNet-56 (published weights, one image
per request) and on the MNIST MLP, a control whose service time is mostly overhead:

1. **profile**: ``parityserve profile``'s closed-loop measurement of μ_i for every (i
   requests at once, intra threads), through the real serving path. Its wall time is SERF's
   cost in Table II.
2. **accuracy** (Fig. 11, and the exhaustive search of Table II): every configuration at the
   load levels λ_k = k·λ_max/11, k = 1..10, skipping cases with ρ > 0.95 (counted). Each case
   is an open-loop Poisson run through the frontend (the first 10% dropped); its mean latency
   is compared with Eq. 13 and the ablations (M/M_interf/c, M/D/c, M/M/c at μ_1). Levels are
   the outer loop and configurations the inner one, so slow drift of the machine hits every
   configuration of a level alike. The best configuration per level: the predicted argmin
   equals the measured one or lies within the measured spread (95% batch-means half-widths).
3. **dynamic** (Fig. 13): load moderate → low → moderate; the online SERF scheduler against
   three fixed configurations and the queue-length baseline, per phase.

Batch size 1, no deadline dropping (the application's SLO is a minute), cache off: the
paper's setting (digest Part C, SERF item 10). Both cores are shared by the load generator,
the frontend and the workers; the report says how that limits what the model can predict.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import _cli
from benchmarks.report import command_line, markdown_table, new_figure, save_figure, write_results
from benchmarks.run_file import RunFile
from benchmarks.serf_analysis import (
    ABLATIONS,
    IDLE_AWARE,
    Case,
    argmin_verdicts,
    batch_means_halfwidth,
    build_cases,
    dynamic_summary,
    dynamic_verdicts,
    error_summary,
    fixed_policies,
    idle_from_profile,
    lambda_max,
    phase_rates,
    phased_schedule,
    predict_idle,
    relative_error,
)
from parityserve.bench.loadgen import (
    LoadResult,
    encode_bodies,
    json_open_loop,
    poisson_schedule,
    run_event_loop,
    warm_open_loops,
)
from parityserve.bench.serverproc import ServerProcess, write_config
from parityserve.bench.stats import percentiles
from parityserve.core.queueing import Config, configurations

__all__ = ["MODELS", "add_arguments", "add_profile_arguments", "build_parser", "kept_latencies",
           "main", "profile_cases", "run", "serving_config"]

MODELS: dict[str, dict[str, Any]] = {
    "resnet20": {"source": "zoo:resnet20", "dataset": "cifar10"},
    "resnet56": {"source": "zoo:resnet56", "dataset": "cifar10"},
    "mlp": {"source": "zoo:parm-mlp", "dataset": "mnist"},
}
DEFAULT_RESULTS = Path("benchmarks/results/serf")
ROUTES = ("v2-binary", "clipper-json")
MODEL_NAME = "serf"  # the deployment and application name in the bench's serving file
WARMUP = 30  # queries sent after each reconfiguration, before a measured run
DROP_FRACTION = 0.10  # the first 10% of each measured run is dropped (digest A4, step 4)
# The online controller's clock: a 10 s window recomputed every second (digest Part C, SERF
# item 8), so that it follows phases of tens of seconds.
CONTROL = {"period_s": 1.0, "window_s": 10.0}
# Ray Serve's defaults scaled to the phases: its 30 s / 600 s delays would never act within
# a phase of a minute, which would make the baseline a fixed configuration.
QUEUE_LENGTH = {"target_ongoing_requests": 1.0, "upscale_delay_s": 3.0,
                "downscale_delay_s": 10.0, "look_back_period_s": 3.0}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", default="resnet20,resnet56,mlp",
                   help="comma-separated, from: " + ", ".join(MODELS))
    p.add_argument("--parts", default="profile,accuracy,dynamic,tail",
                   help="comma-separated, from: profile, accuracy, dynamic, tail (the "
                        "tail-aware controller against queue-length at a p99 SLO)")
    p.add_argument("--queries", type=int, default=2000,
                   help="queries per accuracy case (the issue asks for at least 2,000)")
    p.add_argument("--levels", type=int, default=10, help="load levels λ_k, k = 1..levels")
    add_profile_arguments(p)
    p.add_argument("--phase-seconds", type=float, default=30.0,
                   help="length of each dynamic-load phase")
    p.add_argument("--dynamic-repeats", type=int, default=2,
                   help="repetitions of the dynamic-load comparison (policies interleaved)")
    p.add_argument("--dynamic-models", default="resnet20",
                   help="models that get the dynamic-load part (it takes minutes per policy)")
    p.add_argument("--lead-in-seconds", type=float, default=10.0,
                   help="unmeasured load at the first phase's rate before the phases, so a "
                        "controller starts the comparison settled, as one that has been "
                        "running would be")
    p.add_argument("--phases", default="0.6,0.15,0.6",
                   help="dynamic-load phases as fractions of λ_max (moderate, low, moderate)")
    p.add_argument("--tail-slo-ms", type=float, default=None,
                   help="the tail part's p99 SLO (default: 1.5x the lowest simulated p99 "
                        "any configuration reaches at the moderate phase's rate)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run (<= 10 min): ResNet-20 only, 4 levels, 400 queries per "
                        "case, 15 s phases")
    p.add_argument("--resume", action="store_true",
                   help="keep the cases already measured under the same settings")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS,
                   help="where results and the resumable run files go (a --quick run: "
                        "serf-quick beside it)")
    p.set_defaults(func=run)


def add_profile_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of the profiling step, of the configurations it spans and of the route
    measured cases take (``_profile`` and ``_accuracy_run`` read them;
    ``benchmarks.serf_noise`` profiles and measures the same way)."""
    p.add_argument("--profile-requests", type=int, default=50,
                   help="timed requests per profiled (i, intra) tuple (at least 10)")
    p.add_argument("--oversubscribe", action=argparse.BooleanOptionalAction, default=True,
                   help="also c·intra > cores (c up to --max-c): a labelled extension that "
                        "shows interference clearly on 2 cores")
    p.add_argument("--max-c", type=int, default=4, help="most requests at once profiled")
    p.add_argument("--intra", default="1,2", help="intra-op thread counts profiled")
    p.add_argument("--idle-requests", type=int, default=20,
                   help="the profiler's idle part (beyond SERF: back-to-back service and "
                        "the penalty after idle gaps, for the idle-aware model); 0 skips "
                        "it, as the 2026-11-24 run did")
    p.add_argument("--accuracy-route", choices=ROUTES, default="v2-binary",
                   help="how the accuracy cases send queries: v2-binary (default), the "
                        "route the profiler times, so the overhead it measured is the one "
                        "the run pays; or clipper-json (/serf/predict, JSON), the route of "
                        "the 2026-11-24 run and of the dynamic and tail parts")


def run(args: argparse.Namespace) -> int:
    _apply_quick(args)
    data_dir = _data_dir(args.data_dir)
    models = _split(args.models)
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    command = command_line()
    reports = {m: _bench_model(m, args, data_dir) for m in models}
    doc = {"models": reports, "settings": _settings(args)}
    write_results("serf", doc, results_dir=args.results_dir, markdown=_markdown(reports, args),
                  command=command)
    _plot_scatter(reports, args.results_dir / "serf-accuracy.png")
    print(f"\nresults in {args.results_dir}/serf.md", flush=True)
    return 0


def _apply_quick(args: argparse.Namespace) -> None:
    if not args.quick:
        return
    if args.models == "resnet20,resnet56,mlp":
        args.models = "resnet20"
    if args.results_dir == DEFAULT_RESULTS:  # a smoke run never mixes with the real one
        args.results_dir = DEFAULT_RESULTS.with_name("serf-quick")
    args.levels = min(args.levels, 4)
    args.queries = min(args.queries, 400)
    args.phase_seconds = min(args.phase_seconds, 15.0)
    args.lead_in_seconds = min(args.lead_in_seconds, 5.0)
    args.dynamic_repeats = min(args.dynamic_repeats, 1)


def _data_dir(given: Path | None) -> Path:
    from parityserve.models.datasets import resolve_data_dir

    return resolve_data_dir(given)


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
            if k not in {"func", "verbose", "resume", "results_dir", "data_dir"}}


def _fingerprint(model: str, args: argparse.Namespace) -> dict[str, Any]:
    """The settings a saved run depends on: which models or parts an invocation runs does
    not change a run, so a full report can be put together from runs made one model at a
    time (each model has its own file)."""
    skip = {"models", "parts", "dynamic_models", "quick", "lead_in_seconds",
            "tail_slo_ms", "idle_requests", "accuracy_route"}  # in the keys they change
    return {"model": model, **{k: v for k, v in _settings(args).items() if k not in skip}}


def serving_config(source: str, replicas: int, *, oversubscribe: bool) -> dict[str, Any]:
    """One deployment and one application, both ``serf``: batch 1, cache off, no shedding
    before a minute, ``replicas`` warm workers of which ``parallelism`` pull."""
    # The load tool opens up to 512 connections from loopback: one address, past the default
    # per-address cap (server.limits.max_connections_per_address, 256).
    return {"server": {"http_port": 0, "cache_bytes": 0,
                       "limits": {"max_connections_per_address": 1024}},
            "models": [{"name": MODEL_NAME, "source": source, "replicas": replicas,
                        "batching": {"max_batch_size": 1}, "parallelism": 1,
                        "threads_per_replica": 1, "oversubscribe": oversubscribe}],
            "applications": [{"name": MODEL_NAME, "models": [MODEL_NAME], "slo_ms": 60_000,
                              "default_output": -1}]}


# ---- one model ----
def _bench_model(name: str, args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    spec = MODELS[name]
    parts = set(_split(args.parts))
    bodies = encode_bodies(list(_inputs(spec["dataset"], data_dir)))
    config = write_config(serving_config(spec["source"], args.max_c,
                                         oversubscribe=args.oversubscribe),
                          args.results_dir / ".work" / f"serf-{name}.yaml")
    saved = _Runs(args.results_dir / f"serf-{name}-runs.jsonl", _fingerprint(name, args),
                  resume=args.resume)
    report: dict[str, Any] = {"model": name, "source": spec["source"]}
    print(f"\n== serf: {name} ({spec['source']}) ==", flush=True)
    with ServerProcess(config, data_dir=data_dir) as server:
        profile = _profile(server.url, name, args, saved)
        report["profile"] = profile
        profiles, cores, cases, skipped = profile_cases(profile, args)
        report["skipped"] = skipped
        if "accuracy" in parts:
            report["idle"] = _idle_penalty(server.url, profile, bodies, args, saved)
            report["accuracy"] = _accuracy(server.url, cases, bodies, args, saved)
        if "dynamic" in parts and name in _split(args.dynamic_models):
            report["dynamic"] = _dynamic(server.url, name, profiles, cores, bodies, args, saved)
        if "tail" in parts and name in _split(args.dynamic_models):
            from benchmarks.serf_tail import tail_part  # it imports this module's helpers

            report["tail"] = tail_part(server.url, name, _profile_file(name, args),
                                       _phase_rates(profiles, cores, args), bodies, args,
                                       saved)
    return report


def profile_cases(profile: dict[str, Any], args: argparse.Namespace
                  ) -> tuple[dict[int, list[float]], int, list[Case], list[dict[str, Any]]]:
    """From a saved profile: the rates per intra, the cores, and the accuracy cases at
    ``args.levels`` load levels with the skipped ones (each prediction plus the profiled
    overhead outside the queue, and the idle-aware one where the profile has its part)."""
    profiles = {int(k): v for k, v in profile["rates"].items()}
    cores = int(profile["cores"])
    overhead = {Config(int(m["c"]), int(m["intra"])): float(m.get("overhead_s", 0.0))
                for m in profile["measurements"]}
    cases, skipped = build_cases(profiles, cores=cores, oversubscribe=args.oversubscribe,
                                 levels=args.levels, overhead=overhead,
                                 idle=idle_from_profile(profile.get("idle")))
    return profiles, cores, cases, skipped


def _inputs(dataset: str, data_dir: Path) -> np.ndarray:
    from parityserve.models.datasets import load_cifar10, load_mnist

    if dataset == "cifar10":
        x, _ = load_cifar10("test", data_dir=data_dir)
    else:
        x, _ = load_mnist("test", data_dir=data_dir)
    return x[::10][:1000]


class _Runs(RunFile):
    """SERF's finished measurements by name (the profile, each case, each dynamic phase)."""

    def key_of(self, saved: dict[str, Any]) -> str:
        return str(saved["key"])

    def get(self, key: str) -> dict[str, Any] | None:
        return self.rows.get(key)

    def put(self, key: str, row: dict[str, Any]) -> None:
        self.append(key, {"key": key}, row)


# ---- part 1: the profile ----
def _profile(url: str, name: str, args: argparse.Namespace, saved: _Runs) -> dict[str, Any]:
    """``parityserve profile --url`` against the bench's server: its profile file is the
    contract (``core/profiling.ProfileDocument``), and its wall time is SERF's cost."""
    key = "profile" if not args.idle_requests else f"profile-idle{args.idle_requests}"
    found = saved.get(key)
    if found is not None:
        print(f"profile: reused ({found['wall_s']:.1f} s when measured)", flush=True)
        return found
    from parityserve.bench import profiler

    out = _profile_file(name, args)
    argv = ["--url", url, "--model", MODEL_NAME, "--max-c", str(args.max_c), "--intra",
            args.intra, "--requests", str(args.profile_requests), "-o", str(out),
            "--idle-requests", str(args.idle_requests)]
    parser = argparse.ArgumentParser()
    profiler.add_arguments(parser)
    profiler.run(parser.parse_args(argv + (["--oversubscribe"] if args.oversubscribe else [])))
    doc = json.loads(out.read_text())
    row = {"rates": doc["profiles"], "cores": doc["cores"], "wall_s": doc["elapsed_s"],
           "runs": doc["runs"], "requests": doc["requests"], "file": out.name,
           "service_time": doc.get("service_time"),
           "measurements": [{k: v for k, v in m.items() if k != "samples_s"}
                            for m in doc["measurements"]],
           "idle": doc.get("idle"), "idle_wall_s": doc.get("idle_elapsed_s")}
    saved.put(key, row)
    return row


# ---- part 2: prediction accuracy and the exhaustive search ----
def _configure(url: str, config: Config) -> None:
    """Set c and the threads live, and wait until every replica acknowledged the threads."""
    from parityserve.bench.profiler import apply_configuration
    from parityserve.client import Client

    with Client(url, timeout=30.0) as client:
        apply_configuration(client, MODEL_NAME, config)


def _open_loop(url: str, bodies: list[bytes], schedules: Sequence[np.ndarray], label: str
               ) -> list[Any]:
    """One open-loop run per schedule (send times in seconds), back to back, after a warm-up
    of ``WARMUP`` queries (which also lets a new configuration settle)."""
    return json_open_loop(url, f"/{MODEL_NAME}/predict", bodies, schedules, warmup=WARMUP,
                          limit=512, timeout_s=120, progress=label)


def _accuracy(url: str, cases: Sequence[Case], bodies: list[bytes], args: argparse.Namespace,
              saved: _Runs) -> dict[str, Any]:
    ordered = sorted(cases, key=lambda case: (case.level, case.config))
    suffix = _route_suffix(args)
    todo = [case for case in ordered if saved.get(case.key + suffix) is None]
    print(f"accuracy: {len(ordered)} cases ({len(ordered) - len(todo)} already measured)",
          flush=True)
    for case in todo:
        started = time.monotonic()
        _configure(url, case.config)
        rng = np.random.default_rng([args.seed, case.level, case.config.c, case.config.intra])
        result = _accuracy_run(url, bodies, poisson_schedule(case.rate, args.queries, rng),
                               f"c={case.config.c} intra={case.config.intra} "
                               f"λ{case.level}={case.rate:.0f}/s", args)
        saved.put(case.key + suffix, _case_row(case, result, time.monotonic() - started))
    rows = [saved.rows[case.key + suffix] for case in ordered]
    return {"rows": rows, "errors": _errors(rows),
            "errors_from_send": _errors(rows, "_from_send"), "verdicts": argmin_verdicts(rows),
            "exhaustive": {"runs": len(rows), "wall_s": sum(r["wall_s"] for r in rows)}}


def _route_suffix(args: argparse.Namespace) -> str:
    """Run keys of the accuracy part carry its route; the 2026-11-24 run's (JSON) have none."""
    return "" if args.accuracy_route == "clipper-json" else f"-{args.accuracy_route}"


def _accuracy_run(url: str, bodies: list[bytes], schedule: np.ndarray, label: str,
                  args: argparse.Namespace) -> LoadResult:
    """One open-loop run of the accuracy part on ``--accuracy-route``, after ``WARMUP``."""
    if args.accuracy_route == "clipper-json":
        (result,) = _open_loop(url, bodies, [schedule], label)
        return result
    from parityserve.bench.load import v2_target

    async def go() -> list[LoadResult]:
        async with v2_target(url, MODEL_NAME, protocol="http-binary", timeout_s=120) as send:
            return await warm_open_loops(send, [schedule], warmup=WARMUP, timeout_s=120,
                                         progress=label)

    (result,) = run_event_loop(go())
    return result


IDLE_RATE, IDLE_QUERIES = 10.0, 150  # about 15 s of sparse arrivals: nothing ever queues


def _idle_penalty(url: str, profile: dict[str, Any], bodies: list[bytes],
                  args: argparse.Namespace, saved: _Runs) -> dict[str, Any]:
    """What a query pays on an idle machine beyond its profiled time: c = 1, one thread,
    arrivals so sparse that none queues, against 1/μ_1 plus the overhead outside the queue.

    Why: a closed loop keeps every process awake, while sparse open-loop arrivals find the
    load generator, the frontend and the worker asleep; waking them is not queueing, so the
    model (fed by closed-loop profiles, as SERF's is) cannot see it."""
    key = "idle" + _route_suffix(args)
    found = saved.get(key)
    if found is not None:
        return found
    _configure(url, Config(1, 1))
    rng = np.random.default_rng([args.seed, 99])
    result = _accuracy_run(url, bodies, poisson_schedule(IDLE_RATE, IDLE_QUERIES, rng),
                           f"idle check {IDLE_RATE:g}/s", args)
    lat = result.latencies_s[result.ok]
    single = next(m for m in profile["measurements"] if m["c"] == 1 and m["intra"] == 1)
    expected_ms = (1.0 / float(single["mu"]) + float(single.get("overhead_s", 0.0))) * 1e3
    measured_ms = float(lat.mean() * 1e3) if lat.size else math.nan
    row = {"rate": IDLE_RATE, "n": int(lat.size), "measured_ms": measured_ms,
           "profiled_ms": expected_ms, "penalty_ms": measured_ms - expected_ms,
           **percentiles(lat)}
    idle_inputs = idle_from_profile(profile.get("idle"))
    if idle_inputs is not None:
        row["idle_aware_ms"] = predict_idle(idle_inputs[1], IDLE_RATE, 1) * 1e3
    saved.put(key, row)
    return row


def kept_latencies(result: Any) -> np.ndarray:
    """A measured run's successful latencies (s) after dropping its first ``DROP_FRACTION``."""
    return _kept(result, result.latencies_s)


def kept_send_lags(result: Any) -> np.ndarray:
    """The same queries' send lags (s): how late the generator itself started each send."""
    return _kept(result, result.send_lag_s)


def _kept(result: Any, per_query: np.ndarray) -> np.ndarray:
    keep = int(result.n * DROP_FRACTION)
    return np.asarray(per_query[keep:][result.ok[keep:]])


def _case_row(case: Case, result: Any, wall_s: float) -> dict[str, Any]:
    lat = kept_latencies(result)
    measured_ms = float(lat.mean() * 1e3) if lat.size else math.nan
    row: dict[str, Any] = {
        "config": f"c={case.config.c},intra={case.config.intra}", "c": case.config.c,
        "intra": case.config.intra, "level": case.level, "rate": case.rate, "rho": case.rho,
        "measured_ms": measured_ms, "halfwidth_ms": batch_means_halfwidth(lat) * 1e3,
        "n": int(lat.size), "errors": int(result.n - result.ok.sum()),
        "throughput_qps": result.throughput, **percentiles(lat), "wall_s": wall_s,
        "send_lag_p99_ms": float(np.percentile(result.send_lag_s, 99)) * 1e3
        if result.send_lag_s.size else math.nan}
    # Latency counts from each query's intended send time (no coordinated omission), so it
    # includes the generator's own lateness, which shares the cores; kept apart as well.
    lags = kept_send_lags(result)
    row["send_lag_mean_ms"] = float(lags.mean() * 1e3) if lags.size else math.nan
    row["from_send_ms"] = measured_ms - row["send_lag_mean_ms"]
    for model in case.predicted_s:
        predicted_ms = case.predicted_s[model] * 1e3
        row[f"{model}_ms"] = predicted_ms
        row[f"{model}_error"] = relative_error(predicted_ms, measured_ms)
        row[f"{model}_error_from_send"] = relative_error(predicted_ms, row["from_send_ms"])
    row["predicted_ms"] = row["md-interf_ms"]
    return row


def _errors(rows: Sequence[dict[str, Any]], suffix: str = "") -> dict[str, dict[str, Any]]:
    """Per model, the summary of its errors (``suffix`` "_from_send": against the latency
    from each actual send, which rows measured before 2026-11-25 lack)."""
    return {model: error_summary([r.get(f"{model}_error{suffix}", math.nan) for r in rows])
            for model in _models_in(rows)}


def _models_in(rows: Sequence[dict[str, Any]]) -> list[str]:
    """SERF's model and the ablations, then the idle-aware one where the profile had it."""
    return [*ABLATIONS, *([IDLE_AWARE] if rows and f"{IDLE_AWARE}_error" in rows[0] else [])]


# ---- part 3: dynamic load ----
def _dynamic(url: str, model: str, profiles: dict[int, list[float]], cores: int,
             bodies: list[bytes], args: argparse.Namespace, saved: _Runs) -> dict[str, Any]:
    """Every policy through the same phases (moderate, low, moderate), policies interleaved
    within each repetition; per phase the medians over repetitions."""
    rates = _phase_rates(profiles, cores, args)
    policies: dict[str, Any] = {
        **fixed_policies(profiles, cores, rates, oversubscribe=args.oversubscribe),
        "serf": "serf", "queue-length": "queue-length"}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in policies}
    for rep in range(args.dynamic_repeats):
        for name, policy in policies.items():
            key = f"dynamic-{name}-{rep}-lead{args.lead_in_seconds:g}"
            if saved.get(key) is None:
                profile_file = _profile_file(model, args)
                saved.put(key, _dynamic_run(url, name, policy, profile_file, rates, bodies,
                                            args, rep))
            runs[name].append(saved.rows[key])
    summary = dynamic_summary(runs)
    return {"rates": rates, "phase_seconds": args.phase_seconds,
            "lead_in_seconds": args.lead_in_seconds,
            "policies": {k: _label(v) for k, v in policies.items()}, "runs": runs,
            "summary": summary, "verdict": dynamic_verdicts(summary, len(rates))}


def _phase_rates(profiles: dict[int, list[float]], cores: int, args: argparse.Namespace
                 ) -> list[float]:
    configs = configurations(profiles, cores=cores, oversubscribe=args.oversubscribe)
    return phase_rates(lambda_max(profiles, configs), [float(f) for f in _split(args.phases)])


def _profile_file(name: str, args: argparse.Namespace) -> Path:
    return args.results_dir / f"serf-profile-{name}.json"


def _apply_policy(url: str, policy: Any, profile_file: Path,
                  slo_p99_ms: float | None = None) -> int:
    """Hand the model to ``policy`` (a fixed Config, "serf" or "queue-length") through the
    admin API, SERF tail-aware when ``slo_p99_ms`` is given (the profile then holds its
    table); returns the controller's switch count so far. Each run starts from the same
    configuration (c = 1, one thread) so no policy inherits another's choice."""
    from parityserve.bench.profiler import apply_configuration
    from parityserve.client import Client

    with Client(url, timeout=30.0) as client:
        client.set_scheduler(MODEL_NAME, "fixed", c=1, intra=1, **CONTROL)
        apply_configuration(client, MODEL_NAME, Config(1, 1))
        if isinstance(policy, Config):
            client.set_scheduler(MODEL_NAME, "fixed", c=policy.c, intra=policy.intra, **CONTROL)
            apply_configuration(client, MODEL_NAME, policy)
        elif policy == "serf":
            # The admin API loads files only from the server's model roots (by default the
            # serving file's folder, .work/), so the profile goes there.
            served = profile_file.parent / ".work" / profile_file.name
            shutil.copyfile(profile_file, served)
            tail = {} if slo_p99_ms is None else {"slo_p99_ms": slo_p99_ms}
            client.set_scheduler(MODEL_NAME, "serf", profile=served.name, **CONTROL, **tail)
        else:
            client.set_scheduler(MODEL_NAME, "queue-length", **CONTROL, **QUEUE_LENGTH)
    return _switches(url)


def _switches(url: str) -> int:
    from parityserve.client import Client

    with Client(url, timeout=30.0) as client:
        model = next(m for m in client.state()["models"] if m["name"] == MODEL_NAME)
    return int((model.get("scheduler") or {}).get("switches", 0))


def _label(policy: Any) -> str:
    return f"c={policy.c},intra={policy.intra}" if isinstance(policy, Config) else str(policy)


def _dynamic_run(url: str, name: str, policy: Any, profile_file: Path,
                 rates: Sequence[float], bodies: list[bytes], args: argparse.Namespace,
                 rep: int) -> dict[str, Any]:
    switches_before = _apply_policy(url, policy, profile_file)
    schedule, phase_of = phased_schedule(rates, args.phase_seconds,
                                         np.random.default_rng([args.seed, 7, rep]),
                                         lead_in_s=args.lead_in_seconds)
    (result,) = _open_loop(url, bodies, [schedule], f"{name} #{rep + 1}")
    switches = _switches(url) - switches_before
    phases = []
    for i, rate in enumerate(rates):
        mask = (phase_of == i) & result.ok
        lat = result.latencies_s[mask]
        phases.append({"phase": i, "rate": rate, "n": int(lat.size),
                       "errors": int(((phase_of == i) & ~result.ok).sum()),
                       "mean_ms": float(lat.mean() * 1e3) if lat.size else math.nan,
                       **percentiles(lat)})
    return {"policy": name, "rep": rep, "phases": phases, "switches": switches}


# ---- report ----
def _markdown(reports: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    parts = ["Machine: the 2-core VM; frontend, load generator and workers share both cores. "
             "Configurations with c·intra > 2 are oversubscribed (a labelled extension)."
             if args.oversubscribe else "Faithful configurations only (c·intra <= cores)."]
    for name, report in reports.items():
        parts.append(f"\n## {name} (`{report['source']}`)\n")
        acc = report.get("accuracy")
        if acc:
            parts.append(_accuracy_markdown(acc, report))
            parts.append(_cost_markdown(report["profile"], acc["exhaustive"]))
        if report.get("dynamic"):
            parts.append(_dynamic_markdown(report["dynamic"]))
        if report.get("tail"):
            from benchmarks.serf_tail import tail_markdown

            parts.append(tail_markdown(report["tail"]))
    return "\n".join(parts)


def _cost_markdown(profile: dict[str, Any], exhaustive: dict[str, Any]) -> str:
    """SERF Table II on this machine: profiling against measuring every case directly."""
    ratio = exhaustive["wall_s"] / profile["wall_s"] if profile["wall_s"] > 0 else math.nan
    rows = [{"method": "exhaustive (every configuration x load level)",
             "runs": exhaustive["runs"], "wall_s": exhaustive["wall_s"]},
            {"method": "SERF profile (every i requests at once x intra)",
             "runs": profile["runs"], "wall_s": profile["wall_s"]}]
    table = markdown_table(rows, [("method", "method", "s"), ("runs", "runs", "d"),
                                  ("wall_s", "wall time (s)", ".1f")])
    return f"Cost (SERF Table II):\n\n{table}\n\nProfiling is {ratio:.0f}x cheaper.\n"


def _dynamic_markdown(dyn: dict[str, Any]) -> str:
    columns: list[Any] = [("policy", "policy", "s"), ("switches", "switches", ".0f")]
    for i, rate in enumerate(dyn["rates"]):
        columns += [(f"phase{i}_mean_ms", f"phase {i + 1} ({rate:.0f}/s) mean ms", ".2f"),
                    (f"phase{i}_p99_ms", "p99 ms", ".2f"), (f"phase{i}_p999_ms", "p99.9 ms",
                                                             ".2f"),
                    (f"phase{i}_n", "n", "d")]
    columns.append(("overall_mean_ms", "whole run mean ms", ".2f"))
    labels = dyn["policies"]
    rows = [{**r, "policy": f"{r['policy']} ({labels[r['policy']]})"
             if r["policy"].startswith("fixed-") else r["policy"]} for r in dyn["summary"]]
    verdict = dyn["verdict"]
    lines = [f"Dynamic load ({dyn['phase_seconds']:.0f} s per phase after an unmeasured "
             f"{dyn.get('lead_in_seconds', 0):.0f} s lead-in at the first phase's rate; "
             "every run starts at c = 1, one thread; medians over "
             f"{max((r['repeats'] for r in dyn['summary']), default=0)} repetitions, "
             "policies interleaved):", "", markdown_table(rows, columns), ""]
    if verdict.get("complete"):
        ratios = ", ".join(f"phase {p['phase'] + 1}: {p['ratio_to_best_fixed']:.2f}x"
                           for p in verdict["phases"])
        lines.append(f"SERF against the best fixed configuration per phase: {ratios}; "
                     f"beats every fixed configuration over the whole run: "
                     f"{verdict['beats_every_fixed_overall']}. Target (within 5% in every "
                     f"phase, and best overall): {'met' if verdict['met'] else 'missed'}.")
    return "\n".join(lines) + "\n"


def _accuracy_markdown(acc: dict[str, Any], report: dict[str, Any]) -> str:
    pct = "{:.1%}".format  # noqa: P103 - a format callable, not a format string
    columns = [("model", "latency model", "s"), ("n", "cases", "d"),
               ("mean", "mean error", pct), ("p90", "p90", pct), ("p95", "p95", pct)]
    table = markdown_table([{"model": model, **acc["errors"][model]}
                            for model in acc["errors"]], columns)
    idle_n = (acc["errors"].get(IDLE_AWARE) or {}).get("n")
    if idle_n is not None and idle_n < len(acc["rows"]):
        table += (f"\n\nThe idle-aware model predicts an unbounded queue for "
                  f"{len(acc['rows']) - idle_n} of the {len(acc['rows'])} cases, all measured "
                  "stable (its back-to-back rates, timed with the frontend and the generator "
                  "busy too, are below the closed-loop ones); they are left out of its row.")
    from_send = acc.get("errors_from_send") or {}
    if from_send and from_send["md-interf"]["n"]:
        lag = float(np.nanmean([r.get("send_lag_mean_ms", math.nan) for r in acc["rows"]]))
        table += ("\n\nThe same against each run's latency from the actual send (the mean "
                  "minus the mean lag of the generator's own sends, which share the cores; "
                  f"{lag:.2f} ms averaged over the cases):\n\n" + markdown_table(
                      [{"model": model, **from_send[model]} for model in from_send], columns))
    found = sum(1 for v in acc["verdicts"] if v["found"])
    idle = report.get("idle") or {}
    idle_line = (f"Idle check (c = 1, one thread, {idle['rate']:g} arrivals/s, {idle['n']} "
                 f"queries, nothing queues): mean {idle['measured_ms']:.2f} ms against "
                 f"{idle['profiled_ms']:.2f} ms profiled in a closed loop, a penalty of "
                 f"{idle['penalty_ms']:+.2f} ms that no queueing model fed by closed-loop "
                 "profiles can predict" + (
                     f"; the idle-aware model ({IDLE_AWARE}, beyond SERF) predicts "
                     f"{idle['idle_aware_ms']:.2f} ms" if "idle_aware_ms" in idle else "")
                 + ".\n" if idle else "")
    return (f"Relative error of predicted mean latency, {len(acc['rows'])} cases "
            f"({len(report['skipped'])} skipped with ρ > 0.95):\n\n{table}\n\n"
            f"Best configuration found at {found} of {len(acc['verdicts'])} load levels "
            "(the predicted best equals the measured best, or lies within both runs' 95% "
            f"batch-means half-widths of it).\n\n{idle_line}\n{_cases_markdown(acc['rows'])}")


def _cases_markdown(rows: Sequence[dict[str, Any]]) -> str:
    pct = "{:.1%}".format  # noqa: P103 - a format callable, not a format string
    return "Every case (measured after dropping the first 10% of each run):\n\n" + \
        markdown_table(rows, [
            ("config", "config", "s"), ("rate", "λ /s", ".0f"), ("rho", "ρ", ".2f"),
            ("n", "n", "d"), ("measured_ms", "measured mean ms", ".2f"),
            ("halfwidth_ms", "± 95%", ".2f"), ("predicted_ms", "Eq. 13 ms", ".2f"),
            ("md-interf_error", "error", pct),
            *([(f"{IDLE_AWARE}_ms", "idle-aware ms", ".2f"),
               (f"{IDLE_AWARE}_error", "error", pct)] if IDLE_AWARE in _models_in(rows)
              else []),
            ("p50_ms", "p50", ".2f"), ("p99_ms", "p99", ".2f"),
            ("p999_ms", "p99.9", ".2f")]) + "\n"


def _plot_scatter(reports: dict[str, dict[str, Any]], path: Path) -> None:
    fig, ax = new_figure()
    for name, report in reports.items():
        rows = (report.get("accuracy") or {}).get("rows") or []
        if rows:
            ax.scatter([r["measured_ms"] for r in rows], [r["predicted_ms"] for r in rows],
                       s=10, label=f"{name}, Eq. 13")
        if rows and IDLE_AWARE in _models_in(rows):
            ax.scatter([r["measured_ms"] for r in rows], [r[f"{IDLE_AWARE}_ms"] for r in rows],
                       s=10, marker="x", label=f"{name}, idle-aware (ours)")
    lo_hi = ax.get_xlim()
    ax.plot(lo_hi, lo_hi, color="grey", linewidth=0.8, label="predicted = measured")
    ax.set(xscale="log", yscale="log", xlabel="measured mean latency (ms)",
           ylabel="predicted mean latency (ms)",
           title="SERF prediction accuracy on this machine")
    ax.legend(fontsize="small")
    save_figure(fig, ax, path)


def build_parser() -> argparse.ArgumentParser:
    return _cli.build_parser(
        "serf", __doc__.split("\n\n")[0].split(": ", 1)[1], _cli.examples([
            ("python -m benchmarks.serf --quick --data-dir ../shared/data",
             "a smoke run (<= 10 min): ResNet-20, 4 load levels"),
            ("python -m benchmarks.serf --data-dir ../shared/data",
             "the full run (<= 60 min): ResNet-20, ResNet-56 and the MLP"),
            ("python -m benchmarks.serf --resume --data-dir ../shared/data",
             "go on from the cases an interrupted run measured")]), add_arguments)


def main(argv: Sequence[str] | None = None) -> int:
    return _cli.main(build_parser(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
