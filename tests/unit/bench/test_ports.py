"""parityserve.bench.ports: the ports servers are started on stay out of the ephemeral range."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from parityserve.bench import ports


def test_a_free_port_is_bindable_and_below_the_ephemeral_range() -> None:
    first = ports._first_ephemeral_port()
    port = ports.free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
    if first is not None and first - ports._LOWEST >= 1_000:
        assert ports._LOWEST <= port < first


def test_a_port_with_a_listener_is_never_offered(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", ports.free_port()))
        taken.listen()
        held = taken.getsockname()[1]
        monkeypatch.setattr(ports, "_TRIES", 5)
        with pytest.raises(RuntimeError, match="no free port"):  # a range of one, taken
            ports._pick("127.0.0.1", held, held + 1)


def test_without_a_readable_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    monkeypatch.setattr(ports, "_EPHEMERAL_RANGE", tmp_path / "absent")
    assert ports._first_ephemeral_port() is None
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports.free_port()))
