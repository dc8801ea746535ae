"""HTTP connection limits below the application: read timeouts, head size, connection count.

Why hand-written: uvicorn (0.54) has no read timeouts at all. A client that trickles its head
(Slowloris), or sends less body than its Content-Length, holds a connection forever; httptools
buffers a header of any size; and framing errors and the concurrency limit are answered in
plain text and logged at warning once per connection, so a flood of them floods the logs.
uvicorn offers no hook for any of this except its documented extension point, a protocol class
passed as ``uvicorn.Config(http=...)``. So ``GuardedHttpTools`` subclasses its
``HttpToolsProtocol`` and overrides the parser callbacks where a request changes phase. That
class is private to uvicorn: ``tests/unit/runtime/frontend/test_uvicorn_internals.py`` names
what this module uses of it, and ``pyproject.toml`` pins uvicorn to the minor release it was
checked against.

The decisions (which phase a connection is in, when it must end, what to answer) are the pure
``ReadClock``; the protocol only feeds it events and does the I/O. Timers are armed lazily, after
a chunk has been parsed, so a request whose head and body arrive in one read arms none.

The edge's guards against one client taking what is everyone's (``core/edge_guards.py``)
act here too, once per connection or request, before any application code runs:

* ``max_connections_per_address``: a connection from an address that already holds that
  many is answered 429 as soon as it opens and closed after the linger, before it sends a
  byte, so holding idle sockets (each kept up to ``header_timeout_s``) cannot take the
  listener. The listener's ``max_connections`` counts only the connections admitted.
* ``max_connections`` is checked when a request's head is in (the kernel and asyncio have
  accepted the connection by then either way). A health probe (``edge_guards.is_probe``) is
  answered past it: answering one costs no more than refusing it, and an orchestrator that
  sees no answer restarts a server that is only busy.
* The Host allowlist, on every request of every route, hot ones included: 421.

h11 (uvicorn's fallback when httptools is missing) gets uvicorn's own settings only: the
keep-alive timeout, a connection limit and a head size limit, answered in plain text, and no
read timeouts and no per-address cap; ``host_guard`` checks Host there as an ASGI wrapper.
``uvicorn[standard]``, a dependency, installs httptools.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from parityserve.config import Limits
from parityserve.core.edge_guards import AddressTally, HostAllowlist, is_probe
from parityserve.runtime.frontend.hot_cycle import HotCycle, HotRoutes

__all__ = ["Phase", "ReadClock", "Refusal", "host_guard", "render_refusal", "uvicorn_settings"]

logger = logging.getLogger(__name__)

# After a refusal, keep reading (and discarding) this long before closing, at most: closing a
# socket with unread input makes the kernel send a reset, which can destroy the answer before
# the client reads it (nginx's "lingering close").
_LINGER_S = 1.0
# Bytes per header line beyond its name and value (": " and CRLF), and the request line's own.
_HEADER_OVERHEAD = 4
_REQUEST_LINE_OVERHEAD = 16


class Phase(enum.Enum):
    HEAD = "head"  # reading a request line and headers (or waiting for a new connection's first)
    BODY = "body"  # reading the body of a request whose head arrived
    REST = "rest"  # the request is in: the app, then uvicorn's keep-alive timeout, own the time


@dataclass(frozen=True)
class Refusal:
    """What to answer, and what to count, when a connection breaks a limit."""

    status: int
    code: str
    message: str
    reason: str  # the metric label, one of metrics.REFUSAL_REASONS
    answer: bool = True  # False: close without a word (nobody asked anything yet)
    retry_after_s: int | None = None  # a Retry-After header: the limit frees up by itself


def _malformed(detail: str) -> Refusal:
    return Refusal(400, "malformed_request", f"malformed HTTP request: {detail}", "malformed")


def _over_capacity(limit: int) -> Refusal:  # answered like uvicorn's own, but in JSON
    return Refusal(503, "too_many_connections",
                   f"the server has more than max_connections={limit} open connections; "
                   "retry later", "too_many_connections", retry_after_s=1)


def _address_full(limit: int) -> Refusal:  # the client's own doing: 429, as for a rate limit
    return Refusal(429, "too_many_connections_per_address",
                   f"this client address already has max_connections_per_address={limit} "
                   "open connections; reuse them, or retry once some are closed",
                   "too_many_connections_per_address", retry_after_s=1)


def _host_refused(host: bytes) -> Refusal:
    shown = host[:100].decode("latin-1")
    return Refusal(421, "host_not_allowed",
                   f"Host {shown!r} is not a name this server answers to (a guard against "
                   "DNS rebinding by web pages); its operator can add it to "
                   "server.allowed_hosts", "host_not_allowed")


class ReadClock:
    """One connection's read phase, its deadline (event-loop time) and its head byte count.

    Pure: the caller passes the time and acts on what it returns. A new connection starts in
    HEAD, so one that connects and sends nothing is closed after ``header_timeout_s``. The
    head deadline runs from a request's first byte (or the connection's start); the body
    deadline from the end of the head. Once the whole request is in there is no deadline here.
    A phase's deadline is fixed by ``settle(now)`` after the read in which the phase began,
    so a request that arrives whole in one read never asks the time or arms a timer.
    """

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self.phase = Phase.HEAD
        self.deadline: float | None = None  # None: no deadline (REST) or not settled yet
        self.started = False  # a request's first byte arrived in this HEAD phase
        self.head_bytes = 0  # bytes of the current incomplete head seen so far (a lower bound)
        self._counting = True  # the current chunk is head from its first byte

    def message_begin(self) -> None:
        if self.phase is not Phase.HEAD:  # a keep-alive request: its own head deadline
            self.phase, self.deadline = Phase.HEAD, None
            self.head_bytes, self._counting = 0, False  # it began mid-chunk: don't count that
        self.started = True

    def headers_complete(self, chunk_bytes: int = 0,
                         measure: Callable[[], int] = int) -> Refusal | None:
        """The head completed in a read of ``chunk_bytes``; ``measure()`` gives its size,
        asked only when the head can be over the limit (head bytes so far plus that read)."""
        limit = self._limits.max_header_bytes
        if self.head_bytes + chunk_bytes > limit and measure() > limit:
            return self._too_large()
        self.phase, self.deadline = Phase.BODY, None
        return None

    def message_complete(self) -> None:
        self.phase, self.deadline, self.started = Phase.REST, None, False

    def fed(self, chunk_bytes: int) -> Refusal | None:
        """After a chunk was parsed: an incomplete head must stay within ``max_header_bytes``."""
        if self.phase is Phase.HEAD and self._counting:
            self.head_bytes += chunk_bytes
            if self.head_bytes > self._limits.max_header_bytes:
                return self._too_large()
        self._counting = self.phase is Phase.HEAD
        return None

    def settle(self, now: float) -> float | None:
        """The current phase's deadline, fixed now if the phase began since the last call."""
        if self.phase is Phase.REST:
            return None
        if self.deadline is None:
            self.deadline = now + (self._limits.header_timeout_s if self.phase is Phase.HEAD
                                   else self._limits.body_timeout_s)
        return self.deadline

    def postpone(self, now: float) -> float | None:
        """A new deadline for the current phase, counted from ``now``."""
        self.deadline = None
        return self.settle(now)

    def expired(self) -> Refusal:
        """What the deadline's passing means in the current phase."""
        if self.phase is Phase.BODY:
            return Refusal(408, "request_timeout", "the request body did not arrive within "
                           f"body_timeout_s={self._limits.body_timeout_s:g}s", "body_timeout")
        if self.started:
            return Refusal(408, "request_timeout", "the request head did not arrive within "
                           f"header_timeout_s={self._limits.header_timeout_s:g}s",
                           "header_timeout")
        return Refusal(408, "request_timeout", "no request", "idle_timeout", answer=False)

    def _too_large(self) -> Refusal:
        return Refusal(431, "header_too_large", "the request line and headers exceed "
                       f"max_header_bytes={self._limits.max_header_bytes}", "header_too_large")


