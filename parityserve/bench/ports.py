"""Ports for the servers that tests and benchmarks start on a number they must know first.

A port from ``bind(("127.0.0.1", 0))`` is the kernel's *ephemeral* range: the one it hands
to every outgoing connection. Between the probe closing it and the server under test binding
it (seconds: the server imports first), any connection on the host may be given that port,
and the server then exits with "address in use". One clean-clone CI run lost a whole module
of sharded-server tests to that race. A port below the ephemeral range is never handed out
that way, so the only thing that can take it is another listener, and the probe sees those.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port"]

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10_000  # above the well-known and most registered service ports
_TRIES = 200


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, outside the ephemeral range where the host has one."""
    first_ephemeral = _first_ephemeral_port()
    if first_ephemeral is None or first_ephemeral - _LOWEST < 1_000:
        return _kernel_port(host)
    return _pick(host, _LOWEST, first_ephemeral)


def _pick(host: str, low: int, high: int) -> int:
    """A random port in [low, high) that ``host`` can bind now."""
    pick = random.Random()
    for _ in range(_TRIES):
        port = pick.randrange(low, high)
        if _bindable(host, port):
            return port
    raise RuntimeError(f"no free port in {low}-{high - 1} after {_TRIES} tries")


def _first_ephemeral_port() -> int | None:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
        return True


def _kernel_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])
