"""A process's death seen through a TCP connection it holds: the kernel's FIN, in milliseconds.

Why this exists (issue 41): a graph member on another Ray node has no pidfd here, and Ray
reports its actor dead only once the GCS has given up on the node, seconds after a crash. So a
crashed node's members were found by the heartbeat timeout alone: a median 366 ms of the 743
ms failover. Yet when a machine's processes die (a raylet crash, the OOM killer, a container
killed, the node's processes killed together), its kernel closes their sockets at once. A
connection held from the frontend to the member's actor carries exactly that news.

* ``LivenessListener`` (the actor's side) listens on its node's address. A peer must send the
  32-byte token the frontend gave the actor within ``TOKEN_WAIT_S``; it is then answered one
  byte (``ARMED``) and its connection held for good. Anyone else is closed: nobody without the
  token can take the link's place, and a silent connection holds no slot for long. ``close``
  (the actor's operator process exited) shuts every held connection, so a process kill reads
  the same as a node's.
* ``LivenessLink`` (the frontend's side) never blocks and needs no thread: ``check`` is one
  non-blocking syscall, called as often as the graph's watch looks at its members. It reports
  ``GONE`` only for a link that was armed and then closed or reset: a refused connection, a bad
  token or a listener that never answers leaves the link ``UNKNOWN``, and the member is then
  watched by its heartbeats alone, as before.

What it cannot see: a machine that stops without its kernel closing anything (power lost, a
kernel panic, a network cut). No FIN comes; the heartbeat timeout is the backstop there.
Hand-written because it is a few syscalls: no library offers "tell me when this peer's
process is gone" for a peer on another host (ZeroMQ's ROUTER_NOTIFY would, but is a draft API
our pyzmq build lacks).
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import logging
import selectors
import socket
import threading
import time

__all__ = ["ARMED", "GONE", "TOKEN_BYTES", "TOKEN_WAIT_S", "UNKNOWN", "LivenessLink",
           "LivenessListener"]

log = logging.getLogger(__name__)

TOKEN_BYTES = 32
TOKEN_WAIT_S = 2.0  # a connection that has not sent the token by then is closed
_MAX_PENDING = 64  # connections still to send their token; beyond it the oldest is dropped
ARMED = "armed"  # the peer is there, and its death will be seen
GONE = "gone"  # an armed link closed or reset: the peer's process is gone
UNKNOWN = "unknown"  # not (yet) armed: nothing is known from the link


class LivenessListener:
    """The actor's side: a listening socket and one daemon thread (see the module docstring)."""

    def __init__(self, host: str, token: bytes) -> None:
        if len(token) != TOKEN_BYTES:
            raise ValueError(f"a liveness token has {TOKEN_BYTES} bytes, not {len(token)}")
        self._token = token
        self._server = socket.create_server((host, 0))
        self._server.setblocking(False)
        self.address: tuple[str, int] = self._server.getsockname()[:2]
        self._held: list[socket.socket] = []
        self._pending: dict[socket.socket, tuple[float, bytes]] = {}
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="liveness", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Shut every held connection (the peer reads EOF) and stop listening."""
        self._closed.set()
        with self._lock:
            for conn in self._held:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()
            self._held.clear()
        self._thread.join(timeout=1)

    def _serve(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self._server, selectors.EVENT_READ)
            while not self._closed.is_set():
                for key, _ in sel.select(timeout=0.1):
                    if key.fileobj is self._server:
                        self._accept(sel)
                    else:
                        self._read_token(sel, key.fileobj)  # type: ignore[arg-type]
                self._drop_slow(sel, time.monotonic())
            for conn in list(self._pending):
                conn.close()
            self._server.close()

    def _accept(self, sel: selectors.BaseSelector) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            conn, _ = self._server.accept()
            conn.setblocking(False)
            if len(self._pending) >= _MAX_PENDING:  # a flood: the oldest waits no longer
                oldest = min(self._pending, key=lambda c: self._pending[c][0])
                self._drop(sel, oldest)
            self._pending[conn] = (time.monotonic(), b"")
            sel.register(conn, selectors.EVENT_READ)

    def _read_token(self, sel: selectors.BaseSelector, conn: socket.socket) -> None:
        since, got = self._pending[conn]
        try:
            chunk = conn.recv(TOKEN_BYTES - len(got))
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(sel, conn)
            return
        got += chunk
        if len(got) < TOKEN_BYTES:
            self._pending[conn] = (since, got)
            return
        sel.unregister(conn)
        del self._pending[conn]
        if not hmac.compare_digest(got, self._token):
            conn.close()
            return
        with contextlib.suppress(OSError):
            conn.send(b"\x01")  # armed: the frontend counts a close from now on as a death
        with self._lock:
            if self._closed.is_set():
                conn.close()
            else:
                self._held.append(conn)

    def _drop_slow(self, sel: selectors.BaseSelector, now: float) -> None:
        for conn, (since, _) in list(self._pending.items()):
            if now - since > TOKEN_WAIT_S:
                self._drop(sel, conn)

    def _drop(self, sel: selectors.BaseSelector, conn: socket.socket) -> None:
        self._pending.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(conn)
        conn.close()


class LivenessLink:
    """The frontend's side: connect, send the token, wait for ``ARMED``, then watch for the
    close. Every step is non-blocking; ``check`` advances it (see the module docstring)."""

    def __init__(self, address: tuple[str, int], token: bytes) -> None:
        self.address, self._token = address, token
        self.state = UNKNOWN
        self.why = ""  # for the log: why the link is GONE, or why it never armed
        self._sent = 0
        self._sock: socket.socket | None = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setblocking(False)
        code = self._sock.connect_ex(address)
        if code not in (0, errno.EINPROGRESS):
            self._give_up(f"connect: {errno.errorcode.get(code, code)}")

    def check(self) -> str:
        """The link's state now: ``ARMED``, ``GONE`` or ``UNKNOWN`` (never blocks)."""
        sock = self._sock
        if sock is None:
            return self.state
        try:
            if self._sent < TOKEN_BYTES:
                self._sent += sock.send(self._token[self._sent:])
                return self.state
            data = sock.recv(64)
        except (BlockingIOError, InterruptedError):
            return self.state  # connecting, or nothing to read: as it was
        except OSError as exc:  # reset, refused, unreachable
            self._end(f"{type(exc).__name__}: {exc}")
            return self.state
        if not data:
            self._end("closed by the peer")
        elif self.state == UNKNOWN:
            self.state = ARMED
        return self.state

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _end(self, why: str) -> None:
        if self.state == ARMED:
            self.state, self.why = GONE, why
            self.close()
        else:
            self._give_up(why)

    def _give_up(self, why: str) -> None:
        """Never armed: the link knows nothing, and the heartbeats watch alone."""
        self.why = f"liveness link to {self.address[0]}:{self.address[1]} not armed ({why})"
        log.warning("%s; heartbeats alone will tell its loss", self.why)
        self.close()
