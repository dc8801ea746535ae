"""One client cannot hold every connection: raw sockets from several loopback addresses
against a real ``parityserve start`` subprocess.

The whole of 127.0.0.0/8 reaches loopback on Linux, so a socket bound to 127.0.0.2 before it
connects is, to the server, another client. Every read has a timeout, so a guard that does
not work fails the test instead of hanging it. Idle connections are held for as long as the
test needs them: the server's timeouts are set far above any test's length.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import orjson
import pytest
from conftest import cli_server

pytestmark = pytest.mark.integration

MAX_CONNECTIONS = 6
PER_ADDRESS = 3
LINGER_S = 1.0  # connection._LINGER_S: a refused client is read from this long at most
SLACK_S = 5.0  # scheduling on a busy 2-core machine


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    limits = {"max_connections": MAX_CONNECTIONS, "max_connections_per_address": PER_ADDRESS,
              "header_timeout_s": 300, "keep_alive_timeout_s": 300}
    config = {"server": {"http_port": 0, "grpc_port": 0, "require_admin_token": False,
                         "limits": limits}}
    with cli_server(tmp_path_factory.mktemp("fair"), config) as (url, _):
        parts = urlsplit(url)
        assert parts.hostname is not None and parts.port is not None
        yield parts.hostname, parts.port


def _connect(server: tuple[str, int], source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(server, timeout=10, source_address=(source, 0))


def _get(path: str, server: tuple[str, int]) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {server[0]}:{server[1]}\r\n\r\n".encode()


def _answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One Content-Length response off ``sock``."""
    reader = sock.makefile("rb")
    try:
        status = int(reader.readline().split()[1])
        headers = {}
        while line := reader.readline().decode("latin-1").strip():
            name, _, value = line.partition(": ")
            headers[name.lower()] = value
        return status, headers, reader.read(int(headers["content-length"]))
    finally:
        reader.close()


def _ask(sock: socket.socket, path: str, server: tuple[str, int]) -> int:
    sock.sendall(_get(path, server))
    return _answer(sock)[0]


def _until_closed(sock: socket.socket, limit_s: float) -> bytes:
    """Everything the server sends until it closes; fails if it is still open after
    ``limit_s``."""
    deadline, data = time.monotonic() + limit_s, b""
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        except TimeoutError:
            break
        if not chunk:
            return data
        data += chunk
    raise AssertionError(f"still open after {limit_s}s; got {data[:200]!r}")


@contextlib.contextmanager
def _held(server: tuple[str, int], sources: list[str]) -> Iterator[list[socket.socket]]:
    """One connection per entry of ``sources`` (the address it comes from), each served once,
    so that the server has surely counted it; all closed at the end."""
    socks: list[socket.socket] = []
    try:
        for source in sources:
            socks.append(_connect(server, source))
            assert _ask(socks[-1], "/v2/health/live", server) == 200
        yield socks
    finally:
        for sock in socks:
            sock.close()


def _served_again(server: tuple[str, int], source: str = "127.0.0.1") -> None:
    """Poll until a new connection from ``source`` is served: the closed ones are released."""
    deadline = time.monotonic() + SLACK_S
    while True:
        with _connect(server, source) as sock:
            sock.sendall(_get("/v2/health/live", server))
            try:
                if _answer(sock)[0] == 200:
                    return
            except (ConnectionError, IndexError, KeyError, ValueError):
                pass  # refused and closed before it could answer in full
        assert time.monotonic() < deadline, "the closed connections were never released"
        time.sleep(0.05)


def test_one_address_past_its_cap_is_refused_at_once_and_others_are_served(server) -> None:
    with _held(server, ["127.0.0.1"] * PER_ADDRESS) as held:
        # Excess connections that never send a byte, as the attack holds them: each is
        # answered and closed at once, not kept until the header timeout (300 s here).
        excess = [_connect(server) for _ in range(4 * PER_ADDRESS)]
        try:
            for sock in excess:
                data = _until_closed(sock, LINGER_S + SLACK_S)
                head, _, body = data.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 429 "), data[:300]
                assert b"\r\nretry-after: 1\r\n" in head.lower() + b"\r\n"
                error = orjson.loads(body)
                assert error["code"] == "too_many_connections_per_address"
                assert f"max_connections_per_address={PER_ADDRESS}" in error["error"]
        finally:
            for sock in excess:
                sock.close()
        with _connect(server, "127.0.0.2") as other:  # another client is still served
            assert _ask(other, "/v2/health/live", server) == 200
            assert _ask(other, "/v2", server) == 200
        assert _ask(held[0], "/v2/health/live", server) == 200  # and so are the held ones
    _served_again(server)


def test_health_probes_are_answered_when_every_connection_is_taken(server) -> None:
    sources = ["127.0.0.1"] * PER_ADDRESS + ["127.0.0.2"] * PER_ADDRESS
    with _held(server, sources):  # the listener's max_connections, all open
        for path, status in (("/v2/health/live", 200), ("/v2/health/ready", 200),
                             ("/v2", 503)):  # a probe is answered; anything else is not
            with _connect(server, "127.0.0.3") as prober:
                prober.sendall(_get(path, server))
                got, headers, body = _answer(prober)
            assert got == status, (path, body)
        assert orjson.loads(body)["code"] == "too_many_connections"
        assert headers["retry-after"] == "1"
    _served_again(server, "127.0.0.3")


def test_refusals_per_address_are_counted(server) -> None:
    with _held(server, ["127.0.0.4"] * PER_ADDRESS), _connect(server, "127.0.0.4") as extra:
        _until_closed(extra, LINGER_S + SLACK_S)
    with _connect(server, "127.0.0.5") as sock:
        sock.sendall(_get("/metrics", server))
        status, _, text = _answer(sock)
    assert status == 200
    assert b'parityserve_connections_refused_total{reason="too_many_connections_per_address"}' \
        in text
