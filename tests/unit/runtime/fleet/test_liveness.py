"""The liveness link (runtime/fleet/liveness.py) on real sockets and real processes: an armed
link reads GONE when its peer's process dies (SIGKILL, no goodbye) or when the listener is
closed; a link that never armed (refused, bad token, a listener that never answers) stays
UNKNOWN, never GONE, so nothing is declared dead on its word; a client without the token
cannot hold the listener's door."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time

import pytest

from parityserve.runtime.fleet import liveness
from parityserve.runtime.fleet.liveness import ARMED, GONE, UNKNOWN, LivenessLink, LivenessListener


@pytest.fixture(autouse=True)
def _close_links(monkeypatch: pytest.MonkeyPatch):
    """Every link a test opens is closed after it (an open socket is a ResourceWarning)."""
    opened: list[LivenessLink] = []
    real_init = LivenessLink.__init__

    def init(self: LivenessLink, *args: object) -> None:
        real_init(self, *args)  # type: ignore[arg-type]
        opened.append(self)

    monkeypatch.setattr(LivenessLink, "__init__", init)
    yield
    for link in opened:
        link.close()


def settle(link: LivenessLink, want: str, within_s: float = 5.0) -> float:
    """Seconds until ``link.check()`` reads ``want`` (fails past ``within_s``)."""
    started = time.monotonic()
    while (state := link.check()) != want:
        assert time.monotonic() - started < within_s, (state, link.why)
        time.sleep(0.001)
    return time.monotonic() - started


def test_an_armed_link_reads_gone_when_the_listener_closes() -> None:
    token = secrets.token_bytes(32)
    listener = LivenessListener("127.0.0.1", token)
    link = LivenessLink(listener.address, token)
    settle(link, ARMED)
    assert link.check() == ARMED  # and stays so while the peer lives
    listener.close()
    assert settle(link, GONE) < 1.0
    assert "closed" in link.why and link.check() == GONE


CHILD = """
import secrets, sys, time
from parityserve.runtime.fleet.liveness import LivenessListener
listener = LivenessListener("127.0.0.1", bytes.fromhex(sys.argv[1]))
print(listener.address[1], flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_process_is_seen_gone_within_milliseconds(sig: int) -> None:
    token = secrets.token_bytes(32)
    child = subprocess.Popen([sys.executable, "-c", CHILD, token.hex()],
                             stdout=subprocess.PIPE, text=True)
    try:
        port = int(child.stdout.readline())  # type: ignore[union-attr]
        link = LivenessLink(("127.0.0.1", port), token)
        settle(link, ARMED)
        os.kill(child.pid, sig)
        assert settle(link, GONE) < 1.0  # the kernel's FIN, not a timeout
    finally:
        child.kill()
        child.wait()
        child.stdout.close()  # type: ignore[union-attr]


def test_a_stopped_process_is_not_gone_its_silence_is_for_the_heartbeats() -> None:
    token = secrets.token_bytes(32)
    child = subprocess.Popen([sys.executable, "-c", CHILD, token.hex()],
                             stdout=subprocess.PIPE, text=True)
    try:
        link = LivenessLink(("127.0.0.1", int(child.stdout.readline())), token)  # type: ignore
        settle(link, ARMED)
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(0.3)
        assert link.check() == ARMED  # a frozen machine sends no FIN: not this link's call
    finally:
        child.kill()
        child.wait()
        child.stdout.close()  # type: ignore[union-attr]


def test_a_refused_connection_is_unknown_never_gone() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    link = LivenessLink(("127.0.0.1", port), secrets.token_bytes(32))  # nobody listens
    time.sleep(0.05)
    for _ in range(5):
        assert link.check() == UNKNOWN
    assert "not armed" in link.why


def test_a_wrong_token_is_closed_and_the_link_stays_unknown() -> None:
    listener = LivenessListener("127.0.0.1", secrets.token_bytes(32))
    try:
        link = LivenessLink(listener.address, secrets.token_bytes(32))
        deadline = time.monotonic() + 2
        while link.why == "" and time.monotonic() < deadline:
            assert link.check() == UNKNOWN
            time.sleep(0.005)
        assert link.check() == UNKNOWN and "closed by the peer" in link.why
    finally:
        listener.close()


def test_silent_and_flooding_clients_cannot_keep_the_frontend_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(liveness, "TOKEN_WAIT_S", 0.2)
    token = secrets.token_bytes(32)
    listener = LivenessListener("127.0.0.1", token)
    squatters = [socket.create_connection(listener.address) for _ in range(100)]  # > pending cap
    try:
        link = LivenessLink(listener.address, token)
        settle(link, ARMED)  # served beside the squatters, not after them
        time.sleep(0.4)
        for s in squatters:  # each was closed: too slow with its token, or pushed out
            s.settimeout(1)
            assert s.recv(1) == b""
        assert link.check() == ARMED
    finally:
        for s in squatters:
            s.close()
        listener.close()


def test_a_token_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        LivenessListener("127.0.0.1", b"short")
