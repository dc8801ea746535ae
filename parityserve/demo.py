"""``make demo``: train a digits classifier, serve it with 2 replicas, and load-test it; then
show what coded redundancy buys when one replica is slowed by bursts of background load.

Part 1 serves a scikit-learn classifier with 2 replicas under open-loop Poisson load and reports
throughput, tail latency and accuracy.

Part 2 serves ``zoo:digits-mlp`` twice on one server, with the same number of processes and the
same slow replica: without coding (``equal-resources``: 3 plain replicas) and with ParM (2
replicas plus 1 replica of a parity model trained here and cached). Replica 0 of each is slowed
by injected bursts; the same Poisson schedule of the same inputs goes to each in turn, and the
report puts their p50, p99 and p99.9 side by side with the answers behind each, and says how
many answers were rebuilt by decoding and how accurate those were. Its one-line verdict judges
one tail percentile, chosen by the answer count alone (p99.9 from 1,000 answers up, else p99),
and names it.
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

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
from parityserve.bench.serverproc import ServerProcess, write_config
from parityserve.bench.stats import enough_samples
from parityserve.models.datasets import load_digits_split
from parityserve.models.digits import train_digits_classifier

__all__ = ["ARMS", "BURST", "coding_config", "demo_config", "judged_percentile", "run_demo",
           "tail_samples", "verdict"]

console = Console()

# --- part 2's settings ------------------------------------------------------------------------
# Replica 0 is slowed by bursts, as if a background job shared its machine now and then: bursts
# arrive at random (mean gap every_ms), last duration_ms, and each batch the replica serves
# during one takes delay_ms longer. The other replicas run at full speed.
BURST = {"every_ms": 200.0, "duration_ms": 100.0, "delay_ms": 150.0}
# Part 1's application SLO: tight, as Clipper's examples are; `--slo-ms` loosens it on a busy
# machine, where admission would otherwise shed the queries it cannot answer in time.
DEMO_SLO_MS = 50.0
# A generous SLO: a late answer shows up as latency in the comparison, not as a default answer.
CODING_SLO_MS = 1000.0
PARITY_EPOCHS = 10
WARMUP_QUERIES = 100  # per deployment, before measuring: first calls into fresh workers are slow
BLOCKS = 4  # the schedule is sent in blocks, alternating between the deployments
CODING_QUERIES = 5000  # per deployment: p99.9 then stands on the 5 slowest answers, not on 2


@dataclass(frozen=True)
class _Arm:
    app: str
    title: str  # column heading
    label: str  # in the progress bar


ARMS = (
    _Arm("digits-uncoded", "no coding\n3 replicas", "no coding"),
    _Arm("digits-parm", "ParM, k = 2\n2 + 1 parity", "with ParM"),
)


def demo_config(model_path: Path, slo_ms: float = DEMO_SLO_MS) -> dict[str, Any]:
    return {
        "server": {"http_port": 0},
        "models": [
            {
                "name": "digits-logreg",
                "source": f"sklearn:{model_path.resolve()}",
                "replicas": 2,
                "threads_per_replica": 1,
                "batching": {"max_batch_size": 32, "max_delay_ms": 0},
            }
        ],
        "applications": [
            {
                "name": "digits",
                "models": ["digits-logreg"],
                "slo_ms": slo_ms,
                "default_output": -1,
            }
        ],
    }


def coding_config(deployed_weights: Path, parity_weights: Path, *, seed: int) -> dict[str, Any]:
    """Two deployments of one model, 3 processes each, replica 0 of each slowed by ``BURST``."""

    def model(app: str, **redundancy: Any) -> dict[str, Any]:
        return {
            "name": app,
            "source": "zoo:digits-mlp",
            "weights": str(deployed_weights.resolve()),
            "replicas": 2,
            "threads_per_replica": 1,
            "batching": {"max_batch_size": 32, "max_delay_ms": 0},
            "faults": {"0": {"burst": dict(BURST), "seed": seed}},
            **redundancy,
        }

    uncoded, parm = (arm.app for arm in ARMS)
    return {
        # No prediction cache: the inputs repeat, and every query must reach a replica.
        "server": {"http_port": 0, "cache_bytes": 0},
        "models": [
            model(uncoded, redundancy={"mode": "equal-resources", "extra": 1}),
            model(parm, parity={"weights": str(parity_weights.resolve()), "k": 2,
                                "encoder": "addition"}),
        ],
        "applications": [
            {"name": arm.app, "models": [arm.app], "slo_ms": CODING_SLO_MS, "default_output": -1}
            for arm in ARMS
        ],
    }


def run_demo(*, queries: int, rate: float, cache_dir: Path, keep_serving: bool, seed: int,
             coding: bool = True, coding_queries: int = CODING_QUERIES,
             coding_rate: float = 150.0, slo_ms: float = DEMO_SLO_MS) -> int:
    console.rule("[bold]parityserve demo")
    with contextlib.ExitStack() as kept:  # servers kept up for --serve, stopped on the way out
        ok = _serve_and_load(queries=queries, rate=rate, slo_ms=slo_ms, cache_dir=cache_dir,
                             seed=seed, keep=kept if keep_serving else None)
        if coding:
            ok = _coding_comparison(queries=coding_queries, rate=coding_rate,
                                    cache_dir=cache_dir, seed=seed,
                                    keep=kept if keep_serving else None) and ok
        if keep_serving:
            _wait_for_ctrl_c()
    return 0 if ok else 1


# --- part 1: serve and load-test a classifier ----------------------------------------------------


def _serve_and_load(*, queries: int, rate: float, slo_ms: float, cache_dir: Path, seed: int,
                    keep: contextlib.ExitStack | None) -> bool:
    with console.status("training a digits classifier (cached after the first run)"):
        model_path = train_digits_classifier(cache_dir, seed=seed)
    console.print(f"model: {model_path}")
    config_path = write_config(demo_config(model_path, slo_ms), cache_dir / "demo-serving.yaml")
    _, _, x_test, y_test = load_digits_split(seed=seed)
    with contextlib.ExitStack() as stack:
        server = _serve(stack, config_path, cache_dir, "server",
                        "starting the server and 2 worker replicas")
        result = run_event_loop(_load(server.url, x_test, queries, rate, seed))
        _report(result, y_test, rate)
        _print_urls(server.url, [
            ("predict", '/digits/predict  (POST {"input": [64 floats]})'),
            ("V2 model", "/v2/models/digits-logreg"),
            ("metrics", "/metrics"),
            ("admin", "/admin/state  (needs the token: `parityserve token --show`)"),
            ("health", "/v2/health/ready"),
        ])
        if keep is not None:
            keep.enter_context(stack.pop_all())
        else:
            console.print("\n(the server stops now; run `parityserve demo --serve` to keep it "
                          "up and explore these URLs)")
    return not result.summary()["errors"]


async def _load(url: str, x: np.ndarray, queries: int, rate: float, seed: int) -> LoadResult:
    bodies = encode_bodies(list(x))
    schedule = poisson_schedule(rate, queries, np.random.default_rng(seed))
    async with HttpSender(url) as http:
        send = json_sender(http, "/digits/predict", bodies)
        return await run_open_loop(send, schedule, progress=f"open-loop {rate:g} q/s")


def _explain_errors(errors: dict[str, int], prefix: str = "") -> None:
    """Which errors, by kind, and what to do: a bare count says nothing, and on a busy machine
    the usual kind is the server shedding load it could not answer in time (a refusal the
    demo counts as an error, so that it exits 1)."""
    if not errors:
        return
    kinds = ", ".join(f"{kind} x {n}" for kind, n in sorted(errors.items(), key=lambda e: -e[1]))
    console.print(f"[red]{prefix}errors by kind: {kinds}[/red]")
    if any(k in kind.lower() for kind in errors for k in ("overload", "429", "503", "timeout")):
        console.print(f"{prefix}the server refused or timed out queries it could not answer in "
                      "time: is another job using the CPU (see `uptime`)? Rerun on a quiet "
                      "machine, or lower --rate (part 1; --coding-rate in part 2), or give "
                      "part 1 a looser --slo-ms.")


def _report(result: LoadResult, y_test: np.ndarray, rate: float) -> None:
    s = result.summary()
    outputs = [r["output"] if isinstance(r, dict) else None for r in result.results]
    defaults = sum(1 for r in result.results if isinstance(r, dict) and r.get("default"))
    labels = [int(y_test[i % len(y_test)]) for i in range(len(outputs))]
    correct = sum(1 for o, y in zip(outputs, labels, strict=True) if o == y)
    table = Table(title=f"open-loop Poisson load, {s['n']} queries at {rate:g} q/s offered")
    for col in ("metric", "value"):
        table.add_column(col)
    rows = [
        ("throughput", f"{s['throughput_qps']:.1f} q/s"),
        ("p50 latency", f"{s['p50_ms']:.2f} ms"),
        ("p99 latency", f"{s['p99_ms']:.2f} ms"),
        ("p99.9 latency", f"{s['p999_ms']:.2f} ms"),
        ("accuracy vs labels", f"{correct / max(1, len(outputs)):.2%}"),
        ("default answers (SLO misses)", str(defaults)),
        ("errors", str(sum(s["errors"].values()))),
    ]
    for row in rows:
        table.add_row(*row)
    console.print(table)
    _explain_errors(s["errors"])


# --- part 2: one slow replica, with and without coding -------------------------------------------


def _coding_comparison(*, queries: int, rate: float, cache_dir: Path, seed: int,
                       keep: contextlib.ExitStack | None) -> bool:
    console.print()
    console.rule("[bold]one slow replica: the same load without coding and with ParM")
    console.print(
        f"Replica 0 is slowed by bursts of background load: bursts of "
        f"{BURST['duration_ms']:g} ms arrive at random, about {BURST['every_ms']:g} ms apart, and "
        f"each batch it serves during one takes {BURST['delay_ms']:g} ms longer. Both "
        "deployments run zoo:digits-mlp in 3 worker processes; ParM spends one of them on a "
        "parity model, so a late batch can be rebuilt from the others instead of waited for. "
        f"Each gets the same Poisson schedule of the same test digits, in {BLOCKS} blocks sent "
        "to them in turn.")
    try:
        parity = _parity_model(cache_dir.resolve())
    except ImportError as exc:
        console.print(f"[yellow]skipped: training the parity model needs PyTorch ({exc})")
        return True
    config = coding_config(Path(parity["deployed_weights"]), Path(parity["weights"][0]),
                           seed=seed)
    config_path = write_config(config, cache_dir / "demo-coding.yaml")
    # The split the deployed DigitsMLP was trained on (seed 0): its test digits are unseen.
    _, _, x_test, y_test = load_digits_split(seed=0)
    with contextlib.ExitStack() as stack:
        server = _serve(stack, config_path, cache_dir, "comparison server",
                        "starting the server: 3 + 3 worker replicas")
        results = run_event_loop(_compare(server.url, x_test, queries, rate, seed))
        _report_comparison(results, y_test, rate, parity)
        if keep is not None:
            _print_urls(server.url, [
                *((arm.label, f"/{arm.app}/predict") for arm in ARMS),
                ("metrics", "/metrics  (parityserve_reconstructed_total)"),
                ("admin", "/admin/state  (needs the token: `parityserve token --show`)"),
            ])
            keep.enter_context(stack.pop_all())
    return not any(r.summary()["errors"] for r in results)


async def _compare(url: str, x: np.ndarray, queries: int, rate: float, seed: int
                   ) -> list[LoadResult]:
    """The same schedule of the same inputs to each deployment, one block at a time.

    The schedule is cut into ``BLOCKS`` consecutive blocks and each block is sent to every
    deployment in turn (waiting for all its answers before the next), so a change in the
    machine's background load mid-run hits both deployments alike instead of only the later.
    """
    from tqdm import tqdm

    bodies = encode_bodies(list(x))
    schedule = poisson_schedule(rate, queries, np.random.default_rng(seed))
    blocks = [b for b in np.array_split(np.arange(queries), BLOCKS) if b.size]
    parts: list[list[LoadResult]] = [[] for _ in ARMS]
    async with HttpSender(url) as http:
        sends = [json_sender(http, f"/{arm.app}/predict", bodies) for arm in ARMS]
        for send in sends:
            warmup = poisson_schedule(rate, WARMUP_QUERIES, np.random.default_rng([seed, 1]))
            await run_open_loop(send, warmup)
        with tqdm(total=len(ARMS) * queries, unit="q", dynamic_ncols=True,
                  desc=f"{' / '.join(arm.label for arm in ARMS)}, {rate:g} q/s") as bar:
            for block in blocks:
                start = int(block[0])
                offsets = schedule[block] - (schedule[start - 1] if start else 0.0)
                for send, out in zip(sends, parts, strict=True):
                    out.append(await run_open_loop(_counted(send, start, bar), offsets,
                                                   rate_qps=rate))
    return [_joined(p, rate) for p in parts]


def _counted(send: Send, start: int, bar: Any) -> Send:
    """``send`` for query ``start + i`` (same input as in the whole schedule), ticking ``bar``."""

    async def sent(i: int) -> Any:
        try:
            return await send(start + i)
        finally:
            bar.update(1)

    return sent


def _joined(parts: list[LoadResult], rate: float) -> LoadResult:
    """Blocks of one schedule as one run (throughput over the time spent in the blocks)."""
    errors: Counter[str] = Counter()
    for part in parts:
        errors.update(part.errors)
    return LoadResult(
        latencies_s=np.concatenate([p.latencies_s for p in parts]),
        ok=np.concatenate([p.ok for p in parts]),
        results=[r for p in parts for r in p.results],
        errors=errors,
        offered_rate=rate,
        duration_s=sum(p.duration_s for p in parts),
        send_lag_s=np.concatenate([p.send_lag_s for p in parts]),
    )


def _parity_model(cache_dir: Path) -> dict[str, Any]:
    """The sidecar of the demo's parity model for zoo:digits-mlp, trained once and cached."""
    checkpoint = cache_dir / "parity" / "demo-digits-mlp-k2-addition.pt"
    cached = _cached_parity(checkpoint.with_suffix(".json"))
    if cached is not None:
        console.print(f"parity model: {cached['weights'][0]} (cached)")
        return cached
    from parityserve.training import TrainConfig, train_parity  # imports torch

    config = TrainConfig(dataset="digits", model="zoo:digits-mlp", k=2, encoder="addition",
                         epochs=PARITY_EPOCHS, out=str(checkpoint), cache_dir=str(cache_dir),
                         progress=False)
    with console.status("training zoo:digits-mlp and a ParM parity model for it (cached after "
                        "the first run)"):
        result = train_parity(config, log=lambda line: None)
    info: dict[str, Any] = json.loads(result.sidecar.read_text())
    console.print(f"parity model: {info['weights'][0]} (trained {info['epochs']} epochs)")
    return info


