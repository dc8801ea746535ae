"""A low-load latency probe: one keep-alive connection and the standard library's HTTP client.

Why a second client: at low load the aiohttp-based open-loop generator's own cost per request
(about a millisecond on the 2-core VM) sits inside every latency it reports, for the bare app
and for parityserve alike. The probe sends the same kind of Poisson schedule over one
connection with ``http.client``, which costs a fraction of that, so its p50 is closer to what
the server itself adds. It is only meaningful at low load, where gaps are much longer than
answers; that is exactly where the overhead target is stated.

Latency runs from each query's *intended* send time. When an answer comes back after the next
query was due, that query goes out late and the wait counts in its latency, so a slow server
cannot hide behind the single connection (no coordinated omission).
"""

from __future__ import annotations

import http.client
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from parityserve.bench.loadgen import poisson_schedule
from parityserve.bench.stats import percentiles
from parityserve.errors import ConfigError

__all__ = ["probe"]

# Sleep until this close to a send time, then spin: time.sleep wakes up to ~0.1 ms late, and
# lateness would count in the latency.
_SPIN_S = 0.0005
_HEADERS = {"Content-Type": "application/json"}


def probe(url: str, path: str, bodies: Sequence[bytes], *, rate_qps: float, n: int,
          seed: int = 0, warm_up: int = 100, timeout_s: float = 30.0) -> dict[str, Any]:
    """POST ``bodies[i % len]`` at Poisson times on one connection; percentiles of the answers.

    Non-200 answers and connection errors are counted in ``errors`` (by kind), never dropped;
    after a connection error the probe reconnects and goes on.
    """
    if not bodies:
        raise ConfigError("the probe needs at least one request body")
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ConfigError(f"the probe needs an http://host:port URL, got {url!r}")
    conn = _Connection(parts.hostname, parts.port or 80, timeout_s)
    try:
        for i in range(warm_up):
            conn.post(path, bodies[i % len(bodies)])
        schedule = poisson_schedule(rate_qps, n, np.random.default_rng(seed))
        return _run(conn, path, bodies, schedule, rate_qps)
    finally:
        conn.close()


def _run(conn: _Connection, path: str, bodies: Sequence[bytes], schedule: np.ndarray,
         rate_qps: float) -> dict[str, Any]:
    latencies = np.full(schedule.size, np.nan)
    errors: Counter[str] = Counter()
    start = time.perf_counter()
    for i, offset in enumerate(schedule.tolist()):
        intended = start + offset
        _wait_until(intended)
        try:
            status = conn.post(path, bodies[i % len(bodies)])
        except (OSError, http.client.HTTPException) as exc:
            errors[type(exc).__name__] += 1
            conn.reconnect()
            continue
        if status != 200:
            errors[f"HTTP {status}"] += 1
            continue
        latencies[i] = time.perf_counter() - intended
    ok = np.isfinite(latencies)
    return {"n": int(schedule.size), "ok": int(ok.sum()), "errors": dict(errors),
            "offered_qps": rate_qps, **percentiles(latencies[ok])}


def _wait_until(when: float) -> None:
    delay = when - time.perf_counter()
    if delay > _SPIN_S:
        time.sleep(delay - _SPIN_S)
    while time.perf_counter() < when:
        pass


class _Connection:
    """One keep-alive HTTP/1.1 connection that reconnects after an error."""

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        self._args = (host, port, timeout_s)
        self._conn = http.client.HTTPConnection(host, port, timeout=timeout_s)

    def post(self, path: str, body: bytes) -> int:
        self._conn.request("POST", path, body, _HEADERS)
        response = self._conn.getresponse()
        response.read()  # the whole answer, or the connection cannot be reused
        return response.status

    def reconnect(self) -> None:
        self.close()
        host, port, timeout_s = self._args
        self._conn = http.client.HTTPConnection(host, port, timeout=timeout_s)

    def close(self) -> None:
        self._conn.close()
