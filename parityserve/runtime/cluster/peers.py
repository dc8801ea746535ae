"""Frontends on several hosts that share a Redis state store act as one server for admin
changes, through a Redis stream (``parityserve:{namespace}:admin``; ``server.peers``).

Who does what. A *group* is one ``parityserve start``: one process, or N shards
(runtime/cluster/shards.py) that act as one through runtime/cluster/shard_mesh.py. ``Peers.wrap``
sits on the listener that serves ``/admin`` in every shard, outside the shard mesh: a successful
admin change, once it is applied and fanned out to the group's shards as before, is appended to
the stream, signed, with the group's origin id, the process that wrote it and its number
(peer_log.py says what the signature binds, and why a copy appended again is not applied).
Only one process per group follows the stream (the process itself, or shard 0): it applies
the other groups' changes through the group's own admin app with the admin token, so they
pass the same routes, validation and token check as a client's, and, with shards, fan out to
the others and enter the mesh's journal as any change does. The decisions (what to apply,
skip or reapply) are runtime/cluster/peer_log.py's.

Ordering. Redis gives the entries one total order. A group applies its own change at once
(the caller's answer says whether it worked) and the others' in stream order; an own change
that a concurrent one overtook is reapplied, so every group ends in the state of the stream
applied in order (peer_log.py says how). A process applies and appends its changes one at a
time, so that the stream has them in the order it applied them.

Remote application is asynchronous: the caller's answer says only that the change was
published (``x-parityserve-peers: published:ID``), not that the others have applied it; they
do when their follower reads it (it waits on ``XREAD BLOCK``), or when they next start.

Redis down. An admin change is refused before it is applied, 503 ``peers_unavailable``,
rather than made on this group alone: the groups would silently differ until someone noticed.
Inference never waits for the stream. In the narrow window where Redis answers the check and
fails the append, the change has already been applied here: its answer keeps its status and
says ``x-parityserve-peers: unpublished`` (logged as an error), and the caller must repeat it
once Redis is back. The follower retries every second and resumes where it stopped.

Starting. A group replays the stream (up to its last entry when the group started, ``until``)
through its own admin routes before its public listeners open, so its first query already
sees every earlier change. Shards replay it each for itself, up to the same ``until`` (the
parent reads it), and shard 0 follows from there once every shard listens; a restarted shard
replays it, then the mesh's journal, and a restarted shard 0 resumes from the group's cursor.

Trimming. The stream keeps about ``server.peers.max_changes`` entries (``XADD MAXLEN ~``). A
group that starts after older entries were trimmed, or a follower cut off from Redis while
they were, misses them. It tells, as an error in the log, with Redis 7 or later: the cursor
counts the entries read, and Redis counts those ever added (``entries-added``), so the ones
trimmed unread are the difference (peer_log.lost); a Redis that came back empty is noticed
the same way. Changes that must outlive the stream belong in the config.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from parityserve.config import Server, ServingConfig
from parityserve.errors import ConfigError
from parityserve.runtime.cluster import peer_log
from parityserve.runtime.cluster.peer_log import ZERO, Action, BadEntry, Change, Cursor
from parityserve.runtime.frontend.asgi_calls import (
    ASGIApp,
    Receive,
    Scope,
    Send,
    call,
    capture,
    is_admin_change,
    read_all,
    send_plain,
    status_of,
    target_of,
)
from parityserve.runtime.frontend.auth import ResolvedToken, authorized, resolve_token, vetted

__all__ = ["PEERS_HEADER", "PeerPlan", "Peers", "plan_group", "signing_key"]

log = logging.getLogger(__name__)

PEERS_HEADER = "x-parityserve-peers"
_BLOCK_MS = 5_000  # one XREAD waits this long; the socket timeout must be longer
_READ_COUNT = 100
_RETRY_S = 1.0  # the follower's wait after Redis failed it
_CHECK_TIMEOUT_S = 2.0  # an admin change waits this long for Redis before it is refused
_APPEND_TRIES = 20  # appends that may lose the race for the next id to another frontend's
_APPEND_BACKOFF_S = 0.002  # at most this much more wait after each lost race (0.4 s in all)
Entry = tuple[str, dict[bytes, bytes]]
Fields = Callable[[str], dict[bytes, bytes]]  # an entry's id -> its fields, signed for it


@dataclass(frozen=True)
class PeerPlan:
    """What a group's processes agree on before they start; picklable for spawned shards."""

    url: str  # the Redis state store
    namespace: str
    max_changes: int
    origin: str  # this group's id
    until: str  # the stream's last entry when the group started: replayed before ready
    added: int | None  # entries the stream had gained by then (Redis 7; None before)
    length: int  # and held then: all of them were replayed unless some were trimmed
    cursor_file: Path | None = None  # the group's cursor, shared by its shards; None: in memory

    @property
    def stream(self) -> str:
        return peer_log.stream_key(self.namespace)


