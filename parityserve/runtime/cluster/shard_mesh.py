"""What makes N frontend shards (``server.frontends``) behave as one server.

Each shard is a whole frontend process with its own workers, on the shared public port
(SO_REUSEPORT) and on a private loopback *control port* of its own. The control port answers
for its shard alone (``ShardMesh.local``): the peers call it, and it serves the admin routes
even when they have a public listener of their own. ``ShardMesh.wrap`` turns every public
listener's ASGI app into one that acts for all shards (no request header can opt out, so a
client cannot leave a change on one shard):

- **admin changes fan out.** A successful POST/PUT/PATCH/DELETE under ``/admin/`` is replayed,
  before its answer leaves, to every peer's control port with the admin token, so that when the
  caller gets its 2xx every shard has made the change (``x-parityserve-fanout`` says which peers
  failed). It is appended to a journal that a restarted shard replays, through its own
  control port, before its public listeners open (runtime/server.py).
  Why this channel and not the state store's pub/sub: it works with every store (memory and
  SQLite have no pub/sub), it reuses the admin routes' own validation and auth unchanged, and
  the caller learns synchronously whether the peers applied the change. Across hosts, where
  no loopback reaches, runtime/cluster/peers.py carries changes through a Redis stream instead.
- **``/metrics`` aggregates** with a per-shard label: each shard's exposition is fetched over
  the control ports and every sample gets ``shard="i"``. Why not prometheus-client's
  multiprocess mode: it needs its directory set before the first import, gauges need a per-metric
  aggregation mode, and a killed shard's files would have to be cleaned; a label keeps every
  metric exact, and ``sum without (shard)`` gives the total.
- **``/admin/state`` gathers** every shard's state over the control ports: the answering
  shard's fields at the top, as one server's (what existing clients read), and each shard's
  whole state under ``shards``, keyed by index; a shard that does not answer (restarting,
  hung) is an entry with an ``error``, not a failed request.
- **readiness** is ready only when every shard is (a restarting shard makes it 503).

Every response carries ``x-parityserve-shard: INDEX:PID``.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from parityserve.runtime.frontend.asgi_calls import (
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    capture,
    is_admin_change,
    read_all,
    send_plain,
    status_of,
    target_of,
)

__all__ = ["SHARD_HEADER", "ShardMesh", "merge_metrics", "merge_states"]

log = logging.getLogger(__name__)

SHARD_HEADER = "x-parityserve-shard"
_FANOUT_TIMEOUT_S = 600.0  # a deploy waits for the peer's workers to load
_PEEK_TIMEOUT_S = 5.0


@dataclass
class ShardMesh:
    """One shard's view of the others; built by the parent (runtime/cluster/shards.py), pickled
    over."""

    index: int
    control_ports: tuple[int, ...]
    token: str | None
    journal: Path
    restarts: Any  # Sequence[int]: the parent's shared counters (a multiprocessing Array)
    scheme: str = "http"
    replay: bool = False  # a restarted shard: replay the journal before reporting ready
    _client: httpx.AsyncClient | None = field(default=None, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}

    @property
    def control_port(self) -> int:
        return self.control_ports[self.index]

    def wrap(self, app: Any) -> Any:  # an ASGI app in, the same app sharded out
        async def sharded(scope: Scope, receive: Receive, send: Send) -> None:
            await self._handle(app, scope, receive, _tagged(send, self.index))
        return sharded

    def local(self, public: Any, admin: Any | None) -> Any:
        """The control port's app: this shard alone (no fan-out, no aggregation), with the
        admin routes from ``admin`` when they live on a listener of their own, because the
        peers fan admin changes out to this port. The admin token is checked as anywhere."""
        async def alone(scope: Scope, receive: Receive, send: Send) -> None:
            route = public
            if admin is not None and scope.get("path", "").startswith("/admin/"):
                route = admin
            await route(scope, receive, _tagged(send, self.index))
        return alone

    async def started(self) -> None:
        """A restarted shard applies, in order, the admin changes the others made. Called
        once the control port serves and before the public listeners do."""
        if not (self.replay and self.journal.exists()):
            return
        for line in self.journal.read_bytes().splitlines():
            entry = orjson.loads(line)
            status = await self._call(self.index, entry["method"], entry["path"],
                                      base64.b64decode(entry["body"]), _FANOUT_TIMEOUT_S)
            if not 200 <= status < 300:
                log.warning("shard %d: replaying %s %s got %s", self.index, entry["method"],
                            entry["path"], status)

    async def siblings_listening(self) -> None:
        """Until every other shard's control port answers. Shard 0 waits for this before it
        applies other hosts' changes (runtime/cluster/peers.py): one fanned out to a shard that is
        still starting would never reach it, as only a restarted shard reads the journal."""
        waiting = [i for i in range(len(self.control_ports)) if i != self.index]
        while waiting:
            statuses = await asyncio.gather(*(self._call(i, "GET", "/v2/health/live", b"",
                                                         _PEEK_TIMEOUT_S) for i in waiting))
            waiting = [i for i, st in zip(waiting, statuses, strict=True) if st != 200]
            if waiting:
                await asyncio.sleep(0.2)

    async def _handle(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)
        method, path = scope["method"], scope["path"]
        if method == "GET" and path == "/metrics":
            return await self._metrics(app, scope, receive, send)
        if method == "GET" and path == "/v2/health/ready":
            return await self._ready(app, scope, receive, send)
        if method == "GET" and path == "/admin/state":
            return await self._state(app, scope, send)
        if is_admin_change(scope):
            return await self._fan_out(app, scope, receive, send)
        return await app(scope, receive, send)

    async def _fan_out(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        body = await read_all(receive)
        messages = await capture(app, scope, body)
        if 200 <= status_of(messages) < 300:
            target = target_of(scope)
            failed = await self._broadcast(scope["method"], target, body)
            self._record(scope["method"], target, body)
            messages[0]["headers"] = [*messages[0].get("headers", ()),
                                      (b"x-parityserve-fanout", _fanout_note(failed).encode())]
        for message in messages:
            await send(message)

    async def _broadcast(self, method: str, target: str, body: bytes) -> list[int]:
        peers = [i for i in range(len(self.control_ports)) if i != self.index]
        statuses = await asyncio.gather(*(self._call(i, method, target, body, _FANOUT_TIMEOUT_S)
                                          for i in peers))
        failed = [i for i, st in zip(peers, statuses, strict=True) if not 200 <= st < 300]
        if failed:
            log.warning("shard %d: %s %s not applied on shards %s", self.index, method, target,
                        failed)
        return failed

    def _record(self, method: str, target: str, body: bytes) -> None:
        line = orjson.dumps({"method": method, "path": target,
                             "body": base64.b64encode(body).decode()}) + b"\n"
        with self.journal.open("ab") as out:  # O_APPEND: one line per write, shards interleave
            out.write(line)

    async def _call(self, peer: int, method: str, target: str, body: bytes,
                    timeout_s: float) -> int:
        """Status of ``method target`` on shard ``peer`` alone; 0 when it does not answer."""
        return (await self._request(peer, method, target, body, timeout_s))[0]

    async def _request(self, peer: int, method: str, target: str, body: bytes,
                       timeout_s: float) -> tuple[int, str]:
        if self._client is None:
            self._client = httpx.AsyncClient(verify=False)  # loopback, same cert as the port
        headers = {"content-type": "application/json"}
        if self.token:
            headers["authorization"] = f"Bearer {self.token}"
        url = f"{self.scheme}://127.0.0.1:{self.control_ports[peer]}{target}"
        try:
            resp = await self._client.request(method, url, content=body, headers=headers,
                                              timeout=timeout_s)
        except httpx.HTTPError:
            return 0, ""
        return resp.status_code, resp.text

    async def _metrics(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        messages = await capture(app, scope, b"")
        if messages[0]["status"] != 200:  # e.g. 401 under protect_metrics
            for message in messages:
                await send(message)
            return
        own = b"".join(m.get("body", b"") for m in messages[1:]).decode()
        peers = [i for i in range(len(self.control_ports)) if i != self.index]
        answers = await asyncio.gather(*(self._request(i, "GET", "/metrics", b"",
                                                       _PEEK_TIMEOUT_S) for i in peers))
        texts = {self.index: own, **{i: text for i, (st, text) in zip(peers, answers, strict=True)
                                     if st == 200}}
        body = merge_metrics(texts, list(self.restarts))
        await send_plain(send, 200, body, messages[0].get("headers", ()))

    async def _state(self, app: ASGIApp, scope: Scope, send: Send) -> None:
        messages = await capture(app, scope, b"")
        if messages[0]["status"] != 200:  # e.g. 401: the caller's token is checked here first
            for message in messages:
                await send(message)
            return
        own = orjson.loads(b"".join(m.get("body", b"") for m in messages[1:]))
        peers = [i for i in range(len(self.control_ports)) if i != self.index]
        answers = await asyncio.gather(*(self._request(i, "GET", "/admin/state", b"",
                                                       _PEEK_TIMEOUT_S) for i in peers))
        body = orjson.dumps(merge_states(self.index, own, dict(zip(peers, answers, strict=True))))
        await send_plain(send, 200, body, messages[0].get("headers", ()))

    async def _ready(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        messages = await capture(app, scope, b"")
        peers = [i for i in range(len(self.control_ports)) if i != self.index]
        statuses = await asyncio.gather(*(self._call(i, "GET", "/v2/health/ready", b"",
                                                     _PEEK_TIMEOUT_S) for i in peers))
        down = [i for i, st in zip(peers, statuses, strict=True) if st != 200]
        if messages[0]["status"] != 200 or not down:
            for message in messages:
                await send(message)
            return
        body = orjson.dumps({"ready": False, "error": f"frontend shards {down} are not ready "
                             "(restarting or loading)", "code": "shards_not_ready"})
        await send_plain(send, 503, body, [(b"content-type", b"application/json")])


def merge_metrics(texts: dict[int, str], restarts: Sequence[int]) -> bytes:
    """One exposition from each shard's: every sample labelled ``shard``, plus the parent's
    restart counts and which shards answered."""
    families: dict[str, Metric] = {}
    for shard, text in sorted(texts.items()):
        for fam in text_string_to_metric_families(text):
            into = families.setdefault(fam.name, Metric(fam.name, fam.documentation, fam.type,
                                                        fam.unit))
            into.samples += [s._replace(labels={**s.labels, "shard": str(shard)})
                             for s in fam.samples]
    restarted = CounterMetricFamily("parityserve_frontend_restarts", "Times the parent "
                                    "restarted a frontend shard that died", labels=["shard"])
    up = GaugeMetricFamily("parityserve_frontend_shard_up", "1 if the shard answered this "
                           "scrape", labels=["shard"])
    for shard, count in enumerate(restarts):
        restarted.add_metric([str(shard)], count)
        up.add_metric([str(shard)], 1 if shard in texts else 0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed([*families.values(), restarted, up]))
    return generate_latest(registry)


def merge_states(index: int, own: dict[str, Any], peers: dict[int, tuple[int, str]]
                 ) -> dict[str, Any]:
    """One ``/admin/state`` for all shards: shard ``index``'s own state at the top (so a
    client written for one server reads it unchanged) and every shard's under ``shards``,
    from each peer's (status, body); 0 is a peer that did not answer."""
    shards = {index: own, **{peer: _peer_state(*answer) for peer, answer in peers.items()}}
    return {**own, "shards": {str(i): shards[i] for i in sorted(shards)}}


def _peer_state(status: int, text: str) -> dict[str, Any]:
    """A peer's state, or an entry saying why there is none (a shard down or restarting
    must not fail the whole document)."""
    if status == 0:
        return {"error": "did not answer on its control port (restarting or down)",
                "status": status}
    if status != 200:
        return {"error": f"answered {status} on its control port", "status": status}
    try:
        state = orjson.loads(text)
    except orjson.JSONDecodeError:
        state = None
    if not isinstance(state, dict):
        return {"error": "answered with a state that is not a JSON object", "status": status}
    return state


class _Fixed:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def _fanout_note(failed: list[int]) -> str:
    return "all" if not failed else "failed:" + ",".join(map(str, failed))


def _tagged(send: Send, index: int) -> Send:
    tag = (SHARD_HEADER.encode(), f"{index}:{os.getpid()}".encode())

    async def tagging(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", ()), tag]
        await send(message)
    return tagging
