"""The worker's first handshake, against a real CURVE ROUTER with a ZAP authenticator."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import zmq
from zmq.auth.thread import ThreadAuthenticator

from parityserve.errors import WorkerError
from parityserve.runtime.workers.handshake import await_handshake, watch_handshake


class _Frontend:
    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], admitted: bytes) -> None:
        self.public, secret = zmq.curve_keypair()
        self.auth = ThreadAuthenticator(ctx)
        self.auth.start()
        self.auth.configure_curve_callback(domain="*", credentials_provider=self)
        self.admitted = admitted
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.curve_server = True
        self.sock.curve_publickey, self.sock.curve_secretkey = self.public, secret
        self.address = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"

    def callback(self, _domain: str, key: bytes) -> bool:
        return key == self.admitted

    def close(self) -> None:
        self.sock.close(linger=0)
        self.auth.stop()


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.term()


@pytest.fixture
def worker_pair() -> tuple[bytes, bytes]:
    return zmq.curve_keypair()


@pytest.fixture
def frontend(ctx, worker_pair) -> Iterator[_Frontend]:
    front = _Frontend(ctx, admitted=worker_pair[0])
    yield front
    front.close()


def _join(ctx, address: str, keys: tuple[bytes, bytes, bytes] | None,
          timeout_s: float = 5.0) -> None:
    sock = ctx.socket(zmq.DEALER)
    try:
        if keys is not None:
            sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = keys
        monitor = watch_handshake(sock)
        sock.connect(address)
        await_handshake(sock, monitor, address, curve=keys is not None, timeout_s=timeout_s)
    finally:
        sock.close(linger=0)


def test_the_admitted_worker_joins(ctx, frontend, worker_pair) -> None:
    _join(ctx, frontend.address, (frontend.public, *worker_pair))


def test_a_worker_without_keys_is_told_to_pass_them(ctx, frontend) -> None:
    with pytest.raises(WorkerError, match="accepts only CURVE-authenticated workers: pass "
                                          "--server-key"):
        _join(ctx, frontend.address, None)


def test_a_worker_whose_key_is_not_admitted_is_told_so(ctx, frontend) -> None:
    with pytest.raises(WorkerError, match="does not admit this worker's key"):
        _join(ctx, frontend.address, (frontend.public, *zmq.curve_keypair()))


def test_a_wrong_server_key_is_named(ctx, frontend, worker_pair) -> None:
    stranger, _ = zmq.curve_keypair()
    with pytest.raises(WorkerError, match="is --server-key the frontend's server.key"):
        _join(ctx, frontend.address, (stranger, *worker_pair))


def test_nobody_listening_times_out_with_the_address(ctx) -> None:
    # A port bound and never listened on: connections to it are refused, and nobody else
    # can take it meanwhile. (Closing a probe to free its port let another process's
    # ZeroMQ socket bind it and answer the handshake, once, in a busy clean-clone run.)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{held.getsockname()[1]}"
        with pytest.raises(WorkerError,
                           match=f"no frontend answered at {address} within 0.3 s"):
            _join(ctx, address, None, timeout_s=0.3)