def plan_group(config: ServingConfig, cursor_file: Path | None = None) -> PeerPlan | None:
    """The plan of a group that starts now (None when admin changes are not shared): a new
    origin and the stream's current end. Blocks; ``ConfigError`` when Redis cannot be read."""
    server = config.server
    if not server.shares_admin_changes() or server.peers is None:
        return None
    import redis  # a dependency of the Redis state store, which this needs anyway
    from redis.retry import Retry

    stream = peer_log.stream_key(server.peers.namespace)
    client = redis.Redis.from_url(server.state_store, socket_connect_timeout=2.0,
                                  socket_timeout=5.0, retry=Retry(_backoff(), retries=2))
    try:
        info = client.xinfo_stream(stream) if client.exists(stream) else _NO_STREAM
    except redis.RedisError as exc:
        raise ConfigError(f"server.peers: cannot read the admin stream {stream}: {exc}") from exc
    finally:
        client.close()
    plan = PeerPlan(server.state_store, server.peers.namespace, server.peers.max_changes,
                    f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}",
                    _text(info.get("last-generated-id", ZERO)), info.get("entries-added"),
                    int(info.get("length", 0)), cursor_file)
    if cursor_file is not None:  # where the shards find it
        cursor = _GroupCursor(plan)
        cursor.save(cursor.value)
    return plan


def signing_key(server: Server, token: ResolvedToken | None, base_dir: Path | None
                ) -> ResolvedToken:
    """The key the admin stream is signed with: the admin token. With the admin API open
    (``require_admin_token: false``, so ``token`` is None) the token is resolved all the
    same, as the routes would (config, $PARITYSERVE_ADMIN_TOKEN, the 0600 token file, made if
    missing), to sign with only: an unsigned stream would let any writer to the Redis run
    admin changes here, and a key kept in that Redis would let them sign. Frontends on one
    host share the token file; on several hosts, give them the same token."""
    if token is not None:
        return token
    key = vetted(resolve_token(server, base_dir))  # create=True: there is one
    assert key is not None
    log.info("the admin API is open, but the changes shared through Redis are signed: %s",
             key.where())
    return key


# What XINFO STREAM would say of the stream before its first entry (it refuses a missing key).
_NO_STREAM: dict[str, Any] = {"last-generated-id": ZERO, "entries-added": 0, "length": 0}


class _GroupCursor:
    """The follower's cursor: in a file its group's shards share (the publishing shard reads
    it; a restarted shard 0 resumes from it), or in memory for a one-process group."""

    def __init__(self, plan: PeerPlan) -> None:
        self.path = plan.cursor_file
        self.value = Cursor(plan.until, seq=plan.added)

    def load(self) -> Cursor:
        if self.path is not None:
            self.value = Cursor.from_json(self.path.read_bytes())
        return self.value

    def save(self, cursor: Cursor) -> None:
        self.value = cursor
        if self.path is not None:  # replace, not rewrite: a reader never sees half a file
            tmp = self.path.with_suffix(".tmp")
            tmp.write_bytes(cursor.to_json())
            tmp.replace(self.path)


