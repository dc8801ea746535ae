"""Open-loop load generation: Poisson arrivals, latency from each query's intended send time.

A closed-loop client waits for an answer before it sends the next query, so a slow server
slows the client down and the queries that would have met the tail are never sent
(coordinated omission). Here the send times are drawn in advance, a query is launched at its
time whether or not earlier ones have answered, and its latency runs from the time it *should*
have been sent. A late generator, a full connection pool or an overloaded server all show up
in the numbers instead of hiding.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import time
from collections import Counter
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import orjson

from parityserve.bench.stats import enough_samples, percentiles
from parityserve.errors import ConfigError

__all__ = [
    "HttpSender",
    "HttpStatusError",
    "LoadResult",
    "Send",
    "collector_paused",
    "encode_bodies",
    "error_kind",
    "json_open_loop",
    "json_sender",
    "poisson_schedule",
    "run_at_rates",
    "run_event_loop",
    "run_open_loop",
    "warm_open_loops",
    "warm_up",
    "warmed_json_sender",
]

Send = Callable[[int], Awaitable[Any]]
T = TypeVar("T")

# When the generator is behind schedule it launches overdue queries back to back; it still
# yields every this many launches so that responses keep being read meanwhile.
_YIELD_EVERY = 32


def poisson_schedule(rate_qps: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Intended send offsets in seconds from the start: cumulative exponential gaps."""
    if not (math.isfinite(rate_qps) and rate_qps > 0):
        raise ConfigError(f"rate_qps must be a positive number, got {rate_qps}")
    if n < 0:
        raise ConfigError(f"n must be >= 0, got {n}")
    return np.cumsum(rng.exponential(1.0 / rate_qps, size=n))


def error_kind(exc: BaseException) -> str:
    """How an error is counted: an explicit ``kind`` attribute, else the exception's type name."""
    kind = getattr(exc, "kind", None)
    return kind if isinstance(kind, str) else type(exc).__name__


@dataclass(frozen=True, eq=False)
class LoadResult:
    """What one open-loop run saw. Index i in every array is query i of the schedule.

    ``latencies_s`` holds every query's latency from its intended send time; for a query that
    timed out it is a lower bound (the time waited). ``send_lag_s`` is how late the generator
    started each send: if it is large, the client, not the server, is the bottleneck.
    Percentiles in ``summary`` cover the successful queries only; failures are counted in
    ``errors``, never dropped.
    """

    latencies_s: np.ndarray
    ok: np.ndarray
    results: list[Any]
    errors: Counter[str]
    offered_rate: float
    duration_s: float
    send_lag_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # ``time.perf_counter()`` when schedule time 0 was: query i was meant to leave at
    # ``started_at + schedule[i]`` (NaN where the run did not say).
    started_at: float = math.nan

    @property
    def n(self) -> int:
        return int(self.ok.size)

    @property
    def throughput(self) -> float:
        """Successful queries per second of wall time."""
        return float(self.ok.sum()) / self.duration_s if self.duration_s > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        lat = self.latencies_s[self.ok]
        n_ok = int(lat.size)
        lag = percentiles(self.send_lag_s)
        return {
            "n": self.n,
            "ok": n_ok,
            "errors": dict(self.errors),
            "throughput_qps": self.throughput,
            "offered_qps": self.offered_rate,
            **percentiles(lat),
            "mean_ms": float(lat.mean() * 1e3) if n_ok else math.nan,
            "max_ms": float(lat.max() * 1e3) if n_ok else math.nan,
            "p999_reliable": enough_samples(n_ok, 99.9),
            "send_lag_p50_ms": lag["p50_ms"],
            "send_lag_p99_ms": lag["p99_ms"],
        }


class _Recorder:
    """Per-query outcome slots, filled in as queries start and complete."""

    def __init__(self, intended: np.ndarray, on_done: Callable[[], object] | None) -> None:
        n = intended.size
        self.intended = intended  # absolute perf_counter() times
        self.latencies = np.full(n, np.nan)
        self.lags = np.full(n, np.nan)
        self.ok = np.zeros(n, dtype=bool)
        self.results: list[Any] = [None] * n
        self.kinds: list[str | None] = [None] * n
        self.last_done = 0.0
        self._on_done = on_done

    def started(self, i: int) -> None:
        self.lags[i] = time.perf_counter() - self.intended[i]

    def success(self, i: int, value: Any) -> None:
        self.ok[i] = True
        self.results[i] = value
        self._finish(i)

    def failure(self, i: int, kind: str) -> None:
        self.kinds[i] = kind
        self._finish(i)

    def is_done(self, i: int) -> bool:
        return bool(self.ok[i]) or self.kinds[i] is not None

    def _finish(self, i: int) -> None:
        now = time.perf_counter()
        self.latencies[i] = now - self.intended[i]
        self.last_done = max(self.last_done, now)
        if self._on_done is not None:
            self._on_done()


