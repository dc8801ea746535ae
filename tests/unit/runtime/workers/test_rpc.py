"""WorkerLink driven off a real event loop, with a real ZeroMQ DEALER as the worker."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import zmq

from parityserve.errors import WorkerError
from parityserve.runtime.workers import wire
from parityserve.runtime.workers.rpc import WorkerLink


def _dealer(ctx: zmq.Context, address: str, identity: bytes) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    return sock


async def _until(predicate, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


def test_messages_flow_both_ways_including_a_burst_larger_than_one_pass():
    async def scenario() -> list[tuple[str, dict[str, Any]]]:
        link = WorkerLink()
        ctx = zmq.Context()
        worker = _dealer(ctx, link.address, b"w1")
        got: list[tuple[str, dict[str, Any]]] = []
        # Sent before the link starts reading: the first pass must pick these up.
        for i in range(3):
            worker.send_multipart(wire.encode({"t": wire.HEARTBEAT, "i": i}))
        await asyncio.sleep(0.05)
        link.start(lambda rid, header, buffers: got.append((rid, header)))
        await _until(lambda: len(got) == 3)
        for i in range(3, 3 + 3 * WorkerLink._BURST):
            worker.send_multipart(wire.encode({"t": wire.HEARTBEAT, "i": i}))
        await _until(lambda: len(got) == 3 + 3 * WorkerLink._BURST)
        link.send("w1", {"t": wire.PREDICT, "bid": 7}, [b"payload"])
        assert worker.poll(2000)
        header, buffers = wire.decode(worker.recv_multipart())
        assert (header["bid"], bytes(buffers[0])) == (7, b"payload")
        worker.close()
        ctx.term()
        await link.close()
        return got

    got = asyncio.run(scenario())
    assert [h["i"] for _, h in got] == list(range(3 + 3 * WorkerLink._BURST))
    assert {rid for rid, _ in got} == {"w1"}


def test_sending_to_an_unknown_worker_raises_at_once():
    async def scenario() -> None:
        link = WorkerLink()
        link.start(lambda *args: None)
        with pytest.raises(WorkerError, match="cannot reach replica ghost"):
            link.send("ghost", {"t": wire.PREDICT})
        await link.close()

    asyncio.run(scenario())


def test_a_malformed_message_or_a_failing_handler_does_not_stop_receiving(caplog):
    async def scenario() -> list[int]:
        link = WorkerLink()
        ctx = zmq.Context()
        worker = _dealer(ctx, link.address, b"w2")
        seen: list[int] = []

        def handler(rid: str, header: dict[str, Any], buffers: list[Any]) -> None:
            if header["i"] == 1:
                raise RuntimeError("handler bug")
            seen.append(header["i"])

        link.start(handler)
        worker.send_multipart([b"\xc1 not msgpack"])
        for i in range(3):
            worker.send_multipart(wire.encode({"t": wire.HEARTBEAT, "i": i}))
        await _until(lambda: seen == [0, 2])
        worker.close()
        ctx.term()
        await link.close()
        return seen

    assert asyncio.run(scenario()) == [0, 2]
    assert "dropping malformed worker message" in caplog.text
    assert "error handling hb from w2" in caplog.text


def test_a_pass_scheduled_before_close_is_harmless():
    # A pass that touched the closed socket would raise inside a call_soon callback, which
    # asyncio only logs ("Exception in callback"): the loop's exception handler catches it.
    async def scenario() -> list[dict[str, Any]]:
        reported: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: reported.append(ctx))
        link = WorkerLink()
        link.start(lambda *args: None)  # schedules a first pass with call_soon
        assert link._pass_pending  # noqa: SLF001
        await link.close()
        await asyncio.sleep(0)  # one loop pass: the scheduled receive pass runs now
        assert not link._pass_pending  # noqa: SLF001  (it ran)
        return reported

    assert asyncio.run(scenario()) == []