def _cached_parity(sidecar: Path) -> dict[str, Any] | None:
    try:
        info = json.loads(sidecar.read_text())
        files = [Path(info["deployed_weights"]), *map(Path, info["weights"])]
        usable = (info["epochs"] == PARITY_EPOCHS and info["k"] == 2 and info["r"] == 1
                  and info["encoder"] == "addition" and all(f.is_file() for f in files))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return info if usable else None


def _classes(result: LoadResult) -> list[int | None]:
    """Each answer's predicted class (argmax of the logits); None for errors and defaults."""
    out: list[int | None] = []
    for r in result.results:
        ok = isinstance(r, dict) and not r.get("default") and isinstance(r.get("output"), list)
        out.append(int(np.argmax(r["output"])) if ok else None)
    return out


def _report_comparison(results: list[LoadResult], y_test: np.ndarray, rate: float,
                       parity: dict[str, Any]) -> None:
    n = results[0].n
    labels = [int(y_test[i % len(y_test)]) for i in range(n)]
    classes = [_classes(r) for r in results]
    summaries = [r.summary() for r in results]
    rebuilt_in = [[i for i, r in enumerate(res.results)
                   if isinstance(r, dict) and r.get("reconstructed")] for res in results]
    rebuilt = rebuilt_in[1]

    def accuracy(cls: list[int | None], idx: list[int]) -> float:
        return sum(cls[i] == labels[i] for i in idx) / len(idx) if idx else float("nan")

    table = Table(title=f"the same {n} queries at {rate:g} q/s, replica 0 slowed by bursts")
    table.add_column("metric")
    for arm in ARMS:
        table.add_column(arm.title, justify="right")
    rows: list[tuple[str, list[str]]] = [
        ("throughput", [f"{s['throughput_qps']:.1f} q/s" for s in summaries]),
        ("p50 latency", [f"{s['p50_ms']:.2f} ms" for s in summaries]),
        ("p99 latency", [f"{s['p99_ms']:.2f} ms" for s in summaries]),
        ("p99.9 latency", [f"{s['p999_ms']:.2f} ms" for s in summaries]),
        ("answers measured", [str(s["ok"]) for s in summaries]),
        ("answers at or above p99 / p99.9",
         [f"{tail_samples(r, 99.0)} / {tail_samples(r, 99.9)}" for r in results]),
        ("accuracy vs labels", [f"{accuracy(c, list(range(n))):.2%}" for c in classes]),
        ("default answers (SLO misses)",
         [str(sum(1 for r in res.results if isinstance(r, dict) and r.get("default")))
          for res in results]),
        ("reconstructed answers", [str(len(idx)) for idx in rebuilt_in]),
        ("errors", [str(sum(s["errors"].values())) for s in summaries]),
    ]
    for name, values in rows:
        table.add_row(name, *values)
    console.print(table)

    for arm, s in zip(ARMS, summaries, strict=True):
        _explain_errors(s["errors"], f"{arm.label}: ")
    console.print(verdict(summaries[0], summaries[1]))
    if rebuilt:
        own = [i for i in rebuilt if classes[0][i] is not None]
        console.print(
            f"{len(rebuilt)} of {n} answers were reconstructed by ParM; their accuracy against "
            f"the labels: {accuracy(classes[1], rebuilt):.1%} (vs "
            f"{accuracy(classes[0], own):.1%} for the model's own answers to the same queries, "
            "without coding)")
    else:
        console.print(f"0 of {n} answers were reconstructed by ParM: no batch was late enough "
                      "to need it.")
    console.print(f"(offline, over all {len(y_test)} test digits: the model "
                  f"{parity['accuracy_available']:.1%}, a rebuilt answer "
                  f"{parity['accuracy_degraded']:.1%})")