async def _one(send: Send, i: int, rec: _Recorder, slots: asyncio.Semaphore) -> None:
    rec.started(i)
    try:
        value = await send(i)
    except Exception as exc:  # any failure is a counted error, never a lost query
        rec.failure(i, error_kind(exc))
    else:
        rec.success(i, value)
    finally:
        slots.release()


async def _wait_until(when: float, spin_s: float) -> None:
    # Loop timers fire up to ~1 ms late; spinning (yielding) through the last spin_s trades
    # CPU for punctual sends.
    delay = when - time.perf_counter()
    if delay > spin_s:
        await asyncio.sleep(delay - spin_s)
    while time.perf_counter() < when:
        await asyncio.sleep(0)


async def _dispatch(send: Send, rec: _Recorder, slots: asyncio.Semaphore, spin_s: float
                    ) -> dict[asyncio.Task[None], int]:
    """Launch query i at its intended time, never waiting for earlier answers."""
    tasks: dict[asyncio.Task[None], int] = {}
    for i, when in enumerate(rec.intended.tolist()):
        if when > time.perf_counter():
            await _wait_until(when, spin_s)
        elif i % _YIELD_EVERY == 0:
            await asyncio.sleep(0)
        # Past max_in_flight this waits; the wait counts in the latency (it is overload).
        await slots.acquire()
        tasks[asyncio.create_task(_one(send, i, rec, slots))] = i
    return tasks


async def _drain(tasks: dict[asyncio.Task[None], int], rec: _Recorder, timeout_s: float
                 ) -> None:
    """Wait for outstanding queries; mark the ones still running after ``timeout_s`` as errors."""
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for task in pending:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for task, i in tasks.items():
        if not rec.is_done(i):  # cancelled by us, or the send itself was cancelled
            rec.failure(i, "timeout" if task in pending else "CancelledError")


def _progress_bar(progress: bool | str, n: int) -> Any:
    if not progress:
        return None
    from tqdm import tqdm  # only when asked: keeps plain runs free of terminal output

    label = progress if isinstance(progress, str) else "queries"
    return tqdm(total=n, desc=label, unit="q", dynamic_ncols=True)


