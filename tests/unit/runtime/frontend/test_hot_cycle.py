"""The hot routes' request cycle (``runtime/frontend/hot_cycle.py``) inside uvicorn's protocol.

The protocol is fed bytes through a transport that records what is written, so these tests
see exactly what a client would read: which requests take the hot cycle, that an answer is one
write, and that pipelining, keep-alive, ``Connection: close``, HTTP/1.0, ``Expect:
100-continue``, a client gone mid-request and a failing endpoint behave as uvicorn's own cycle
does. Through a real server, every serving test takes the hot routes, and
``tests/integration/test_connection_limits.py`` tries them with raw sockets (timeouts, chunked
and 16 MiB bodies, pipelining).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from uvicorn.server import ServerState

from parityserve.config import Limits
from parityserve.runtime.frontend import connection
from parityserve.runtime.frontend.hot_cycle import HotCycle
from parityserve.runtime.frontend.http import HotPaths

pytestmark = pytest.mark.skipif(connection._httptools_protocol() is None,
                                reason="the hot cycle rides on the httptools protocol")


def on_a_loop(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """The test run to its end on a fresh event loop (the project's tests use no plugin)."""
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))
    return run


class Transport(asyncio.Transport):
    """Records writes (``writelines`` as one entry: one ``writev``) and closing."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False
        self.eof = False
        self.reading = True

    def write(self, data: Any) -> None:
        self._check_open()
        self.writes.append(bytes(data))

    def writelines(self, chunks: Any) -> None:
        self._check_open()
        self.writes.append(b"".join(bytes(c) for c in chunks))

    def _check_open(self) -> None:
        if self.eof:  # as asyncio's and uvloop's transports refuse it
            raise RuntimeError("Cannot call write() after write_eof()")

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}.get(
            name, default)

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def get_write_buffer_size(self) -> int:
        return 0


def hot_paths(endpoint: Any) -> HotPaths:
    """parityserve's own ``HotPaths`` (the rule of what is hot), with ``endpoint`` behind both
    hot routes and an empty Starlette app behind it."""
    return HotPaths(SimpleNamespace(hot={"predict": endpoint, "infer": endpoint}),  # type: ignore[arg-type]
                    Starlette())


async def echo(request: Request) -> Response:
    """Answers the app's name and the body it read (as the real handlers read it)."""
    chunks = []
    while True:
        message = await request.receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    doc = {"app": request.path_params["app"], "body": b"".join(chunks).decode(),
           "app_set": request.scope["app"] is not None}
    return Response(orjson.dumps(doc), media_type="application/json")


async def asgi_app(scope: Any, receive: Any, send: Any) -> None:
    """Everything that is not hot: answers which path took the ASGI route."""
    body = orjson.dumps({"asgi": scope["path"]})
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


def protocol(routes: HotPaths, **limits: Any) -> tuple[Any, Transport]:
    settings = connection.uvicorn_settings(Limits(**limits), hot=routes)
    config = uvicorn.Config(asgi_app, lifespan="off", log_level="error",
                            timeout_keep_alive=settings["timeout_keep_alive"])
    config.load()
    state = ServerState()
    state.default_headers = [(b"server", b"uvicorn"), (b"date", b"today")]  # uvicorn.Server's
    proto = settings["http"](config=config, server_state=state,
                             app_state={}, _loop=asyncio.get_running_loop())
    transport = Transport()
    proto.connection_made(transport)
    return proto, transport


def post(path: str, body: bytes, *extra: bytes, version: bytes = b"1.1") -> bytes:
    head = [b"POST " + path.encode() + b" HTTP/" + version, b"Host: t",
            b"Content-Type: application/json", b"Content-Length: %d" % len(body), *extra]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def answers(transport: Transport) -> list[tuple[int, dict[str, str], bytes]]:
    """The complete responses written so far, in order (a 100 Continue is skipped)."""
    out, data = [], b"".join(transport.writes)
    while b"\r\n\r\n" in data:
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        if status == 100:
            continue
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        length = int(headers["content-length"])
        if len(data) < length:
            break
        out.append((status, headers, data[:length]))
        data = data[length:]
    return out


async def settle(transport: Transport, responses: int) -> None:
    for _ in range(200):
        if len(answers(transport)) >= responses:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"expected {responses} responses, got {transport.writes}")


