"""Typed records for what the frontend tells a worker outside the predict path.

Their wire form is the header ``runtime/workers/worker.py`` reads; building it lives here, once, so
the supervisor and the admin operations never spell a header by hand. (Predict requests are built
by the dispatcher.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from parityserve.runtime.workers import wire

__all__ = ["Command", "SetFaults", "SetThreads", "Stop"]


@dataclass(frozen=True, slots=True)
class Stop:
    """Finish and exit; ``error`` says why a worker was turned away (None: a normal stop)."""

    error: str | None = None

    def header(self) -> dict[str, Any]:
        return {"t": wire.STOP} if self.error is None else {"t": wire.STOP, "error": self.error}


@dataclass(frozen=True, slots=True)
class SetFaults:
    """Replace the worker's fault plan; an empty spec injects nothing."""

    spec: dict[str, Any] = field(default_factory=dict)

    def header(self) -> dict[str, Any]:
        return {"t": wire.FAULT, "spec": self.spec}


@dataclass(frozen=True, slots=True)
class SetThreads:
    """Run later batches with ``n`` intra-op threads; the worker's heartbeats then say so."""

    n: int

    def header(self) -> dict[str, Any]:
        return {"t": wire.THREADS, "n": self.n}


Command = Stop | SetFaults | SetThreads
