"""The hot routes' request cycle: uvicorn's connection handling, without the ASGI round of
messages for each request.

Why hand-written: under wrk with the server on one core, a bare Starlette app does about a
third of the requests per second that the same decode and encode do on a plain httptools
protocol (``benchmarks/results/frontend-profile/asgi-layer.md``). Most of the difference is the
per-request ASGI machinery: message dicts, the header checks of uvicorn's ``send``, and two
socket writes per answer (head, then body). For ``POST /{app}/predict`` and the V2 infer
routes that is a large share of parityserve's own frontend CPU.

``HotCycle`` stands in for uvicorn's ``RequestResponseCycle`` on those routes only. It has the
attributes and methods the protocol uses (``body``, ``more_body``, ``message_event``,
``disconnected``, ``keep_alive``, ``response_started``, ``response_complete``, ``run_asgi``), so
uvicorn's parser callbacks, flow control, pipelining, keep-alive, graceful shutdown and our
``GuardedHttpTools`` limits all work on it unchanged. What it does differently: it calls the
guarded endpoint with a Starlette ``Request`` directly, and writes the endpoint's ``Response``
as one buffer list (one ``writev``) instead of two ASGI ``send`` messages.

Everything else (other paths, other methods, percent-encoded paths, a ``root_path``, upgrades,
sharded or peer-publishing listeners) takes uvicorn's ASGI path, as before.

What the hot routes do not get: the middlewares uvicorn wraps around every ASGI app, namely
``ProxyHeadersMiddleware`` (``scope["client"]`` and ``scope["scheme"]`` rewritten from a
trusted proxy's ``X-Forwarded-*``) and the trace-level message logger. No hot handler reads
the client address or the scheme; one that comes to need them must take the ASGI path or do
the rewrite itself.
"""

from __future__ import annotations

import asyncio
import functools
import http
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response

__all__ = ["HotCycle", "HotRoutes"]

logger = logging.getLogger(__name__)

Endpoint = Callable[[Request], Awaitable[Response]]

_500_BODY = b"Internal Server Error"
_500_HEADERS = (b"content-type: text/plain; charset=utf-8\r\ncontent-length: 21\r\n"
                b"connection: close\r\n")


class HotRoutes(Protocol):
    """What the protocol asks of the application (``runtime.frontend.http.HotPaths``): the endpoint
    for a request's scope, having set the path parameters and app on it; or None."""

    def route(self, scope: dict[str, Any]) -> Endpoint | None: ...


def _nothing() -> None:
    pass


@functools.cache
def _status_line(status: int) -> bytes:
    """As uvicorn writes it (its table lives in the httptools module, an optional import)."""
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {status} {phrase}\r\n".encode("latin-1")


class HotCycle:
    """One request on a hot route, from its head to the last byte of its answer."""

    __slots__ = ("scope", "transport", "flow", "default_headers", "message_event",
                 "on_response", "disconnected", "keep_alive", "waiting_for_100_continue",
                 "body", "more_body", "response_started", "response_complete")

    def __init__(self, scope: dict[str, Any], transport: asyncio.Transport, flow: Any,
                 default_headers: list[tuple[bytes, bytes]], expect_100_continue: bool,
                 keep_alive: bool, on_response: Callable[[], None]) -> None:
        self.scope = scope
        self.transport = transport
        self.flow = flow  # uvicorn's FlowControl: reading paused while the app holds a body
        self.default_headers = default_headers  # server and date, as uvicorn keeps them
        self.message_event = asyncio.Event()
        self.on_response = on_response
        self.disconnected = False
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = expect_100_continue
        self.body = bytearray()
        self.more_body = True
        self.response_started = False
        self.response_complete = False

    async def run_asgi(self, endpoint: Endpoint) -> None:
        """The name is uvicorn's: its protocol starts and pipelines cycles through it."""
        try:
            response = await endpoint(Request(self.scope, self.receive))
            await self._respond(response)
        except BaseException as exc:  # as uvicorn's cycle: a task's failure ends here, logged
            # The guarded endpoint answers every Exception itself; this is cancellation at
            # shutdown, or a bug in the answer's own writing.
            logger.error("exception on a hot route", exc_info=exc)
            if self.disconnected:  # gone, or refused and lingering: nothing more is written
                pass
            elif not self.response_started:
                self._write_500()
            else:
                self.transport.close()
        finally:
            self.on_response = _nothing

    async def receive(self) -> dict[str, Any]:
        """The ASGI receive channel, as uvicorn's cycle serves it (``runtime.frontend.http`` reads
        bodies from it)."""
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.waiting_for_100_continue = False
        if not self.disconnected and not self.response_complete:
            self.flow.resume_reading()
            await self.message_event.wait()
            self.message_event.clear()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        message = {"type": "http.request", "body": bytes(self.body),
                   "more_body": self.more_body}
        self.body = bytearray()
        return message

    async def _respond(self, response: Response) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()  # the client reads slowly: wait, as uvicorn's send does
        if self.disconnected:
            return
        self.response_started = True
        self.waiting_for_100_continue = False
        self.transport.writelines([self._head(response), response.body])
        self.response_complete = True
        self.message_event.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()

    def _head(self, response: Response) -> bytes:
        """Status line and headers. Starlette's ``Response`` always sets content-length for
        the hot routes' answers, so there is no chunked case. The header values are all
        parityserve's own (content type, lengths, Retry-After, WWW-Authenticate), never a
        client's, so uvicorn's per-header CR/LF check has nothing to catch here."""
        parts = self._status_and_defaults(response.status_code)
        closing = False
        for name, value in response.raw_headers:
            if name == b"connection" and b"close" in (
                    token.strip() for token in value.lower().split(b",")):
                self.keep_alive, closing = False, True
            parts += (name, b": ", value, b"\r\n")
        if not self.keep_alive and not closing:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        return b"".join(parts)

    def _status_and_defaults(self, status: int) -> list[bytes]:
        parts = [_status_line(status)]
        for name, value in self.default_headers:
            parts += (name, b": ", value, b"\r\n")
        return parts

    def _write_500(self) -> None:
        """As uvicorn's cycle answers an app that failed before answering: 500, closed."""
        self.response_started = self.response_complete = True
        self.keep_alive = False
        self.message_event.set()
        if not self.transport.is_closing():
            head = [*self._status_and_defaults(500), _500_HEADERS, b"\r\n"]
            self.transport.writelines([b"".join(head), _500_BODY])
            self.transport.close()
        self.on_response()