@on_a_loop
async def test_a_hot_request_is_answered_in_one_write_and_the_connection_kept() -> None:
    proto, transport = protocol(hot_paths(echo))
    proto.data_received(post("/shop/predict", b'{"input": 1}'))
    assert isinstance(proto.cycle, HotCycle)
    await settle(transport, 1)
    assert len(transport.writes) == 1  # head and body in one writev
    [(status, headers, body)] = answers(transport)
    assert status == 200
    assert orjson.loads(body) == {"app": "shop", "body": '{"input": 1}', "app_set": True}
    assert headers["content-length"] == str(len(body))
    assert headers["content-type"] == "application/json"
    assert headers["server"] == "uvicorn" and headers["date"] == "today"  # the defaults
    assert "connection" not in headers and not transport.closed
    assert proto.cycle.response_complete


@on_a_loop
async def test_other_paths_methods_and_encoded_paths_take_the_asgi_route() -> None:
    proto, transport = protocol(hot_paths(echo))
    requests = [b"GET /shop/predict HTTP/1.1\r\nHost: t\r\n\r\n",
                post("/v2/health/live", b"{}"),
                post("/sh%6Fp/predict", b"{}")]  # percent-encoded: Starlette unquotes it
    for i, request in enumerate(requests):
        proto.data_received(request)
        assert not isinstance(proto.cycle, HotCycle)
        await settle(transport, i + 1)
    paths = [orjson.loads(body)["asgi"] for _, _, body in answers(transport)]
    assert paths == ["/shop/predict", "/v2/health/live", "/shop/predict"]


@on_a_loop
async def test_without_hot_routes_every_request_takes_the_asgi_route() -> None:
    settings = connection.uvicorn_settings(Limits())
    config = uvicorn.Config(asgi_app, lifespan="off", log_level="error")
    config.load()
    proto = settings["http"](config=config, server_state=ServerState(), app_state={},
                             _loop=asyncio.get_running_loop())
    transport = Transport()
    proto.connection_made(transport)
    proto.data_received(post("/shop/predict", b"{}"))
    await settle(transport, 1)
    assert not isinstance(proto.cycle, HotCycle)
    assert orjson.loads(answers(transport)[0][2]) == {"asgi": "/shop/predict"}


@on_a_loop
async def test_pipelined_requests_are_answered_in_order_hot_or_not() -> None:
    release = asyncio.Event()

    async def slow_first(request: Request) -> Response:
        if request.path_params["app"] == "first":
            await release.wait()
        return await echo(request)

    proto, transport = protocol(hot_paths(slow_first))
    proto.data_received(post("/first/predict", b"1") + b"GET /live HTTP/1.1\r\nHost: t\r\n\r\n"
                        + post("/third/predict", b"3"))
    await asyncio.sleep(0.05)
    assert transport.writes == [] and not transport.reading  # queued behind the first
    release.set()
    await settle(transport, 3)
    docs = [orjson.loads(body) for _, _, body in answers(transport)]
    assert docs == [{"app": "first", "body": "1", "app_set": True}, {"asgi": "/live"},
                    {"app": "third", "body": "3", "app_set": True}]


@pytest.mark.parametrize("request_bytes", [
    post("/shop/predict", b"{}", b"Connection: close"),
    post("/shop/predict", b"{}", version=b"1.0"),
], ids=["connection-close", "http-1.0"])
@on_a_loop
async def test_a_request_that_ends_the_connection_is_answered_then_closed(
        request_bytes: bytes) -> None:
    proto, transport = protocol(hot_paths(echo))
    proto.data_received(request_bytes)
    await settle(transport, 1)
    [(status, headers, _)] = answers(transport)
    assert status == 200 and headers["connection"] == "close"
    assert transport.closed


@on_a_loop
async def test_expect_100_continue_is_answered_before_the_body_is_read() -> None:
    proto, transport = protocol(hot_paths(echo))
    head, _, body = post("/shop/predict", b'{"x": 1}', b"Expect: 100-continue").partition(
        b"\r\n\r\n")
    proto.data_received(head + b"\r\n\r\n")
    await asyncio.sleep(0.02)
    assert transport.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    proto.data_received(body)
    await settle(transport, 1)
    status, _, answer = answers(transport)[0]
    assert status == 200 and orjson.loads(answer)["body"] == '{"x": 1}'


@on_a_loop
async def test_a_body_in_pieces_is_read_whole() -> None:
    proto, transport = protocol(hot_paths(echo))
    data = post("/shop/predict", b'{"input": [1, 2, 3, 4]}')
    for i in range(0, len(data), 7):
        proto.data_received(data[i:i + 7])
        await asyncio.sleep(0)
    await settle(transport, 1)
    assert orjson.loads(answers(transport)[0][2])["body"] == '{"input": [1, 2, 3, 4]}'