def render_refusal(refusal: Refusal, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """A complete HTTP/1.1 response with the project's JSON error body, closing the connection."""
    body = orjson.dumps({"error": refusal.message, "code": refusal.code})
    lines = [f"HTTP/1.1 {refusal.status} {_PHRASES[refusal.status]}".encode()]
    lines += [name + b": " + value for name, value in default_headers]
    if refusal.retry_after_s is not None:
        lines.append(b"retry-after: %d" % refusal.retry_after_s)
    lines += [b"content-type: application/json", b"content-length: %d" % len(body),
              b"connection: close", b"", body]
    return b"\r\n".join(lines)


_PHRASES = {400: "Bad Request", 408: "Request Timeout", 421: "Misdirected Request",
            429: "Too Many Requests", 431: "Request Header Fields Too Large",
            503: "Service Unavailable"}


def _refusal_app(refusal: Refusal) -> Callable[..., Any]:
    """An ASGI app that answers ``refusal`` (uvicorn's own over-limit path runs an app too)."""
    body = orjson.dumps({"error": refusal.message, "code": refusal.code})
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
               (b"connection", b"close")]
    if refusal.retry_after_s is not None:
        headers.append((b"retry-after", b"%d" % refusal.retry_after_s))

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": refusal.status,
                    "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def _httptools_protocol() -> Callable[..., asyncio.Protocol] | None:
    try:
        import httptools
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return None

    _base = HttpToolsProtocol

    class GuardedHttpTools(HttpToolsProtocol):
        """uvicorn's httptools protocol with ``ReadClock``'s limits and JSON refusals."""

        def __init__(self, *args: Any, limits: Limits, on_refuse: Callable[[str], None],
                     tally: AddressTally, hosts: HostAllowlist | None = None,
                     hot: HotRoutes | None = None, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._limits, self._on_refuse, self._hot = limits, on_refuse, hot
            self._max_connections = limits.max_connections
            self._tally, self._hosts = tally, hosts  # shared by the listener's connections
            self._address: str | None = None
            self._admitted = False  # counted in the tally (released when the connection ends)
            self._host_ok: bytes | None = None  # the Host value last found allowed
            self._clock = ReadClock(limits)
            self._timer: asyncio.TimerHandle | None = None
            self._timer_at: float | None = None
            self._chunk_bytes = 0
            self._pending: Refusal | None = None  # raised from a parser callback
            self._refused = False
            self._running: Any = None  # the cycle answering now (the newest is self.cycle)

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._address = self.client[0] if self.client else None
            if not self._tally.admit(self._address):
                self._refuse(_address_full(self._tally.max_per_address))
                return
            self._admitted = True
            self._sync_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_timer()
            if self._admitted:
                self._admitted = False
                self._tally.release(self._address)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            # uvicorn's, less its warning per malformed request, plus the head-size check.
            if self._refused:
                return  # lingering: discard until the client or the linger timer closes
            self._unset_keepalive_if_required()
            self._chunk_bytes = len(data)
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                self._cancel_timer()  # the connection is another protocol's now
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                else:
                    self._unsupported_upgrade_warning()
                return
            except httptools.HttpParserError as exc:  # from a callback: its cause says more
                self._refuse(self._pending or _malformed(str(exc.__context__ or exc)))
                return
            refusal = self._clock.fed(len(data))
            if refusal is not None:
                self._refuse(refusal)
            elif self._clock.phase is not Phase.REST or self._timer is not None:
                self._sync_timer()

        def send_400_response(self, msg: str) -> None:
            self._refuse(_malformed(msg))

        # The parser callbacks run per request: they call the base class directly, which is
        # cheaper than super(), and the hot path stays within about a microsecond.
        def on_message_begin(self) -> None:
            _base.on_message_begin(self)
            self._clock.message_begin()

        def on_headers_complete(self) -> None:
            self._pending = self._clock.headers_complete(self._chunk_bytes, self._head_size)
            if self._pending is not None:
                raise _Refused  # stops the parser; data_received answers it
            refusal = self._edge_refusal()
            if refusal is not None:
                self._start_refused(refusal)
            elif self._hot is None or not self._start_hot(self._hot):
                _base.on_headers_complete(self)

        def _edge_refusal(self) -> Refusal | None:
            """A Host outside the allowlist, or a request past the listener's cap that is
            not a health probe; None for every other request."""
            if self._hosts is not None:
                for name, value in self.headers:  # every Host: a second one could differ
                    if name == b"host" and value != self._host_ok:
                        if not self._hosts.allows(value.decode("latin-1")):
                            return _host_refused(value)
                        self._host_ok = value  # keep-alive requests repeat it: check once
            if self._tally.total > self._max_connections and not self._probe():
                return _over_capacity(self._max_connections)
            return None

        def _probe(self) -> bool:
            path = httptools.parse_url(self.url).path.decode("latin-1")
            return is_probe(self.parser.get_method().decode("latin-1"), path)

        def _start_hot(self, hot: HotRoutes) -> bool:
            """Start a hot route's request on a ``HotCycle`` (see
            ``runtime/frontend/hot_cycle.py``), as uvicorn's ``on_headers_complete`` starts an ASGI
            cycle; False, and nothing done, for any request the ASGI path must take."""
            parser = self.parser
            if parser.get_method() != b"POST" or parser.should_upgrade() \
                    or self.limit_concurrency is not None:
                return False
            url = httptools.parse_url(self.url)
            raw_path = url.path
            if b"%" in raw_path or not raw_path.isascii():  # Starlette's unquoting, not ours
                return False
            # The scope's request fields, as uvicorn's on_headers_complete sets them (it sets
            # the same again if the request is not hot); then HotPaths decides.
            version = parser.get_http_version()
            scope: dict[str, Any] = self.scope  # type: ignore[assignment]  # plus path_params
            scope.update(method="POST", path=self.root_path + raw_path.decode("ascii"),
                         raw_path=self.root_path.encode("ascii") + raw_path,
                         query_string=url.query or b"")
            if version != "1.1":
                scope["http_version"] = version
            endpoint = hot.route(scope)
            if endpoint is None:
                return False
            existing = self.cycle
            keep_alive = version != "1.0" and parser.should_keep_alive()
            cycle = HotCycle(scope, self.transport, self.flow, self.server_state.default_headers,
                             self.expect_100_continue, keep_alive, self.on_response_complete)
            self.cycle = cycle  # type: ignore[assignment]  # a stand-in: see HotCycle
            if existing is None or existing.response_complete:
                self._start_asgi_task(cycle, endpoint)
            else:  # pipelined behind a request still running, as uvicorn queues them
                self.flow.pause_reading()
                self.pipeline.appendleft((cycle, endpoint))  # type: ignore[arg-type]
            return True

        def _start_refused(self, refusal: Refusal) -> None:
            """Run the request as uvicorn runs its own over-limit answer: an app that sends it."""
            self._on_refuse(refusal.reason)
            app, self.app = self.app, _refusal_app(refusal)
            try:
                super().on_headers_complete()
            finally:
                self.app = app

        def on_message_complete(self) -> None:
            self._clock.message_complete()
            _base.on_message_complete(self)

        def _head_size(self) -> int:
            return (len(self.url) + _REQUEST_LINE_OVERHEAD
                    + sum(len(n) + len(v) + _HEADER_OVERHEAD for n, v in self.headers))

        def _sync_timer(self, postpone: bool = False) -> None:
            now = self.loop.time()
            deadline = self._clock.postpone(now) if postpone else self._clock.settle(now)
            if deadline == self._timer_at:
                return
            self._cancel_timer()
            if deadline is not None:
                self._timer = self.loop.call_at(deadline, self._expire)
                self._timer_at = deadline

        def _cancel_timer(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._timer_at = None

        def _expire(self) -> None:
            self._timer = self._timer_at = None
            if self.flow.read_paused:  # our backpressure, not the client's slowness: wait on
                self._sync_timer(postpone=True)
                return
            self._refuse(self._clock.expired())

        def _refuse(self, refusal: Refusal) -> None:
            self._cancel_timer()
            self._refused = True
            self._on_refuse(refusal.reason)
            logger.debug("closing connection from %s: %s", self.client, refusal.message)
            if self.transport.is_closing():
                return
            if not refusal.answer:
                self.transport.close()
                return
            if self._can_answer():
                self.transport.write(render_refusal(refusal, self.server_state.default_headers))
            for cycle in self._unanswered():
                cycle.disconnected = True  # the app's receive() says so, and its send() is mute
                cycle.message_event.set()
            self._linger()

        def _unanswered(self) -> list[Any]:
            """The cycles yet to answer: the running one, those pipelined behind it, and the
            newest. None may write once the refusal has half-closed the connection."""
            cycles = [self._running, *(cycle for cycle, _ in self.pipeline), self.cycle]
            return [c for c in dict.fromkeys(cycles) if c is not None and not c.response_complete]

        def _start_asgi_task(self, cycle: Any, app: Any) -> None:
            # Every cycle starts here, the first, the pipelined and the hot ones alike.
            self._running = cycle
            _base._start_asgi_task(self, cycle, app)

        def _can_answer(self) -> bool:
            """Whether a response written now would be the answer to the current request."""
            cycle = self.cycle
            if cycle is None or cycle.scope is not self.scope:  # the current one never ran
                return cycle is None or cycle.response_complete
            return not cycle.response_started and not self.pipeline  # running, not queued

        def _linger(self) -> None:
            if not self.transport.can_write_eof():  # TLS: no half-close
                self.transport.close()
                return
            self.transport.write_eof()
            self._timer = self.loop.call_later(_LINGER_S, self.transport.close)

    return GuardedHttpTools


class _Refused(Exception):
    """Raised from a parser callback to stop httptools; the refusal is in ``_pending``."""


def _ignore(reason: str) -> None:
    pass


def uvicorn_settings(limits: Limits, on_refuse: Callable[[str], None] = _ignore,
                     hot: HotRoutes | None = None, hosts: HostAllowlist | None = None
                     ) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.Config`` that enforce ``limits`` on every connection.
    Call it once per listener: the connections per address are counted per call.

    ``on_refuse(reason)`` is called once per connection closed on a limit or a framing error
    (e.g. to count it), with reason one of header_timeout, body_timeout, idle_timeout,
    header_too_large, malformed, too_many_connections, too_many_connections_per_address,
    host_not_allowed.

    ``hosts``: the Host names answered (421 for others); None answers any.

    ``hot``: the application's hot routes (``runtime.frontend.http.HotPaths``), served on a
    ``HotCycle`` instead of a round of ASGI messages. Pass it only when the application
    given to uvicorn is that object itself, not a wrapper that must see every request.
    """
    protocol = _httptools_protocol()
    if protocol is None:
        logger.warning("httptools is not installed: no HTTP read timeouts (uvicorn h11)")
        return {"http": "h11", "timeout_keep_alive": limits.keep_alive_timeout_s,
                # uvicorn refuses a request when connections >= the limit, counting its own
                "limit_concurrency": limits.max_connections + 1,
                "h11_max_incomplete_event_size": limits.max_header_bytes}
    tally = AddressTally(limits.max_connections_per_address)
    return {"http": functools.partial(protocol, limits=limits, on_refuse=on_refuse, hot=hot,
                                      tally=tally, hosts=hosts),
            "timeout_keep_alive": limits.keep_alive_timeout_s}


def host_guard(app: Any, hosts: HostAllowlist, on_refuse: Callable[[str], None] = _ignore
               ) -> Callable[..., Any]:
    """``app`` answering 421 to a Host outside ``hosts``: the check ``uvicorn_settings``'
    protocol makes, for the h11 fallback, which has no protocol of ours."""
    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            for name, value in scope["headers"]:
                if name == b"host" and not hosts.allows(value.decode("latin-1")):
                    on_refuse("host_not_allowed")
                    return await _refusal_app(_host_refused(value))(scope, receive, send)
        return await app(scope, receive, send)
    return guarded