class Peers:
    """One process's side of the admin stream (see the module docstring)."""

    def __init__(self, plan: PeerPlan, token: str | None, stream: Any = None, *,
                 key: str | None = None) -> None:
        self.plan = plan
        self.token = token  # the admin routes' (None: open), to apply the others' changes
        signing = key or token  # signs and checks the entries (see signing_key)
        if not signing:
            raise ConfigError("the admin stream needs a signing key: an unsigned entry is "
                              "never applied")
        self.key: str = signing
        # This process's name as a writer, and its count of changes: a restarted process
        # (a new nonce) numbers afresh without looking like a replay of its predecessor's.
        self.writer = f"{plan.origin}/{secrets.token_hex(4)}"
        self.written = 0
        self.stream = stream or RedisStream(plan.url, plan.stream)
        self.cursor = _GroupCursor(plan)
        self._replayed: dict[str, int] = {}  # each writer's last change taken by the replay
        self._task: asyncio.Task[None] | None = None
        self._changing = asyncio.Lock()

    def wrap(self, app: Any) -> Any:  # an ASGI app in, the same app publishing
        """``app`` with every successful admin change published to the stream."""
        async def publishing(scope: Scope, receive: Receive, send: Send) -> None:
            if not is_admin_change(scope) or not self._authorized(scope):
                return await app(scope, receive, send)  # a bad token is the route's 401
            await self._publish(app, scope, await read_all(receive), send)
        return publishing

    def _authorized(self, scope: Scope) -> bool:
        headers = dict(scope.get("headers", ()))
        auth = headers.get(b"authorization")
        return self.token is None or authorized(auth.decode("latin-1") if auth else None,
                                                self.token)

    async def _publish(self, app: ASGIApp, scope: Scope, body: bytes, send: Send) -> None:
        if not await self._reachable():
            return await send_plain(send, 503, _REFUSAL, [(b"content-type", b"application/json"),
                                                          (b"retry-after", b"1")])
        # One change at a time, applied then appended, so that the stream holds this
        # process's changes in the order it applied them (peer_log.decide relies on it).
        async with self._changing:
            after = self.cursor.load().applied  # before applying: see peer_log.decide
            messages = await capture(app, scope, body)
            if 200 <= status_of(messages) < 300:
                self.written += 1
                change = Change(self.plan.origin, scope["method"], target_of(scope), body,
                                after, self.writer, self.written)
                note = await self._append(change)
                messages[0]["headers"] = [*messages[0].get("headers", ()),
                                          (PEERS_HEADER.encode(), note.encode())]
        for message in messages:
            await send(message)

    async def _reachable(self) -> bool:
        try:
            await asyncio.wait_for(self.stream.ping(), _CHECK_TIMEOUT_S)
        except Exception as exc:  # any failure to reach Redis refuses the change
            log.error("admin change refused: Redis (%s) does not answer: %s", self.plan.stream,
                      exc)
            return False
        return True

    async def _append(self, change: Change) -> str:
        def fields(entry_id: str) -> dict[bytes, bytes]:
            return peer_log.encode(change, entry_id, self.plan.namespace, self.key)
        try:
            entry_id = await asyncio.wait_for(
                self.stream.append(fields, self.plan.max_changes), _CHECK_TIMEOUT_S)
        except Exception as exc:
            log.error("admin change %s %s was applied on this frontend but not published to "
                      "the others (%s); repeat it once Redis is back", change.method,
                      change.target, exc)
            return "unpublished"
        return f"published:{entry_id}"

    async def replay(self, app: ASGIApp) -> int:
        """Apply every entry up to ``until`` through ``app`` (this process alone), before the
        public listeners open; how many were applied."""
        self._report_lost(peer_log.lost(0, self.plan.added, self.plan.length))
        applied, read, start, cursor = 0, 0, "-", Cursor()
        while entries := await self.stream.range(start, self.plan.until, _READ_COUNT):
            for entry_id, fields in entries:
                cursor, action = await self._take(app, entry_id, fields, cursor)
                applied += action is Action.APPLY
            read, start = read + len(entries), "(" + entries[-1][0]
        self._replayed = dict(cursor.taken)  # what the follower, if this process, knows
        if read < self.plan.length:  # a shard restarted long after its group started
            self._report_lost(f"{self.plan.length - read} of the changes made before this "
                              "frontend started were trimmed away before it replayed them")
        if applied:
            log.warning("applied %d admin changes from the stream %s before serving", applied,
                        self.plan.stream)
        return applied

    def follow(self, app: ASGIApp, first: Callable[[], Awaitable[None]] | None = None) -> None:
        """Apply the other groups' changes through ``app`` (the group's admin app) as they
        come, in the background, once ``first`` (if any) has returned."""
        self._task = asyncio.create_task(self._follow(app, first), name="parityserve-peers")
        self._task.add_done_callback(_report_end)

    async def _follow(self, app: ASGIApp, first: Callable[[], Awaitable[None]] | None) -> None:
        if first is not None:
            await first()
        cursor, failing = self.cursor.load().knowing(self._replayed), False
        while True:
            try:
                entries = await self.stream.read(cursor.applied, _BLOCK_MS, _READ_COUNT)
                if failing:  # back: did the stream lose what came meanwhile?
                    failing = False
                    self._report_lost(peer_log.lost(cursor.seq, *await self.stream.counts()))
            except Exception as exc:  # Redis down: retry, and say so once per outage
                if not failing:
                    log.error("cannot read the admin stream %s (%s); retrying every %.0f s",
                              self.plan.stream, exc, _RETRY_S)
                failing = True
                await asyncio.sleep(_RETRY_S)
                continue
            for entry_id, fields in entries:
                cursor, _action = await self._take(app, entry_id, fields, cursor)
                self.cursor.save(cursor)

    async def _take(self, app: ASGIApp, entry_id: str, fields: dict[bytes, bytes],
                    cursor: Cursor) -> tuple[Cursor, Action]:
        """Take one entry at ``cursor``: the cursor after it, and what was done. In a replay
        every change is another group's (this group's come after ``until``)."""
        try:
            change = peer_log.decode(entry_id, fields, self.plan.namespace, self.key)
        except BadEntry as exc:
            log.warning("admin stream %s: skipping entry %s: %s", self.plan.stream, entry_id, exc)
            return peer_log.advance(cursor, entry_id, Action.IGNORE), Action.IGNORE
        action = peer_log.decide(change, self.plan.origin, cursor)
        if action is Action.REPLAYED:
            log.warning("admin stream %s: skipping entry %s: %s %s is change %d of %s, which "
                        "had its change %d taken already (an entry appended again?)",
                        self.plan.stream, entry_id, change.method, change.target, change.seq,
                        change.writer, cursor.taken[change.writer])
        elif action is not Action.SKIP:
            await self._apply(app, entry_id, change, action)
        return peer_log.advance(cursor, entry_id, action, change), action

    async def _apply(self, app: ASGIApp, entry_id: str, change: Change, action: Action) -> None:
        """One change through the admin routes. A refusal is logged, so that the operator
        learns the frontends differ, and the stream goes on: retrying one change until it
        is accepted would hold back every later one."""
        try:
            status, body = await call(app, change.method, change.target, change.body,
                                      self.token)
        except Exception:  # the follower must outlive one bad change
            log.exception("admin stream %s: applying entry %s failed", self.plan.stream,
                          entry_id)
            return
        if not 200 <= status < 300:
            # A reapplied change that is refused (a deploy already served) changes nothing,
            # as the stream's order says: not worth a warning.
            log.log(logging.INFO if action is Action.REAPPLY else logging.WARNING,
                    "admin stream %s: %s %s from %s (entry %s, %s) answered %d here: %s",
                    self.plan.stream, change.method, change.target, change.origin, entry_id,
                    action.value, status, body[:300].decode(errors="replace"))

    def _report_lost(self, why: str | None) -> None:
        if why is not None:
            log.error("admin stream %s: %s, so this frontend does not have them (the stream "
                      "keeps about %d changes; put lasting ones in the config)",
                      self.plan.stream, why, self.plan.max_changes)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()  # its end, if it failed, was logged by _report_end
            await asyncio.gather(self._task, return_exceptions=True)
        await self.stream.close()