@on_a_loop
async def test_a_client_gone_before_the_answer_gets_nothing_written() -> None:
    release = asyncio.Event()

    async def waits(request: Request) -> Response:
        await release.wait()
        return Response(b"{}", media_type="application/json")

    proto, transport = protocol(hot_paths(waits))
    proto.data_received(post("/shop/predict", b"{}"))
    await asyncio.sleep(0.01)
    proto.connection_lost(None)
    release.set()
    await asyncio.sleep(0.05)
    assert transport.writes == []


@on_a_loop
async def test_a_client_gone_while_its_body_is_read_ends_the_read_as_a_disconnect() -> None:
    seen: list[dict[str, Any]] = []

    async def reads(request: Request) -> Response:
        while not seen or seen[-1].get("more_body"):
            seen.append(await request.receive())
        return Response(b"{}", media_type="application/json")

    proto, transport = protocol(hot_paths(reads))
    proto.data_received(post("/shop/predict", b'{"input": [1, 2]}')[:-5])  # body incomplete
    await asyncio.sleep(0.01)
    proto.connection_lost(None)
    await asyncio.sleep(0.01)
    assert seen[-1] == {"type": "http.disconnect"}
    assert transport.writes == []


@on_a_loop
async def test_an_endpoint_that_raises_gets_a_500_and_the_connection_closed(caplog) -> None:
    async def broken(request: Request) -> Response:
        raise asyncio.CancelledError  # the guarded endpoints answer every Exception themselves

    proto, transport = protocol(hot_paths(broken))
    proto.data_received(post("/shop/predict", b"{}"))
    await settle(transport, 1)
    [(status, headers, body)] = answers(transport)
    assert status == 500 and body == b"Internal Server Error"
    assert headers["connection"] == "close" and transport.closed
    assert headers["server"] == "uvicorn"  # the default headers, as uvicorn's own 500
    assert "exception on a hot route" in caplog.text


@on_a_loop
async def test_a_refused_connection_gets_no_500_when_its_request_is_then_cancelled() -> None:
    release = asyncio.Event()

    async def cancelled_later(request: Request) -> Response:
        await release.wait()
        raise asyncio.CancelledError  # e.g. the server shutting down

    proto, transport = protocol(hot_paths(cancelled_later))
    proto.data_received(post("/shop/predict", b"{}"))
    await asyncio.sleep(0.01)
    proto.cycle.disconnected = True  # as GuardedHttpTools._refuse marks it while lingering
    release.set()
    await asyncio.sleep(0.02)
    assert transport.writes == []


@on_a_loop
async def test_an_answer_that_closes_the_connection_says_so_once() -> None:
    async def closing(request: Request) -> Response:
        return Response(b"{}", headers={"connection": "close"}, media_type="application/json")

    proto, transport = protocol(hot_paths(closing))
    proto.data_received(post("/shop/predict", b"{}"))
    await settle(transport, 1)
    assert transport.writes[0].lower().count(b"connection: close") == 1
    assert transport.closed


@on_a_loop
async def test_status_codes_uvicorn_knows_no_phrase_for_still_get_a_status_line() -> None:
    async def gone(request: Request) -> Response:
        return Response(status_code=499)  # what the frontend answers a vanished client

    proto, transport = protocol(hot_paths(gone))
    proto.data_received(post("/shop/predict", b"{}"))
    await settle(transport, 1)
    assert transport.writes[0].startswith(b"HTTP/1.1 499 \r\n")
    assert answers(transport)[0][1]["content-length"] == "0"


@on_a_loop
async def test_a_refused_head_behind_pipelined_requests_mutes_every_unanswered_one(
        caplog: pytest.LogCaptureFixture) -> None:
    """One read holds a request, another pipelined behind it, then a head over the limit:
    the connection is refused (half-closed, lingering), and neither request writes an answer
    after that, the running one included; nothing is logged as an error."""
    proto, transport = protocol(hot_paths(echo), max_header_bytes=1024)
    big = b"POST /c/predict HTTP/1.1\r\nHost: t\r\nX-Big: " + b"x" * 4096 + b"\r\n\r\n"
    with caplog.at_level(logging.DEBUG):
        proto.data_received(post("/a/predict", b"1") + post("/b/predict", b"2") + big)
        for _ in range(50):
            await asyncio.sleep(0)
    assert transport.eof and answers(transport) == []
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
