"""Connection limits tried as an attacker would, with raw sockets against a real server.

Every socket read has a timeout, so a limit that does not work fails the test instead of
hanging it. Small limits keep the tests fast.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from typing import BinaryIO
from urllib.parse import urlsplit

import httpx
import numpy as np
import orjson
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from parityserve.config import Limits
from parityserve.runtime.frontend import connection

pytestmark = pytest.mark.integration

HEADER_TIMEOUT_S = BODY_TIMEOUT_S = KEEP_ALIVE_S = 0.5
CEILING_S = 30.0  # how long a test waits for a close that must come; no verdict is timed
MAX_HEADER_BYTES = 8192
MAX_CONNECTIONS = 4
LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@pytest.fixture(scope="module")
def fast(server_factory):
    """Short timeouts, a no-op model for real requests."""
    limits = {"header_timeout_s": HEADER_TIMEOUT_S, "body_timeout_s": BODY_TIMEOUT_S,
              "keep_alive_timeout_s": KEEP_ALIVE_S, "max_header_bytes": MAX_HEADER_BYTES}
    return server_factory({
        "server": {"http_port": 0, "cache_bytes": 0, "limits": limits},
        "models": [{"name": "noop", "source": "zoo:noop", "replicas": 1}],
    }).url


@pytest.fixture(scope="module")
def few(server_factory):
    """Few connections, long timeouts (so idle connections can be held), no models."""
    return server_factory({"server": {"http_port": 0,
                                      "limits": {"max_connections": MAX_CONNECTIONS}}}).url


def _connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname, parts.port), timeout=5)


def _until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes (EOF or reset), and how long that took."""
    start, data = time.monotonic(), b""
    while True:
        left = limit_s - (time.monotonic() - start)
        if left <= 0:
            raise AssertionError(f"still open after {limit_s}s; got {data[:200]!r}")
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        except TimeoutError:
            continue
        if not chunk:
            return data, time.monotonic() - start
        data += chunk