async def run_open_loop(
    send: Send,
    schedule: np.ndarray,
    *,
    progress: bool | str = False,
    max_in_flight: int = 10_000,
    timeout_s: float = 30.0,
    rate_qps: float | None = None,
    spin_s: float = 0.0,
) -> LoadResult:
    """Send query i at ``schedule[i]`` seconds from now and record how each one ended.

    ``timeout_s`` bounds the wait for outstanding queries after the last one is launched.
    ``rate_qps`` is the nominal rate to report; by default, the schedule's empirical rate.
    ``spin_s`` > 0 (e.g. 0.001) busy-yields that long before each send to beat timer
    granularity; it costs a core at high rates, so use it only where one is spare.
    """
    if max_in_flight < 1:
        raise ConfigError(f"max_in_flight must be >= 1, got {max_in_flight}")
    schedule = np.asarray(schedule, dtype=float)
    bar = _progress_bar(progress, schedule.size)
    with collector_paused():
        start = time.perf_counter()
        rec = _Recorder(start + schedule, None if bar is None else bar.update)
        try:
            tasks = await _dispatch(send, rec, asyncio.Semaphore(max_in_flight), spin_s)
            await _drain(tasks, rec, timeout_s)
        finally:
            if bar is not None:
                bar.close()
    return _result(rec, schedule, start, rate_qps)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a run is timed.

    Why: a generator that stalls adds its stall to the latency of every query in flight, and
    reads as the server's tail. A full (generation 2) collection in the generator walks every
    object the process holds (torch, numpy, the bodies, the results so far). In the EMULATED
    testbed's baseline with nothing slowed (``benchmarks/diagnostics/loadgen_gc.py``, results
    in ``benchmarks/results/loadgen-gc/``), each 10,000-query run at 250 q/s had one or two,
    of 90-97 ms, and they *were* the run's p99.9: 81-115 ms with the collector on against
    43.7-44.2 ms paused, p50 34 ms in both, 3 interleaved rounds. The cost is memory: cycles
    made during a run wait for the first automatic collection after it (a by-hand run left
    1,143 such objects; its RSS grew 47 MB, mostly the results). Reference counting frees
    the rest at once. No collection is forced here: a caller that runs many short loops
    (the demo's blocks, the test suite) would pay a full walk of its heap for each.
    """
    if _PAUSE.runs == 0:
        _PAUSE.was_enabled = gc.isenabled()
        gc.disable()
    _PAUSE.runs += 1  # runs may overlap in one process: the last one out restores it
    try:
        yield
    finally:
        _PAUSE.runs -= 1
        if _PAUSE.runs == 0 and _PAUSE.was_enabled:
            gc.enable()


@dataclass
class _PauseState:
    runs: int = 0  # timed runs under way in this process
    was_enabled: bool = True  # the collector's state when the first of them began


_PAUSE = _PauseState()


def _result(rec: _Recorder, schedule: np.ndarray, start: float, rate_qps: float | None
            ) -> LoadResult:
    errors = Counter(kind for kind in rec.kinds if kind is not None)
    if rate_qps is None:
        span = float(schedule[-1]) if schedule.size else 0.0
        rate_qps = schedule.size / span if span > 0 else math.nan
    return LoadResult(
        latencies_s=rec.latencies,
        ok=rec.ok,
        results=rec.results,
        errors=errors,
        offered_rate=float(rate_qps),
        duration_s=max(rec.last_done - start, 0.0),
        send_lag_s=rec.lags,
        started_at=start,
    )


def run_event_loop(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on uvloop when it is installed.

    uvloop's timers fire closer to the schedule than the default loop's (p50 send lag about
    0.1 ms instead of 0.7 ms with a no-op send on a 2-core VM), and the generator's lateness
    counts as latency.
    """
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


async def run_at_rates(
    send: Send,
    rates: Sequence[float],
    *,
    queries: int | None = None,
    duration_s: float | None = None,
    seed: int = 0,
    progress: bool | str = False,
    max_in_flight: int = 10_000,
    timeout_s: float = 30.0,
    pause_s: float = 0.0,
    spin_s: float = 0.0,
) -> list[tuple[float, LoadResult]]:
    """One open-loop run per rate, each on a fresh seeded schedule.

    Give either ``queries`` (per rate) or ``duration_s`` (queries = rate x duration). A rate's
    schedule depends only on ``seed`` and the rate, so reordering ``rates`` changes nothing.
    ``pause_s`` idles between rates so that one rate's backlog does not leak into the next.
    """
    out: list[tuple[float, LoadResult]] = []
    for rate in rates:
        rng = np.random.default_rng([seed, round(rate * 1000)])
        schedule = poisson_schedule(rate, _query_count(rate, queries, duration_s), rng)
        label = _rate_label(progress, rate)
        result = await run_open_loop(send, schedule, progress=label, rate_qps=rate,
                                     max_in_flight=max_in_flight, timeout_s=timeout_s,
                                     spin_s=spin_s)
        out.append((rate, result))
        if pause_s > 0:
            await asyncio.sleep(pause_s)
    return out


def _query_count(rate: float, queries: int | None, duration_s: float | None) -> int:
    if (queries is None) == (duration_s is None):
        raise ConfigError("give exactly one of queries= or duration_s=")
    if queries is not None:
        return queries
    assert duration_s is not None
    return max(1, round(rate * duration_s))


def _rate_label(progress: bool | str, rate: float) -> bool | str:
    if not progress:
        return False
    prefix = f"{progress} " if isinstance(progress, str) else ""
    return f"{prefix}{rate:g} qps"


# --- HTTP ---------------------------------------------------------------------------------


class HttpStatusError(Exception):
    """A non-success HTTP status, counted under the kind ``"HTTP <status>"``."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:200]!r}")
        self.status = status
        self.body = body
        self.kind = f"HTTP {status}"


class HttpSender:
    """One shared HTTP client with a keep-alive pool of ``limit`` connections.

    Bodies are sent pre-serialised so the generator spends its time sending, not encoding.
    If the pool is smaller than the number of queries in flight, queries queue for a
    connection on the client side; that wait counts in their latency, so size ``limit`` above
    the concurrency you expect the server to sustain.

    ``client`` is ``"aiohttp"`` (the ``bench`` extra; it costs the generator less per request,
    so measurements use it) or ``"httpx"`` (always installed: ``parityserve demo`` runs on a
    plain install). The default is aiohttp when it can be imported, else httpx.
    """

    def __init__(self, base_url: str, *, limit: int = 256, timeout_s: float = 60.0,
                 client: str | None = None) -> None:
        if client not in (None, *_CLIENTS):
            raise ConfigError(f"HttpSender client must be one of {_CLIENTS}, not {client!r}")
        self.base_url = base_url.rstrip("/")
        self.limit = limit
        self.timeout_s = timeout_s
        self.client = client or ("aiohttp" if _has_aiohttp() else "httpx")
        self._session: Any = None

    async def __aenter__(self) -> HttpSender:
        opened = _open_aiohttp if self.client == "aiohttp" else _open_httpx
        self._session = opened(self.limit, self.timeout_s)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await (session.close() if self.client == "aiohttp" else session.aclose())

    async def post_json(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST an already-encoded JSON body; returns (status, body). Connection errors raise."""
        return await self.post(path, body, _JSON_HEADERS)

    async def post(self, path: str, body: bytes, headers: Mapping[str, str]
                   ) -> tuple[int, bytes]:
        """POST a pre-encoded body with its headers (e.g. a V2 binary tensor request)."""
        if self._session is None:
            raise RuntimeError("HttpSender is used outside 'async with'")
        url = self.base_url + path
        if self.client == "httpx":
            reply = await self._session.post(url, content=body, headers=headers)
            return reply.status_code, reply.content
        async with self._session.post(url, data=body, headers=headers) as resp:
            return resp.status, await resp.read()


_CLIENTS = ("aiohttp", "httpx")


def _has_aiohttp() -> bool:
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        return False
    return True


def _open_aiohttp(limit: int, timeout_s: float) -> Any:
    # imported here: the rest of the load generator, and a plain install, work without it
    try:
        import aiohttp
    except ImportError as exc:
        raise ConfigError("HttpSender(client='aiohttp') needs aiohttp: "
                          "pip install 'parityserve[bench]'") from exc
    connector = aiohttp.TCPConnector(limit=limit, keepalive_timeout=60.0)
    return aiohttp.ClientSession(connector=connector,
                                 timeout=aiohttp.ClientTimeout(total=timeout_s))


def _open_httpx(limit: int, timeout_s: float) -> Any:
    import httpx

    limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit,
                          keepalive_expiry=60.0)
    # httpx bounds each phase (connect, write, pool wait, read), aiohttp the whole request.
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout_s))


