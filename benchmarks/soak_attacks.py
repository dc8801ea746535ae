"""The soak's hostile clients (``benchmarks/soak.py``): every attack of issue 38, on a loop.

They run in a process of their own, so that building 10 MB keys or holding a thousand
sockets does not stall the well-behaved client's generator (both still share this machine's
cores with the server: the soak says so). Each attack repeats at its own pace until the window
ends and tallies what it sent and every answer: an HTTP status, a gRPC status name, ``held``
(an idle socket the server neither answered nor closed), or the client-side error's name.

The attackers connect from loopback addresses other than the well-behaved client's
(127.0.0.2 for the idle-connection hog, 127.0.0.3 for the rest): to the server they are other
clients, as they would be on a network.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import orjson

__all__ = ["ATTACKS", "UNANSWERED", "Attack", "Target", "is_finding", "prepare_attacks",
           "run_attacks"]

HOG_ADDRESS = "127.0.0.2"
ATTACKER_ADDRESS = "127.0.0.3"
HOG_SOCKETS = 1030  # the count: just past the default max_connections (1024)
HOG_HOLD_S = 9.0  # reopened every 9 s: inside the default 10 s header timeout
HUGE = [1024, 4194304]  # 2**32 elements claimed by a body of a few bytes
LONG_KEY = b"k" * 10_000_000  # a 10 MB stream key
ROW_CAP_ROWS = 50_000
FLOOD_ROWS = 1024


@dataclass(frozen=True)
class Target:
    """What the attacks aim at: the server's URLs, the README graph and the model."""

    url: str
    grpc: str | None
    graph: str
    stream_key: str
    model: str
    width: int = 4


Labels = list[tuple[str, str]]  # (attack name, answer) for each request sent
UNANSWERED = "unanswered at the window's end"  # an attack round cut off by the window's end


@dataclass(frozen=True)
class Attack:
    """One attack: its name in the report, the answers that mean the server held, its pace,
    and the coroutine that sends one round of it."""

    name: str
    expect: frozenset[str]
    interval_s: float
    run: Callable[[_Ctx], Awaitable[Labels]]


def is_finding(answer: str) -> bool:
    """A 5xx, a gRPC error that is the server's fault, or a dropped connection."""
    return (answer[:1] == "5" or answer in ("grpc INTERNAL", "grpc UNKNOWN", "grpc UNAVAILABLE",
                                            "grpc DEADLINE_EXCEEDED")
            or answer.startswith("error "))


class _Ctx:
    """Per-process state the attacks share: their HTTP client and counters."""

    def __init__(self, target: Target, seed: int) -> None:
        self.target = target
        self.rng = random.Random(seed)
        self.counter = itertools.count()
        self.http = httpx.AsyncClient(
            base_url=target.url, timeout=httpx.Timeout(60.0),
            # idle connections are dropped well before the server's 5 s keep-alive closes
            # them, so a request never races that close (a ReadError that is no finding)
            transport=httpx.AsyncHTTPTransport(
                local_address=ATTACKER_ADDRESS,
                limits=httpx.Limits(max_connections=64, keepalive_expiry=2.0)))
        self.grpc: Any = None

    async def post(self, path: str, body: bytes, headers: dict[str, str] | None = None
                   ) -> str:
        try:
            reply = await self.http.post(path, content=body,
                                         headers=headers or {"Content-Type": "application/json"})
        except httpx.HTTPError as exc:
            return f"error {type(exc).__name__}"
        return str(reply.status_code)

    async def get(self, path: str, headers: dict[str, str]) -> str:
        try:
            reply = await self.http.get(path, headers=headers)
        except httpx.HTTPError as exc:
            return f"error {type(exc).__name__}"
        return str(reply.status_code)

    def key(self, tag: str) -> str:
        return f"{tag}-{next(self.counter)}"

    async def close(self) -> None:
        await self.http.aclose()
        if self.grpc is not None:
            await self.grpc.close()


# ------------------------------------------------------------------ the graph route

WRONG_WIDTH = "graph batch: wrong-width rows"
MATES = "graph batch: their well-formed batch-mates"
_MATE_STREAMS = [f"ww{i}" for i in range(25)]


