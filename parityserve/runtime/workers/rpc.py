"""The one wrapper every RPC to a worker goes through.

``WorkerLink`` owns the frontend's ROUTER socket. The dispatcher never touches ZeroMQ: it calls
``send_*`` and receives ``on_message(replica_id, header, buffers)`` callbacks. Unit tests swap in
a fake with the same three-method surface.

With ``keys`` the socket is a CURVE server and a ZAP handler admits only allowed worker public
keys: a peer that fails the handshake never gets a message through, in either direction. Each
replica id is also bound to one key (``expect`` before launch, else the first key it spoke
with), so an admitted peer cannot speak under another replica's id either.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import zmq
from zmq.auth.thread import ThreadAuthenticator

from parityserve.errors import ProtocolError, WorkerError
from parityserve.runtime.workers import wire
from parityserve.runtime.workers.keys import ServerKeys

__all__ = ["Link", "MessageHandler", "RejectLog", "WorkerLink"]

log = logging.getLogger(__name__)

MessageHandler = Callable[[str, dict[str, Any], list[Any]], None]
# (peer, reason, detail): a worker message dropped, or a key the ZAP handler turned away.
RejectHandler = Callable[[str, str, str], None]


class RejectLog:
    """Counts dropped worker messages by reason and logs each peer at most once per interval,
    so a peer that floods garbage cannot flood the log too."""

    def __init__(self, count: Callable[[str], None] = lambda reason: None,
                 interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._count = count
        self._interval_s = interval_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def __call__(self, peer: str, reason: str, detail: str) -> None:
        self._count(reason)
        now = self._clock()
        if now - self._last.get(peer, -self._interval_s) < self._interval_s:
            self._suppressed[peer] = self._suppressed.get(peer, 0) + 1
            return
        if len(self._last) > 10_000:  # bounded: peers with garbage identities come and go
            self._last.clear()
        self._last[peer] = now
        more = self._suppressed.pop(peer, 0)
        log.warning("dropping worker message from %s (%s): %s%s", peer, reason, detail,
                    f" ({more} more dropped since the last report)" if more else "")


class _Allowed:
    """ZAP credentials provider: admits the public keys in ``keys.allowed`` (read live)."""

    def __init__(self, keys: ServerKeys, on_reject: RejectHandler) -> None:
        self.keys = keys
        self.on_reject = on_reject

    def callback(self, _domain: str, key: bytes) -> bool:  # pyzmq passes both positionally
        if key in self.keys.allowed:
            return True
        self.on_reject(f"key {key.decode(errors='replace')[:12]}...", "unknown_key",
                       "CURVE key not allowed")
        return False


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

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, keys: ServerKeys | None = None,
                 on_reject: RejectHandler | None = None) -> None:
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        # Fail loudly when sending to a worker that is gone instead of dropping the batch silently.
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.setsockopt(zmq.LINGER, 0)
        self.keys = keys
        self._reject: RejectHandler = on_reject or RejectLog()
        self._bound: dict[bytes, bytes] = {}  # replica id -> the public key it speaks with
        self._owner: dict[bytes, bytes] = {}  # a launched replica's key -> its only id
        self._auth = self._secure(keys) if keys is not None else None
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

    def _secure(self, keys: ServerKeys) -> ThreadAuthenticator:
        """Become a CURVE server whose handshakes a ZAP handler checks (before any bind)."""
        auth = ThreadAuthenticator(self._ctx, log=logging.getLogger(f"{__name__}.zap"))
        auth.start()
        auth.configure_curve_callback("*", credentials_provider=_Allowed(keys, self._reject))
        self._sock.curve_secretkey = keys.secret
        self._sock.curve_publickey = keys.public
        self._sock.curve_server = True
        return auth

    def expect(self, replica_id: str, public_key: bytes) -> None:
        """Only ``public_key`` may speak as ``replica_id``, and that key under no other id
        (set before launching it)."""
        self._bound[replica_id.encode()] = public_key
        self._owner[public_key] = replica_id.encode()

    def forget(self, replica_id: str) -> None:
        """The replica is gone: its id and key binding go too."""
        key = self._bound.pop(replica_id.encode(), None)
        if key is not None and self._owner.get(key) == replica_id.encode():
            del self._owner[key]

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
            if int(self._sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
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
            if self._admit(frames):
                _handle(handler, frames, self._reject)
        self._schedule_pass()  # more may be waiting: come back after other callbacks run

    def _admit(self, frames: list[Any]) -> bool:
        """With CURVE: the message's authenticated key is the one bound to its replica id."""
        if self.keys is None:
            return True
        ident = frames[0].bytes
        try:
            key = frames[-1].get("User-Id").encode()
        except (zmq.ZMQError, AttributeError):
            key = b""
        owner = self._owner.get(key, ident)
        bound = self._bound.setdefault(ident, key) if key and owner == ident else None
        if bound is None or bound != key:
            self._reject(_peer(ident), "wrong_key",
                         "sent under a replica id bound to another CURVE key")
            return False
        return True

    async def close(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._fd)
        self._handler = None
        self._sock.close(linger=0)
        if self._auth is not None:
            self._auth.stop()
        self._ctx.term()


def _peer(ident: bytes) -> str:
    """A peer's identity, printable whatever bytes it chose."""
    text = ident.decode(errors="backslashreplace")
    return text if len(text) <= 80 else text[:77] + "..."


def _handle(handler: MessageHandler, frames: list[Any], reject: RejectHandler) -> None:
    """Decode one worker message and hand it on; a bad one is counted and logged, never raised."""
    try:
        replica_id = frames[0].bytes.decode()
        header, buffers = wire.decode(frames[1:])
    except (ProtocolError, UnicodeDecodeError) as exc:
        reject(_peer(frames[0].bytes), "malformed", f"dropping malformed worker message: {exc}")
        return
    try:
        handler(replica_id, header, buffers)
    except Exception:  # one bad message must not stop the receive loop
        log.exception("error handling %s from %s", header.get("t"), replica_id)
