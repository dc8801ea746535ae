"""What the scheduler asks its driver to do: typed records, in the order they must happen.

The asyncio driver (``runtime/modelpath/dispatch.py``) turns them into socket sends, resolved
futures, metrics and one loop timer; the simulator (``core/simulate.py``) into heap events and
counts. A driver decides nothing: everything here has already been decided.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from parityserve.core.deadline_queue import Entry
from parityserve.core.scheduling.records import InflightBatch, Query

__all__ = ["Abort", "Action", "Answer", "CodingFailed", "Expire", "Fail", "Late", "Located",
           "Redundant", "Send", "WakeAt"]


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``batch.task``'s payload to ``batch.replica`` under ``batch.bid``. If the replica
    cannot be reached, tell the scheduler (``Scheduler.send_failed``)."""

    batch: InflightBatch


@dataclass(frozen=True, slots=True)
class Answer:
    """Answer these queries with these outputs, row for row: the model's own prediction
    (``method`` None) or a rebuilt one (``method`` says how: ``parm-subtraction``...)."""

    entries: Sequence[Entry[Query]]
    outputs: Sequence[Any]
    method: str | None = None


@dataclass(frozen=True, slots=True)
class Late:
    """The model's own outputs for queries already answered by decoding (worth caching)."""

    entries: Sequence[Entry[Query]]
    outputs: Sequence[Any]


@dataclass(frozen=True, slots=True)
class Expire:
    """These queries were not computed (deadline passed, or cannot finish by it): their
    application answers its default output, for ``reason``."""

    entries: Sequence[Entry[Query]]
    reason: str


@dataclass(frozen=True, slots=True)
class Fail:
    """Computing these queries failed, and nothing left can answer them. ``bad_input``: one
    query, alone, on which the model raised a ValueError or TypeError: its input's problem."""

    entries: Sequence[Entry[Query]]
    error: str
    bad_input: bool = False


@dataclass(frozen=True, slots=True)
class Abort:
    """The path is shutting down: these queries get no answer but this error."""

    entries: Sequence[Entry[Query]]
    reason: str


@dataclass(frozen=True, slots=True)
class WakeAt:
    """Call ``Scheduler.tick`` at ``when`` (replaces any later wake-up asked before)."""

    when: float


@dataclass(frozen=True, slots=True)
class Redundant:
    """A redundant task was queued: ``copy``, ``reissue``, ``parity`` or ``coded``."""

    kind: str


@dataclass(frozen=True, slots=True)
class Located:
    """The error locator excluded a result of replica ``rid`` (a Byzantine answer)."""

    rid: str


@dataclass(frozen=True, slots=True)
class CodingFailed:
    """A group could not be encoded or decoded; its queries are served another way."""

    message: str


Action = Send | Answer | Late | Expire | Fail | Abort | WakeAt | Redundant | Located | CodingFailed
