"""A worker's first contact with its frontend: wait for the ZeroMQ handshake, explain failure.

Why: a DEALER socket never reports a refused connection on its own. It queues messages and
reconnects forever, so a worker without the frontend's CURVE keys (or with a key the frontend
does not admit) would sit silent. libzmq reports each handshake's outcome on a monitor
socket; we read the first one and turn a failure into an error that says what to fix.
"""

from __future__ import annotations

import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from parityserve.errors import WorkerError

__all__ = ["JOIN_TIMEOUT_S", "await_handshake", "handshake_failure", "watch_handshake"]

JOIN_TIMEOUT_S = 30.0  # how long a worker waits for any frontend to answer at its address

_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
           | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
_KEYS_HELP = ("pass --server-key (the frontend's server.key) and --client-key (this worker's "
              "NAME.key_secret, whose NAME.key is in the frontend's server.worker_keys_dir); "
              "see `parityserve keys generate --help`")


def handshake_failure(event: int, connect: str, curve: bool) -> str:
    """What went wrong, for a failed handshake ``event`` (a zmq.EVENT_HANDSHAKE_FAILED_*)."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return (f"the frontend at {connect} does not admit this worker's key: put its "
                "NAME.key in the frontend's server.worker_keys_dir and restart the frontend")
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and not curve:
        return f"the frontend at {connect} accepts only CURVE-authenticated workers: {_KEYS_HELP}"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        return (f"the frontend at {connect} does not speak CURVE (server.worker_auth is "
                "false there?): start this worker without --server-key/--client-key")
    # NO_DETAIL: with CURVE, what a wrong --server-key looks like (nothing decrypts); without,
    # what a frontend that wants CURVE answers once its ZAP handler is in the loop.
    if curve:
        return f"the handshake with {connect} failed: is --server-key the frontend's server.key?"
    return (f"the handshake with {connect} failed: a frontend with server.worker_auth (the "
            f"default) accepts only CURVE-authenticated workers: {_KEYS_HELP}")


def watch_handshake(sock: zmq.Socket[bytes]) -> zmq.Socket[bytes]:
    """A monitor on ``sock`` for handshake events; call before ``sock.connect``."""
    return sock.get_monitor_socket(_EVENTS)


def await_handshake(sock: zmq.Socket[bytes], monitor: zmq.Socket[bytes], connect: str, *,
                    curve: bool, timeout_s: float = JOIN_TIMEOUT_S) -> None:
    """Return once the first handshake succeeds; raise WorkerError if it fails or never comes."""
    deadline = time.monotonic() + timeout_s
    try:
        while (left := deadline - time.monotonic()) > 0:
            if not monitor.poll(int(left * 1000) + 1):
                break
            event = recv_monitor_message(monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                return
            raise WorkerError(handshake_failure(event, connect, curve))
        raise WorkerError(f"no frontend answered at {connect} within {timeout_s:g} s: is the "
                          "address right (see the RPC address `parityserve start` prints) "
                          "and the frontend running?")
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