async def prepare_attacks(target: Target) -> None:
    """Open the wrong-width attack's streams before any window: its well-formed rows must be
    rows of existing streams, or once the floods have filled the stream table they would be
    refused as new streams (429) and the attack would no longer test batch isolation."""
    async with httpx.AsyncClient(base_url=target.url, timeout=60.0) as http:
        for stream in _MATE_STREAMS:
            reply = await http.post(f"/{target.graph}/predict",
                                    json={"input": [0.1] * target.width,
                                          target.stream_key: stream})
            reply.raise_for_status()


async def _wrong_width(ctx: _Ctx) -> Labels:
    """The issue's recipe: 25 concurrent graph requests, 5 of them with 2 values instead of 4,
    on the attacker's own streams (opened by ``prepare_attacks``)."""
    t = ctx.target
    shots = [(MATES, [0.1] * t.width)] * 20 + [(WRONG_WIDTH, [0.1, 0.2])] * 5
    ctx.rng.shuffle(shots)
    answers = await asyncio.gather(*(
        ctx.post(f"/{t.graph}/predict", orjson.dumps({"input": x, t.stream_key: stream}))
        for stream, (_, x) in zip(_MATE_STREAMS, shots, strict=True)))
    return [(name, a) for (name, _), a in zip(shots, answers, strict=True)]


async def _flood(ctx: _Ctx) -> Labels:
    t = ctx.target
    prefix = ctx.key("flood")
    body = {"input_batch": [[0.25] * t.width] * FLOOD_ROWS,
            "streams": [f"{prefix}-{i}" for i in range(FLOOD_ROWS)]}
    return [("1,024 new streams in one request",
             await ctx.post(f"/{t.graph}/predict", orjson.dumps(body)))]


async def _long_key(ctx: _Ctx) -> Labels:
    t = ctx.target
    body = (b'{"input": [0.1, 0.2, 0.3, 0.4], "' + t.stream_key.encode() + b'": "'
            + ctx.key("long").encode() + LONG_KEY + b'"}')
    return [("10 MB stream key", await ctx.post(f"/{t.graph}/predict", body))]


_ROW_CAP_BODY: bytes | None = None


async def _row_cap(ctx: _Ctx) -> Labels:
    global _ROW_CAP_BODY
    t = ctx.target
    if _ROW_CAP_BODY is None:
        _ROW_CAP_BODY = orjson.dumps({"input_batch": [[0.25] * t.width] * ROW_CAP_ROWS})
    return [("50,000-row input_batch", await ctx.post(f"/{t.graph}/predict", _ROW_CAP_BODY))]


async def _not_numbers(ctx: _Ctx) -> Labels:
    t = ctx.target
    key = ctx.key("nn")
    bodies = [{"input": ["0.1", "0.2", "0.3", "0.4"], t.stream_key: key},
              {"input": [True, False, True, False], t.stream_key: key}]
    answers = [await ctx.post(f"/{t.graph}/predict", orjson.dumps(b)) for b in bodies]
    tensor = {"name": "x", "datatype": "BYTES", "shape": [1, t.width],
              "data": ["a", "b", "c", "d"]}
    answers.append(await ctx.post(f"/v2/models/{t.graph}/infer",
                                  orjson.dumps({"inputs": [tensor]})))
    return [("numeric strings, booleans, BYTES to the graph", a) for a in answers]


# ------------------------------------------------------------------ huge shapes, tiny bodies

async def _huge_json(ctx: _Ctx) -> Labels:
    out = []
    for name in (ctx.target.model, ctx.target.graph):
        for datatype, data in (("BYTES", ["abcd"]), ("FP32", [1.0])):
            body = {"inputs": [{"name": "x", "datatype": datatype, "shape": HUGE,
                                "data": data}]}
            out.append(("huge shape, V2 HTTP JSON",
                        await ctx.post(f"/v2/models/{name}/infer", orjson.dumps(body))))
    return out


