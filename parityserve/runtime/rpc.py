"""The one wrapper every RPC to a worker goes through.

``WorkerLink`` owns the frontend's ROUTER socket. The dispatcher never touches ZeroMQ: it calls
``send_*`` and receives ``on_message(replica_id, header, buffers)`` callbacks. Unit tests swap in
a fake with the same three-method surface.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

import zmq

from parityserve.errors import ProtocolError, WorkerError
from parityserve.runtime import wire

__all__ = ["Link", "MessageHandler", "WorkerLink"]

log = logging.getLogger(__name__)

MessageHandler = Callable[[str, dict[str, Any], list[Any]], None]


class Link(Protocol):
    """What the dispatcher needs from the RPC layer."""

    def send(
        self, replica_id: str, header: dict[str, Any], buffers: list[Any] | None = None
    ) -> None: ...


class WorkerLink:
    """A ZeroMQ ROUTER bound for workers (DEALER sockets) to connect to.

    Why not ``zmq.asyncio``: it wraps every send and receive in a future and a poller
    registration, which at saturation cost the frontend about a tenth of its CPU per query.
    Here a plain socket is driven straight off the event loop: ``add_reader`` on its file
    descriptor, and receives drained without blocking. ZeroMQ's descriptor is
    edge-triggered (it signals that the socket's state *may* have changed, and any socket
    call can consume that signal), so a receive pass always runs until the socket says it
    has nothing left, and a send that leaves messages waiting schedules another pass.
    """

    # Messages handled per pass before yielding, so a flood of results cannot starve HTTP.
    _BURST = 256

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        # Fail loudly when sending to a worker that is gone instead of dropping the batch silently.
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.setsockopt(zmq.LINGER, 0)
        self.address = self._bind(host, port)
        self._fd = int(self._sock.getsockopt(zmq.FD))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handler: MessageHandler | None = None
        self._pass_pending = False

    def _bind(self, host: str, port: int) -> str:
        if port:
            self._sock.bind(f"tcp://{host}:{port}")
            return f"tcp://{host}:{port}"
        chosen = self._sock.bind_to_random_port(f"tcp://{host}")
        return f"tcp://{host}:{chosen}"

    def start(self, handler: MessageHandler) -> None:
        self._loop = asyncio.get_running_loop()
        self._handler = handler
        self._loop.add_reader(self._fd, self._receive_pass)
        self._schedule_pass()  # anything that arrived before the reader was registered

    def send(
        self, replica_id: str, header: dict[str, Any], buffers: list[Any] | None = None
    ) -> None:
        """Non-blocking send; raises WorkerError when the worker is not connected."""
        frames = [replica_id.encode(), *wire.encode(header, buffers)]
        try:
            self._sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as exc:
            raise WorkerError(f"cannot reach replica {replica_id}: {exc.strerror}") from exc
        finally:
            if self._sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                self._schedule_pass()  # the send may have consumed the descriptor's signal

    def _schedule_pass(self) -> None:
        if not self._pass_pending and self._loop is not None:
            self._pass_pending = True
            self._loop.call_soon(self._receive_pass)

    def _receive_pass(self) -> None:
        self._pass_pending = False
        handler = self._handler
        if handler is None:  # closed while a pass was scheduled
            return
        for _ in range(self._BURST):
            try:
                frames = self._sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            _handle(handler, frames)
        self._schedule_pass()  # more may be waiting: come back after other callbacks run

    async def close(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._fd)
        self._handler = None
        self._sock.close(linger=0)
        self._ctx.term()


def _handle(handler: MessageHandler, frames: list[Any]) -> None:
    """Decode one worker message and hand it on; a bad one is logged, never raised."""
    try:
        replica_id = frames[0].bytes.decode()
        header, buffers = wire.decode(frames[1:])
    except (ProtocolError, UnicodeDecodeError) as exc:
        log.warning("dropping malformed worker message: %s", exc)
        return
    try:
        handler(replica_id, header, buffers)
    except Exception:  # one bad message must not stop the receive loop
        log.exception("error handling %s from %s", header.get("t"), replica_id)