_JSON_HEADERS = {"Content-Type": "application/json"}


def encode_bodies(inputs: Sequence[Any], key: str = "input") -> list[bytes]:
    """Pre-serialise ``{key: x}`` for each input (numpy arrays included) with orjson."""
    option = orjson.OPT_SERIALIZE_NUMPY
    return [orjson.dumps({key: _contiguous(x)}, option=option) for x in inputs]


def _contiguous(x: Any) -> Any:
    # orjson serialises only C-contiguous arrays.
    return np.ascontiguousarray(x) if isinstance(x, np.ndarray) else x


def json_sender(http: HttpSender, path: str, bodies: Sequence[bytes]) -> Send:
    """A ``send`` that POSTs ``bodies[i % len(bodies)]`` and returns the decoded JSON answer.

    A non-200 answer raises ``HttpStatusError``, so it is counted as ``"HTTP <status>"``.
    """
    if not bodies:
        raise ConfigError("json_sender needs at least one body")

    async def send(i: int) -> Any:
        status, raw = await http.post_json(path, bodies[i % len(bodies)])
        if status != 200:
            raise HttpStatusError(status, raw)
        return orjson.loads(raw)

    return send


@contextlib.asynccontextmanager
async def warmed_json_sender(url: str, path: str, bodies: Sequence[bytes], *, warmup: int,
                             limit: int = 256) -> AsyncIterator[Send]:
    """A ``json_sender`` for ``url + path`` on its own connection pool, handed over after
    ``warmup`` queries (see ``warm_up``), so that whatever the caller measures next starts
    warm."""
    async with HttpSender(url, limit=limit) as http:
        send = json_sender(http, path, bodies)
        await warm_up(send, warmup)
        yield send


async def warm_up(send: Send, n: int) -> None:
    """``n`` queries one after another, answers discarded: the connections are open and the
    server's first batches (imports, allocations, the AIMD ramp) are past before timing."""
    for i in range(n):
        await send(i)


def json_open_loop(url: str, path: str, bodies: Sequence[bytes], schedules: Sequence[np.ndarray],
                   *, warmup: int, limit: int = 256, timeout_s: float = 60.0,
                   progress: bool | str = False) -> list[LoadResult]:
    """POST ``bodies`` to ``url + path`` on each schedule (send offsets in seconds), back to
    back on one connection pool, after ``warmup`` queries whose answers are discarded; each
    run's offered rate is its schedule's own."""
    async def go() -> list[LoadResult]:
        async with HttpSender(url, limit=limit) as http:
            return await warm_open_loops(json_sender(http, path, bodies), schedules,
                                         warmup=warmup, timeout_s=timeout_s, progress=progress)

    return run_event_loop(go())


async def warm_open_loops(send: Send, schedules: Sequence[np.ndarray], *, warmup: int,
                          timeout_s: float = 60.0, progress: bool | str = False
                          ) -> list[LoadResult]:
    """``warmup`` queries one after another (answers discarded), then one open-loop run per
    schedule, back to back on ``send``; each run's offered rate is its schedule's own."""
    await warm_up(send, warmup)
    return [await run_open_loop(send, schedule, progress=progress,
                                rate_qps=schedule.size / max(float(schedule[-1]), 1e-9),
                                max_in_flight=10_000, timeout_s=timeout_s)
            for schedule in schedules]