def judged_percentile(answers: int) -> float:
    """The tail percentile the verdict judges: p99.9 when at least 1,000 answers stand behind
    it (so it is not the single slowest), else p99. Fixed by the count alone, before the
    latencies are seen, so the verdict cannot pick whichever percentile looks better."""
    return 99.9 if enough_samples(answers, 99.9) else 99.0


def tail_samples(result: LoadResult, percentile: float) -> int:
    """How many answered queries were at least as slow as ``percentile``: what stands behind
    that figure."""
    lat = result.latencies_s[result.ok]
    if lat.size == 0:
        return 0
    cut = float(np.percentile(lat, percentile, method="higher"))
    return int(np.count_nonzero(lat >= cut))


def verdict(uncoded: dict[str, Any], coded: dict[str, Any]) -> str:
    """One line on the tail, judged at ``judged_percentile`` of the smaller answer count.

    Both summaries come from ``LoadResult.summary()``. The line names the percentile, both
    values and the answers behind them; it never switches percentile to flatter either side.
    """
    answers = min(int(uncoded["ok"]), int(coded["ok"]))
    pct = judged_percentile(answers)
    key = "p999_ms" if pct == 99.9 else "p99_ms"
    name = f"p{pct:g}"
    before, after = float(uncoded[key]), float(coded[key])
    behind = f"{answers:,} answers per deployment, about {answers * (100 - pct) / 100:.0f} " \
             f"at or above the {name}"
    if after < before:
        return (f"Judged on the {name}: ParM cut it {before / after:.1f}x, {before:.1f} ms -> "
                f"{after:.1f} ms, with the same number of worker processes ({behind}).")
    return (f"Judged on the {name}: ParM did not cut it, {before:.1f} ms -> {after:.1f} ms "
            f"({behind}); on a busy machine the parity work can cost more than it saves; try "
            "a lower --coding-rate.")


# --- shared --------------------------------------------------------------------------------------


def _serve(stack: contextlib.ExitStack, config_path: Path, cache_dir: Path, what: str,
           status: str) -> ServerProcess:
    """Start a server for ``config_path``; ``stack`` stops it (and its workers) on exit."""
    with console.status(status):
        server = ServerProcess(config_path, log_dir=cache_dir / "logs").start()
    stack.callback(_stop, server, what)
    console.print(f"serving on {server.url}  (config: {config_path})")
    return server


def _stop(server: ServerProcess, what: str) -> None:
    code = server.stop()
    console.print(f"{what} stopped (exit code {code}); no worker left behind.")


def _print_urls(url: str, paths: list[tuple[str, str]]) -> None:
    console.print("\n[bold]explore:")
    for what, path in paths:
        console.print(f"  {what:<9} {url}{path}")


def _wait_for_ctrl_c() -> None:
    console.print("\nserving until Ctrl-C ...")
    with contextlib.suppress(KeyboardInterrupt):
        signal.pause()
