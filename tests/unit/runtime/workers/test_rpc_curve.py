"""WorkerLink with CURVE: only admitted keys get through, and each replica id keeps its key.
Real ZeroMQ sockets on loopback, driven off a real event loop (as in test_rpc.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import zmq

from parityserve.runtime.workers import wire
from parityserve.runtime.workers.keys import ClientKeys, ServerKeys, new_client_keys
from parityserve.runtime.workers.rpc import RejectLog, WorkerLink


def _dealer(ctx: zmq.Context, address: str, identity: bytes,
            keys: ClientKeys | None) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        sock.curve_serverkey = keys.server_public
        sock.curve_publickey = keys.public
        sock.curve_secretkey = keys.secret
    sock.connect(address)
    return sock


# How long a test waits for something to arrive before it fails (loaded CI machines are slow).
WAIT_S = 15.0


async def _until(predicate, timeout_s: float = WAIT_S) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def _reconnect_until_heard(peers: Peers, identity: bytes, keys: ClientKeys) -> zmq.Socket:
    """Connect under ``identity`` until the link hears a heartbeat.

    A ROUTER ignores, for good, a connection whose identity another live connection still
    holds. If this one connects before the ROUTER has seen the previous holder's close
    (a race a loaded machine loses now and then), its messages never arrive: close it and
    connect again, as a worker that is never answered would."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while True:
        sock = peers.dealer(identity, keys)
        sock.send_multipart(wire.encode({"t": wire.HEARTBEAT}))
        try:
            await _until(lambda: peers.got, timeout_s=1.0)
            return sock
        except AssertionError:
            sock.close()
            assert asyncio.get_running_loop().time() < deadline, "never heard"


class Peers:
    """A CURVE link, what it handed on, and what it refused."""

    def __init__(self) -> None:
        self.keys = ServerKeys.in_memory()
        self.got: list[tuple[str, dict[str, Any]]] = []
        self.rejected: list[tuple[str, str]] = []
        self.link = WorkerLink(keys=self.keys,
                               on_reject=lambda peer, why, _: self.rejected.append((peer, why)))
        self.link.start(lambda rid, header, buffers: self.got.append((rid, header)))
        self.ctx = zmq.Context()
        self.socks: list[zmq.Socket] = []

    def dealer(self, identity: bytes, keys: ClientKeys | None) -> zmq.Socket:
        self.socks.append(_dealer(self.ctx, self.link.address, identity, keys))
        return self.socks[-1]

    async def close(self) -> None:
        """Every socket this made, even when the test failed half-way (a leaked socket
        would surface as a warning in whichever test runs next)."""
        for sock in self.socks:
            sock.close()
        self.ctx.term()
        await self.link.close()


def _with_peers(scenario) -> None:
    async def run() -> None:
        peers = Peers()
        try:
            await scenario(peers)
        finally:
            await peers.close()

    asyncio.run(run())


def test_an_unauthenticated_peer_is_never_read_and_never_reached() -> None:
    async def scenario(peers: Peers) -> None:
        good_keys = peers.keys.client()
        plain = peers.dealer(b"plain", None)  # no CURVE at all
        stranger = peers.dealer(b"stranger", new_client_keys(peers.keys.public))  # not admitted
        impostor_server = new_client_keys(ServerKeys.in_memory().public)  # trusts another server
        peers.keys.allowed.add(impostor_server.public)
        confused = peers.dealer(b"confused", impostor_server)
        good = peers.dealer(b"good", good_keys)
        for sock in (plain, stranger, confused):
            sock.send_multipart(wire.encode({"t": wire.HELLO}), flags=zmq.NOBLOCK)
        good.send_multipart(wire.encode({"t": wire.HEARTBEAT}))
        await _until(lambda: peers.got)
        await _until(lambda: ("key", "unknown_key") in [(p[:3], w) for p, w in peers.rejected])
        await asyncio.sleep(0.3)  # time for anything else to (wrongly) arrive
        assert [rid for rid, _ in peers.got] == ["good"]
        for rid in ("plain", "stranger", "confused"):  # sending to them fails: not connected
            try:
                peers.link.send(rid, {"t": wire.PREDICT, "bid": 1})
                raise AssertionError(f"{rid} was reachable")
            except Exception as exc:
                assert "cannot reach replica" in str(exc)
        assert not any(s.poll(50) for s in (plain, stranger, confused))

    _with_peers(scenario)


def test_an_admitted_peer_cannot_speak_under_another_replicas_id() -> None:
    async def scenario(peers: Peers) -> None:
        owner_keys, other_keys = peers.keys.client(), peers.keys.client()
        peers.link.expect("m/v1/0#1-abc", owner_keys.public)
        # The rogue connects first under the expected id, with another admitted key.
        rogue = peers.dealer(b"m/v1/0#1-abc", other_keys)
        rogue.send_multipart(wire.encode({"t": wire.HELLO}))
        await _until(lambda: peers.rejected)
        assert peers.rejected == [("m/v1/0#1-abc", "wrong_key")] and not peers.got
        rogue.close()
        await _reconnect_until_heard(peers, b"m/v1/0#1-abc", owner_keys)
        # An id first seen with one key stays tied to it (remote workers are bound this way).
        joined = peers.dealer(b"ext-1", other_keys)
        joined.send_multipart(wire.encode({"t": wire.HEARTBEAT}))
        await _until(lambda: len(peers.got) == 2)
        # A launched replica's key speaks under its own id only.
        moonlight = peers.dealer(b"ext-2", owner_keys)
        moonlight.send_multipart(wire.encode({"t": wire.HELLO}))
        await _until(lambda: len(peers.rejected) == 2)
        assert peers.rejected[1] == ("ext-2", "wrong_key") and len(peers.got) == 2

    _with_peers(scenario)


def test_reject_log_counts_every_drop_but_logs_a_peer_once_per_interval(caplog) -> None:
    counted: list[str] = []
    now = [0.0]
    log = RejectLog(counted.append, interval_s=10.0, clock=lambda: now[0])
    for _ in range(5):
        log("peer-a", "malformed", "garbage")
    log("peer-b", "wrong_shape", "3 outputs for 2 inputs")
    now[0] = 11.0
    log("peer-a", "malformed", "garbage")
    assert counted == ["malformed"] * 5 + ["wrong_shape", "malformed"]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert "4 more dropped" in lines[2]