async def _huge_binary(ctx: _Ctx) -> Labels:
    out = []
    for name in (ctx.target.model, ctx.target.graph):
        for datatype in ("BYTES", "FP32"):
            head = orjson.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": HUGE,
                                             "parameters": {"binary_data_size": 4}}]})
            headers = {"Content-Type": "application/octet-stream",
                       "Inference-Header-Content-Length": str(len(head))}
            out.append(("huge shape, V2 HTTP binary", await ctx.post(
                f"/v2/models/{name}/infer", head + b"\0\0\0\x04", headers)))
    return out


async def _huge_grpc(ctx: _Ctx) -> Labels:
    import tritonclient.grpc.aio as grpc_aio
    from tritonclient.utils import InferenceServerException

    if ctx.target.grpc is None:
        return []
    if ctx.grpc is None:
        ctx.grpc = grpc_aio.InferenceServerClient(ctx.target.grpc)
    out = []
    for datatype, data in (("BYTES", np.array([b"abcd"], dtype=object)),
                           ("FP32", np.ones(1, np.float32))):
        tensor = grpc_aio.InferInput("x", list(data.shape), datatype)
        tensor.set_data_from_numpy(data)
        tensor.set_shape(HUGE)
        try:
            await ctx.grpc.infer(ctx.target.model, [tensor], client_timeout=60)
            answer = "grpc OK"
        except InferenceServerException as exc:
            answer = f"grpc {str(exc.status()).removeprefix('StatusCode.')}"
        out.append(("huge shape, V2 gRPC", answer))
    return out


# ------------------------------------------------------------------ the edge and admin