def _report_end(task: asyncio.Task[None]) -> None:
    """The follower runs until it is cancelled at shutdown; anything else is a failure that
    must be seen, as no change from another frontend arrives after it."""
    if not task.cancelled() and task.exception() is not None:
        log.error("the admin stream follower stopped: changes from the other frontends no "
                  "longer arrive here", exc_info=task.exception())


_REFUSAL = orjson.dumps({
    "error": "the admin change was not applied: the Redis that shares admin changes with the "
             "other frontends does not answer, and a change made on this frontend alone would "
             "leave them different. Retry once Redis is back.",
    "code": "peers_unavailable"})


class RedisStream:
    """The stream's Redis commands (redis.asyncio), nothing more."""

    def __init__(self, url: str, key: str) -> None:
        from redis.asyncio import Redis
        from redis.asyncio.retry import Retry

        self.key = key
        self.client: Any = Redis.from_url(url, socket_connect_timeout=2.0,
                                          socket_timeout=_BLOCK_MS / 1000 + 5.0, protocol=2,
                                          retry=Retry(_backoff(), retries=2))

    async def ping(self) -> None:
        await self.client.ping()

    async def append(self, fields: Fields, max_changes: int) -> str:
        """Append the entry ``fields`` signs for its id, with that id: the next one after the
        stream's last, retried when another frontend's append took it first."""
        from redis.exceptions import ResponseError

        for attempt in range(1, _APPEND_TRIES + 1):
            entry_id = peer_log.next_id(await self._last_id(), time.time_ns() // 1_000_000)
            try:
                await self.client.xadd(self.key, fields(entry_id), id=entry_id,
                                       maxlen=max_changes, approximate=True)
            except ResponseError as exc:
                if "equal or smaller" not in str(exc):
                    raise
                # Another frontend appended since we read the last id. A random wait, so
                # that two writers in step do not pick the same id again and again.
                await asyncio.sleep(random.uniform(0, _APPEND_BACKOFF_S * attempt))
                continue
            return entry_id
        raise RuntimeError(f"{_APPEND_TRIES} appends in a row lost the race for the next id")

    async def _last_id(self) -> str:
        """The id of the stream's last generated entry (even if deleted or trimmed since)."""
        from redis.exceptions import ResponseError

        try:
            info = await self.client.xinfo_stream(self.key)
        except ResponseError:  # no stream yet (any other trouble fails the append)
            return ZERO
        return _text(info["last-generated-id"])

    async def read(self, after: str, block_ms: int, count: int) -> list[Entry]:
        reply = await self.client.xread({self.key: after}, count=count, block=block_ms)
        return [_entry(e) for _key, entries in reply or () for e in entries]

    async def range(self, start: str, until: str, count: int) -> list[Entry]:
        if peer_log.id_key(until) == peer_log.id_key(ZERO):
            return []  # the stream was empty when the group started
        return [_entry(e) for e in await self.client.xrange(self.key, start, until, count=count)]

    async def counts(self) -> tuple[int | None, int]:
        """Entries the stream ever gained (None before Redis 7) and entries it holds."""
        info = await self.client.xinfo_stream(self.key) if await self.client.exists(
            self.key) else _NO_STREAM
        return info.get("entries-added"), int(info["length"])

    async def close(self) -> None:
        await self.client.aclose()


def _backoff() -> Any:
    """Quick retries, as the state store's: redis-py's default waits seconds between them,
    and a caller whose change is refused while Redis is down should hear so at once."""
    from redis.backoff import ExponentialWithJitterBackoff

    return ExponentialWithJitterBackoff(base=0.01, cap=0.2)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _entry(raw: Any) -> Entry:
    entry_id, fields = raw
    return _text(entry_id), dict(fields)