def _response(data: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def _json_error(data: bytes, status: int, code: str) -> str:
    got, headers, body = _response(data)
    assert got == status, data[:300]
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    error = orjson.loads(body)
    assert error["code"] == code
    return error["error"]


def _read_response(reader: BinaryIO) -> tuple[int, bytes]:
    """One Content-Length response off a keep-alive connection's reader (buffered, so a
    pipelined answer that arrived with it is kept for the next call)."""
    status = int(reader.readline().split()[1])
    headers = {}
    while (line := reader.readline().decode("latin-1").strip()):
        name, _, value = line.partition(": ")
        headers[name.lower()] = value
    return status, reader.read(int(headers["content-length"]))


def _normal_request_succeeds(url: str) -> None:
    assert httpx.get(f"{url}/v2/health/live", timeout=5).status_code == 200


@pytest.mark.parametrize("after_a_request", [False, True], ids=["new", "keep-alive"])
def test_slowloris_head_is_closed_after_the_header_timeout(fast: str,
                                                           after_a_request: bool) -> None:
    with _connect(fast) as sock:
        if after_a_request:  # the second request's head gets its own deadline
            sock.sendall(LIVE)
            assert _read_response(sock.makefile("rb"))[0] == 200
        start = time.monotonic()
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        data, closed = b"", False
        while not closed and time.monotonic() - start < CEILING_S:
            try:
                sock.sendall(b"X")  # one byte of a header that never ends
                sock.settimeout(0.2)
                chunk = sock.recv(65536)
                data += chunk
                closed = b"\r\n\r\n" in data or not chunk
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
        elapsed = time.monotonic() - start
    assert closed, "a trickled head kept its connection"
    # Not before the header timeout, and by it (the 408 names that timer, not the header
    # size limit the trickle would reach after 8 KB): no upper clock bound to flake on.
    assert elapsed >= HEADER_TIMEOUT_S * 0.8
    assert "header_timeout_s" in _json_error(data, 408, "request_timeout")
    _normal_request_succeeds(fast)


def test_a_connection_that_sends_nothing_is_closed_without_an_answer(fast: str) -> None:
    with _connect(fast) as sock:
        data, elapsed = _until_closed(sock, CEILING_S)
    assert data == b""
    assert elapsed >= HEADER_TIMEOUT_S * 0.8


def test_a_body_shorter_than_its_content_length_gets_408_after_the_body_timeout(fast) -> None:
    with _connect(fast) as sock:
        sock.sendall(b"POST /v2/models/noop/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"inp")
        data, elapsed = _until_closed(sock, CEILING_S)
    assert elapsed >= BODY_TIMEOUT_S * 0.8
    assert "body_timeout_s" in _json_error(data, 408, "request_timeout")
    _normal_request_succeeds(fast)


def test_an_idle_keep_alive_connection_is_closed_after_the_keep_alive_timeout(fast) -> None:
    with _connect(fast) as sock:
        sock.sendall(LIVE)
        assert _read_response(sock.makefile("rb"))[0] == 200
        data, elapsed = _until_closed(sock, CEILING_S)
    assert data == b""
    assert elapsed >= KEEP_ALIVE_S * 0.8


@pytest.mark.parametrize("size", [100 * 1024, MAX_HEADER_BYTES + 512])
def test_an_oversized_head_gets_431(fast: str, size: int) -> None:
    # 100 KiB arrives over several reads (caught while incomplete); just over the limit
    # arrives complete in one read (caught when the head is measured).
    head = b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * size + b"\r\n\r\n"
    with _connect(fast) as sock:
        # Refused before it was all sent? The answer is still there to be read.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(head)
        data, _ = _until_closed(sock, CEILING_S)
    assert str(MAX_HEADER_BYTES) in _json_error(data, 431, "header_too_large")
    _normal_request_succeeds(fast)


@pytest.mark.parametrize("garbage", [b"\x00\x01\x02 nonsense\r\n\r\n",
                                     b"GET / HTTP/9.9\r\n\r\n",
                                     b"POST / HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
                                     b"GET http://[ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"])
def test_a_malformed_request_gets_a_json_400(fast: str, garbage: bytes) -> None:
    with _connect(fast) as sock:
        sock.sendall(garbage)
        data, _ = _until_closed(sock, CEILING_S)
    assert _json_error(data, 400, "malformed_request").startswith("malformed HTTP request")


def test_connections_over_the_limit_get_a_json_503_and_service_resumes(few: str) -> None:
    holders = [_connect(few) for _ in range(MAX_CONNECTIONS)]
    readers = [sock.makefile("rb") for sock in holders]
    try:
        for sock, reader in zip(holders, readers, strict=True):  # served, so counted
            sock.sendall(LIVE)
            assert _read_response(reader)[0] == 200
        with _connect(few) as extra:  # a health probe would be answered (test_edge_fairness)
            extra.sendall(b"GET /v2 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            data, _ = _until_closed(extra, CEILING_S)
        assert f"max_connections={MAX_CONNECTIONS}" in _json_error(
            data, 503, "too_many_connections")
        assert _response(data)[1]["retry-after"] == "1"
        holders[0].sendall(LIVE)  # those within the limit are still served
        assert _read_response(readers[0])[0] == 200
    finally:
        for sock, reader in zip(holders, readers, strict=True):
            reader.close()
            sock.close()
    deadline = time.monotonic() + CEILING_S
    while httpx.get(f"{few}/v2/health/live", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, "the closed connections were never released"
        time.sleep(0.05)


def test_keep_alive_pipelined_and_chunked_requests_still_work(fast: str) -> None:
    infer = b'{"inputs":[{"name":"input","shape":[1,2],"datatype":"FP32","data":[1,2]}]}'
    with _connect(fast) as sock:
        reader = sock.makefile("rb")
        for _ in range(3):  # keep-alive
            sock.sendall(LIVE)
            assert _read_response(reader)[0] == 200
        sock.sendall(LIVE * 3)  # pipelined
        assert [_read_response(reader)[0] for _ in range(3)] == [200] * 3
        sock.sendall(b"POST /v2/models/noop/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(0, len(infer), 20):  # chunked, spread over several reads
            piece = infer[i:i + 20]
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            time.sleep(0.02)
        sock.sendall(b"0\r\n\r\n")
        status, body = _read_response(reader)
    assert status == 200, body
    assert orjson.loads(body)["outputs"][0]["data"] == [0.0]


def _infer(request_id: str, path: bytes = b"/v2/models/noop/infer",
           extra: bytes = b"") -> tuple[bytes, bytes]:
    body = orjson.dumps({"id": request_id, "inputs": [
        {"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]})
    head = (b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n%s\r\n" % (path, len(body), extra))
    return head, body


def test_pipelined_hot_requests_are_answered_in_order_beside_other_routes(fast: str) -> None:
    """The hot routes' own cycle (runtime/frontend/hot_cycle.py) keeps HTTP/1.1's order: answers
    leave in the order the requests came, hot or not, percent-encoded paths included."""
    requests = [b"".join(_infer("a")), LIVE, b"".join(_infer("b", b"/v2/models/no%6Fp/infer")),
                b"".join(_infer("c"))]
    with _connect(fast) as sock:
        reader = sock.makefile("rb")
        sock.sendall(b"".join(requests))
        answers = [_read_response(reader) for _ in requests]
    assert [status for status, _ in answers] == [200] * 4
    ids = [orjson.loads(body).get("id") for _, body in answers]
    assert ids == ["a", None, "b", "c"]


def test_a_hot_request_expecting_100_continue_gets_it_then_its_answer(fast: str) -> None:
    head, body = _infer("x", extra=b"Expect: 100-continue\r\n")
    with _connect(fast) as sock:
        reader = sock.makefile("rb")
        sock.sendall(head)
        assert reader.readline() == b"HTTP/1.1 100 Continue\r\n"
        assert reader.readline() == b"\r\n"
        sock.sendall(body)
        status, answer = _read_response(reader)
    assert status == 200 and orjson.loads(answer)["id"] == "x"


def test_a_16_mib_body_within_max_body_bytes_is_served(fast: str) -> None:
    n = 4_000_000  # float32: 16,000,000 bytes, under the 16 MiB default max_body_bytes
    tensor = np.zeros(n, dtype=np.float32).tobytes()
    header = orjson.dumps({"inputs": [{"name": "input", "shape": [1, n], "datatype": "FP32",
                                       "parameters": {"binary_data_size": len(tensor)}}]})
    response = httpx.post(f"{fast}/v2/models/noop/infer", content=header + tensor, timeout=60,
                          headers={"Inference-Header-Content-Length": str(len(header)),
                                   "Content-Type": "application/octet-stream"})
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [0.0]


def test_refusals_are_counted_by_reason_and_not_logged_at_warning(fast: str) -> None:
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    loggers = [logging.getLogger(name) for name in ("uvicorn", "uvicorn.error", "parityserve")]
    for log in loggers:
        log.addHandler(handler)
    try:
        for request in (b"\x00garbage\r\n\r\n", LIVE[:-2] + b"X-Big: " + b"a" * 20000):
            with _connect(fast) as sock:
                sock.sendall(request)
                _until_closed(sock, CEILING_S)
    finally:
        for log in loggers:
            log.removeHandler(handler)
    assert records == []  # a flood of bad connections must not flood the logs
    # counted, not only named: every reason's series exists at 0 from the start
    metrics = httpx.get(f"{fast}/metrics", timeout=5).text
    refused = {s.labels["reason"]: s.value for family in text_string_to_metric_families(metrics)
               for s in family.samples if s.name == "parityserve_connections_refused_total"}
    assert refused["malformed"] >= 1 and refused["header_too_large"] >= 1, refused


@pytest.mark.parametrize("httptools", [True, False], ids=["httptools", "h11-fallback"])
def test_uvicorn_starts_and_serves_with_either_protocol(monkeypatch, httptools: bool) -> None:
    if not httptools:  # as if httptools were not installed
        monkeypatch.setattr(connection, "_httptools_protocol", lambda: None)
    settings = connection.uvicorn_settings(Limits(keep_alive_timeout_s=0.5))
    assert (settings["http"] == "h11") is not httptools

    async def app(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    server = uvicorn.Server(uvicorn.Config(app, port=0, lifespan="off", log_level="error",
                                           **settings))
    sock = socket.create_server(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.01)
        port = sock.getsockname()[1]
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=5).status_code == 204
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
