"""Fakes for the serving-path unit tests: a clock that moves only when told, and a link that
records what would go to workers (``test_dispatch.py``, ``test_redundancy_dispatch.py``)."""

from __future__ import annotations

from typing import Any

from parityserve.errors import WorkerError
from parityserve.runtime.workers import wire

T0 = 1000.0


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeLink:
    """Records every message; replicas named in ``broken`` raise WorkerError like a gone peer."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any], list[Any]]] = []
        self.broken: set[str] = set()

    def send(self, replica_id: str, header: dict[str, Any],
             buffers: list[Any] | None = None) -> None:
        if replica_id in self.broken:
            raise WorkerError(f"cannot reach replica {replica_id}")
        # Copy the frames, as a real socket would: later changes must not leak into them.
        self.sent.append((replica_id, header, [bytes(b) for b in buffers or []]))

    def predicts(self, rid: str | None = None) -> list[dict[str, Any]]:
        return [h for r, h, _ in self.sent if h["t"] == wire.PREDICT and rid in (None, r)]

    def rids(self) -> list[str]:
        return [rid for rid, _, _ in self.sent]

    def batch(self, index: int) -> Any:
        _, header, frames = self.sent[index]
        return wire.unpack_payload(header["in"], frames)

