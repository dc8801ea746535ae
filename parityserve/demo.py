"""``make demo``: train a digits classifier, serve it with 2 replicas, and load-test it."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from parityserve.bench.loadgen import (
    HttpSender,
    LoadResult,
    encode_bodies,
    json_sender,
    poisson_schedule,
    run_open_loop,
)
from parityserve.bench.serverproc import ServerProcess, write_config
from parityserve.models.datasets import load_digits_split
from parityserve.models.digits import train_digits_classifier

__all__ = ["run_demo"]

console = Console()


def demo_config(model_path: Path) -> dict[str, Any]:
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
                "slo_ms": 50,
                "default_output": -1,
            }
        ],
    }


def run_demo(*, queries: int, rate: float, cache_dir: Path, keep_serving: bool, seed: int) -> int:
    console.rule("[bold]parityserve demo")
    with console.status("training a digits classifier (cached after the first run)"):
        model_path = train_digits_classifier(cache_dir, seed=seed)
    console.print(f"model: {model_path}")
    config_path = write_config(demo_config(model_path), cache_dir / "demo-serving.yaml")
    _, _, x_test, y_test = load_digits_split(seed=seed)
    with console.status("starting the server and 2 worker replicas"):
        server = ServerProcess(config_path, log_dir=cache_dir / "logs").start()
    try:
        console.print(f"serving on {server.url}  (config: {config_path})")
        result = asyncio.run(_load(server.url, x_test, queries, rate, seed))
        _report(result, y_test, rate)
        _print_urls(server.url)
        if keep_serving:
            _wait_for_ctrl_c()
        else:
            console.print("\n(the server stops now; run `parityserve demo --serve` to keep it "
                          "up and explore these URLs)")
    finally:
        code = server.stop()
    console.print(f"server stopped (exit code {code}); no worker left behind.")
    return 0 if not result.summary()["errors"] else 1


async def _load(url: str, x_test: np.ndarray, queries: int, rate: float, seed: int) -> LoadResult:
    bodies = encode_bodies(list(x_test))
    schedule = poisson_schedule(rate, queries, np.random.default_rng(seed))
    async with HttpSender(url) as http:
        send = json_sender(http, "/digits/predict", bodies)
        return await run_open_loop(send, schedule, progress=f"open-loop {rate:g} q/s")


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


def _print_urls(url: str) -> None:
    console.print("\n[bold]explore:")
    for what, path in [
        ("predict", '/digits/predict  (POST {"input": [64 floats]})'),
        ("V2 model", "/v2/models/digits-logreg"),
        ("metrics", "/metrics"),
        ("admin", "/admin/state"),
        ("health", "/v2/health/ready"),
    ]:
        console.print(f"  {what:<9} {url}{path}")


def _wait_for_ctrl_c() -> None:
    console.print("\nserving until Ctrl-C ...")
    with contextlib.suppress(KeyboardInterrupt):
        signal.pause()
