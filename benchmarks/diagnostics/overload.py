"""Overload: a model slowed by fault injection, offered a multiple of its capacity, open-loop.

One replica of ``zoo:echo`` with ``max_batch_size: 1`` and an injected ``delay_ms`` per batch
serves at most ``1000 / delay_ms`` queries per second: that is its capacity. The script offers
``factor`` times that for ``duration_s`` (a fixed schedule, each query sent at its intended
time whatever happened to earlier ones), alternating the Clipper route and the V2 route, and
counts how each query was answered. The server runs in this process (``RunningServer``), so
this process's RSS is the frontend's.

    PYTHONPATH=. python benchmarks/diagnostics/overload.py --factor 3.75 --duration 20

Run it with ``PYTHONPATH`` at an older checkout to count the same load before a change. It
uses only what every version has (the config keys, the routes, ``RunningServer``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from parityserve.config import parse_config
from parityserve.runtime.server import RunningServer

__all__ = ["config", "offer", "rss_bytes", "run"]

_VECTOR = {"name": "input", "datatype": "FP32", "shape": [4]}


def config(delay_ms: float, slo_ms: float) -> dict[str, Any]:
    return {
        # 1,000 connections from loopback, one address: past the default per-address cap
        "server": {"http_port": 0, "cache_bytes": 0, "heartbeat_timeout_ms": 5000,
                   "limits": {"max_connections_per_address": 1024}},
        "models": [{"name": "slow", "source": "zoo:echo", "replicas": 1, "input": _VECTOR,
                    "timeout_ms": slo_ms, "batching": {"max_batch_size": 1},
                    "faults": {"all": {"delay_ms": delay_ms}}}],
        "applications": [{"name": "slowapp", "models": ["slow"], "slo_ms": slo_ms,
                          "default_output": "DEFAULT"}],
    }


def rss_bytes() -> int:
    """This process's resident set size, from /proc (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _classify(route: str, response: httpx.Response) -> str:
    """One answer's kind: prediction, default, shed, deadline, or other:<status>."""
    status = response.status_code
    if status in (429, 503) and response.headers.get("retry-after"):
        return "shed"
    if status == 504 and route == "v2":
        return "deadline"
    if status != 200:
        return f"other:{status}"
    if route == "predict":
        return "default" if response.json().get("default") else "prediction"
    return "prediction"


async def _one(client: httpx.AsyncClient, i: int, at: float, counts: Counter[str]) -> None:
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    x = np.random.default_rng(i).random(4).tolist()
    route = "predict" if i % 2 == 0 else "v2"
    try:
        if route == "predict":
            response = await client.post("/slowapp/predict", json={"input": x})
        else:
            body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4],
                                "data": x}]}
            response = await client.post("/v2/models/slow/infer", json=body)
        counts[_classify(route, response)] += 1
    except httpx.HTTPError as exc:
        counts[f"error:{type(exc).__name__}"] += 1


async def offer(url: str, rate_qps: float, duration_s: float) -> Counter[str]:
    """Send ``rate_qps * duration_s`` queries at fixed intervals; count the answers."""
    counts: Counter[str] = Counter()
    n = int(rate_qps * duration_s)
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=url, timeout=60.0, limits=limits) as client:
        start = time.monotonic() + 0.2
        await asyncio.gather(*(_one(client, i, start + i / rate_qps, counts) for i in range(n)))
    counts["sent"] = n
    return counts


def run(factor: float, duration_s: float, delay_ms: float = 50.0, slo_ms: float = 500.0,
        base_dir: Path | None = None) -> dict[str, Any]:
    """Start a server, offer ``factor`` x capacity, and report counts and RSS growth."""
    capacity = 1000.0 / delay_ms
    with tempfile.TemporaryDirectory() as tmp:
        where = base_dir or Path(tmp)
        server = RunningServer(parse_config(config(delay_ms, slo_ms)), base_dir=where,
                               log_dir=where / "logs").start()
        try:
            rss_before = rss_bytes()
            counts = asyncio.run(offer(server.url, factor * capacity, duration_s))
            rss_after = rss_bytes()
            path = server.system.models["slow"]
            shed = getattr(path, "shed", None)
        finally:
            server.stop()
    return {"factor": factor, "capacity_qps": capacity, "rate_qps": factor * capacity,
            "duration_s": duration_s, "delay_ms": delay_ms, "slo_ms": slo_ms,
            "counts": dict(sorted(counts.items())), "shed_by_model": shed,
            "rss_before_mib": rss_before / 2**20, "rss_after_mib": rss_after / 2**20,
            "rss_growth_mib": (rss_after - rss_before) / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--factor", type=float, default=5.0)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--delay-ms", type=float, default=50.0)
    parser.add_argument("--slo-ms", type=float, default=500.0)
    args = parser.parse_args()
    print(json.dumps(run(args.factor, args.duration, args.delay_ms, args.slo_ms), indent=2))


if __name__ == "__main__":
    main()
