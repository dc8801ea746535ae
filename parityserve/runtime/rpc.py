"""The one wrapper every RPC to a worker goes through.

``WorkerLink`` owns the frontend's ROUTER socket. The dispatcher never touches ZeroMQ: it calls
``send_*`` and receives ``on_message(replica_id, header, buffers)`` callbacks. Unit tests swap in
a fake with the same three-method surface.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Protocol

import zmq
import zmq.asyncio

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
    """A ZeroMQ ROUTER bound for workers (DEALER sockets) to connect to."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        # Fail loudly when sending to a worker that is gone instead of dropping the batch silently.
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.setsockopt(zmq.LINGER, 0)
        self.address = self._bind(host, port)
        self._task: asyncio.Task[None] | None = None

    def _bind(self, host: str, port: int) -> str:
        if port:
            self._sock.bind(f"tcp://{host}:{port}")
            return f"tcp://{host}:{port}"
        chosen = self._sock.bind_to_random_port(f"tcp://{host}")
        return f"tcp://{host}:{chosen}"

    def start(self, handler: MessageHandler) -> None:
        self._task = asyncio.get_running_loop().create_task(self._receive(handler))

    def send(
        self, replica_id: str, header: dict[str, Any], buffers: list[Any] | None = None
    ) -> None:
        """Non-blocking send; raises WorkerError when the worker is not connected."""
        frames = [replica_id.encode(), *wire.encode(header, buffers)]
        try:
            sent = self._sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as exc:
            raise WorkerError(f"cannot reach replica {replica_id}: {exc.strerror}") from exc
        # zmq.asyncio reports a failed non-blocking send through the returned future, not by
        # raising; read it now so an unreachable worker is noticed at once.
        error = sent.exception() if sent.done() else None
        if isinstance(error, zmq.ZMQError):
            raise WorkerError(f"cannot reach replica {replica_id}: {error.strerror}") from error

    async def _receive(self, handler: MessageHandler) -> None:
        while True:
            frames = await self._sock.recv_multipart(copy=False)
            try:
                replica_id = frames[0].bytes.decode()
                header, buffers = wire.decode(frames[1:])
            except (ProtocolError, UnicodeDecodeError) as exc:
                log.warning("dropping malformed worker message: %s", exc)
                continue
            try:
                handler(replica_id, header, buffers)
            except Exception:  # one bad message must not stop the receive loop
                log.exception("error handling %s from %s", header.get("t"), replica_id)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._sock.close(linger=0)
        self._ctx.term()