async def _idle_hog(ctx: _Ctx) -> Labels:
    """1,030 idle sockets from one address, held 9 s, closed and opened again: each one's
    answer is the server's first words to it (429 at the per-address cap), ``closed``, or
    ``held`` (admitted and idle)."""
    parts = urlsplit(ctx.target.url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    gate = asyncio.Semaphore(64)

    async def one() -> tuple[str, Any]:
        async with gate:
            try:
                return "open", await asyncio.open_connection(host, port,
                                                             local_addr=(HOG_ADDRESS, 0))
            except OSError as exc:
                return f"error {type(exc).__name__}", None

    opened = await asyncio.gather(*(one() for _ in range(HOG_SOCKETS)))
    started = time.monotonic()
    try:
        await asyncio.sleep(1.5)  # past the server's linger for a refused connection
        answers = [await _first_words(pair) if how == "open" else how for how, pair in opened]
        await asyncio.sleep(max(0.0, HOG_HOLD_S - (time.monotonic() - started)))
    finally:
        for how, pair in opened:
            if how == "open":
                pair[1].close()
    return [("1,030 idle connections from one address", a) for a in answers]


async def _first_words(pair: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> str:
    try:
        head = await asyncio.wait_for(pair[0].read(64), timeout=0.01)
    except TimeoutError:
        return "held"
    except OSError as exc:
        return f"error {type(exc).__name__}"
    if not head:
        return "closed"
    fields = head.split(b" ", 2)
    return fields[1].decode(errors="replace") if len(fields) > 1 else "garbage"


async def _cross_site(ctx: _Ctx) -> Labels:
    """What a web page can send without a preflight: a text/plain POST from another origin."""
    headers = {"Content-Type": "text/plain", "Origin": "http://evil.example"}
    answer = await ctx.post(f"/admin/models/{ctx.target.model}/replicas", b'{"replicas": 1}',
                            headers)
    return [("cross-site text/plain admin POST", answer)]


async def _rebinding(ctx: _Ctx) -> Labels:
    answer = await ctx.get("/admin/state", {"Host": "evil.example"})
    return [("Host: evil.example on /admin/state", answer)]


_BAD_DEPLOYS = [{"source": "zoo:nope"}, {"source": "zoo:echo", "options": {"nope": 1}},
                {"source": "zoo:echo", "input": {"name": "x", "datatype": "FP99", "shape": [4]}}]


async def _bad_deploy(ctx: _Ctx) -> Labels:
    body = {"name": ctx.key("nope"), **_BAD_DEPLOYS[next(ctx.counter) % len(_BAD_DEPLOYS)]}
    return [("deploy of zoo:nope, bad options or datatype",
             await ctx.post("/admin/models", orjson.dumps(body)))]


_REFUSED = frozenset({"400", "413"})
ATTACKS: tuple[Attack, ...] = (
    Attack(WRONG_WIDTH, _REFUSED | {"422"}, 1.0, _wrong_width),
    Attack(MATES, frozenset({"200"}), 1.0, _wrong_width),  # sent by the one above
    Attack("1,024 new streams in one request", frozenset({"200", "429"}), 2.0, _flood),
    Attack("10 MB stream key", _REFUSED, 2.0, _long_key),
    Attack("50,000-row input_batch", _REFUSED, 3.0, _row_cap),
    Attack("numeric strings, booleans, BYTES to the graph", _REFUSED, 0.5, _not_numbers),
    Attack("huge shape, V2 HTTP JSON", _REFUSED, 0.5, _huge_json),
    Attack("huge shape, V2 HTTP binary", _REFUSED, 0.5, _huge_binary),
    Attack("huge shape, V2 gRPC", frozenset({"grpc INVALID_ARGUMENT",
                                            "grpc RESOURCE_EXHAUSTED"}), 0.5, _huge_grpc),
    Attack("1,030 idle connections from one address", frozenset({"held", "429", "closed"}),
           0.0, _idle_hog),
    Attack("cross-site text/plain admin POST", frozenset({"403", "415"}), 1.0, _cross_site),
    Attack("Host: evil.example on /admin/state", frozenset({"421"}), 1.0, _rebinding),
    Attack("deploy of zoo:nope, bad options or datatype", frozenset({"400"}), 5.0,
           _bad_deploy),
)


async def _loop(ctx: _Ctx, attack: Attack, until: float, tally: dict[str, Counter[str]],
                rounds_ms: dict[str, list[float]]) -> None:
    while time.monotonic() < until:
        started = time.monotonic()
        try:
            labels = await attack.run(ctx)
        except asyncio.CancelledError:
            tally.setdefault(attack.name, Counter())[UNANSWERED] += 1
            raise
        rounds_ms.setdefault(attack.name, []).append(
            round((time.monotonic() - started) * 1e3, 1))
        for name, answer in labels:
            tally.setdefault(name, Counter())[answer] += 1
        await asyncio.sleep(max(0.0, min(attack.interval_s - (time.monotonic() - started),
                                          until - time.monotonic())))


def select_attacks(only: Sequence[str] | None) -> tuple[Attack, ...]:
    """The attacks whose names contain one of ``only`` (case-insensitive), or all of them.
    ValueError naming the attacks when a word matches none."""
    if not only:
        return ATTACKS
    chosen = []
    for word in only:
        found = [a for a in ATTACKS if word.lower() in a.name.lower()]
        if not found:
            raise ValueError(f"no attack matches {word!r}; the attacks: "
                             + "; ".join(a.name for a in ATTACKS))
        chosen += found
    return tuple(a for a in ATTACKS if a in chosen)


async def run_attacks(target: Target, duration_s: float, seed: int,
                      only: Sequence[str] | None = None) -> dict[str, Any]:
    """Every attack (or those ``only`` selects) on its loop for ``duration_s``: ``answers``
    per attack, and ``round_ms``, how long each of its finished rounds took (one request's
    latency, or a burst's slowest). An attack still waiting when the time is up is
    cancelled and counted once as UNANSWERED."""
    ctx = _Ctx(target, seed)
    tally: dict[str, Counter[str]] = {}
    rounds_ms: dict[str, list[float]] = {}
    until = time.monotonic() + duration_s
    chosen = select_attacks(only)
    loops = {a.run for a in chosen}  # MATES' answers come from WRONG_WIDTH's round
    by_run = {a.run: a for a in reversed(chosen)}
    tasks = [asyncio.create_task(_loop(ctx, by_run[run], until, tally, rounds_ms))
             for run in loops]
    try:
        await asyncio.wait(tasks, timeout=duration_s)
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
        await ctx.close()
    return {"answers": {name: dict(counts) for name, counts in tally.items()},
            "round_ms": rounds_ms}
