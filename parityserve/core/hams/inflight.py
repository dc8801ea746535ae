"""One graph operator's batches in flight, their deadlines and its progress (issue 38,
item 2): what the watchdog fails and what readiness reads.

A batch put in flight must come back (outputs, or an error) or be failed: one that never
does holds an operator slot for good, and the operator's queue behind it waits forever.
``InFlight`` keeps each batch with the time it left; ``expired`` hands back those out
longer than the limit, to be failed and counted. It also keeps when the operator last made
progress (a batch came back, or it had nothing to do), and ``stalled`` says that it has
had work for longer than the limit without finishing any: the graph is not ready then.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sized
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["InFlight", "InFlightStats"]

B = TypeVar("B")

RTT_WINDOW = 32  # the batches whose round trips say how long an answer takes now


@dataclass(frozen=True)
class InFlightStats:
    inflight: int
    oldest_s: float  # how long the oldest batch in flight has been out (0: none)
    idle_s: float  # since the operator last finished a batch or had nothing to do
    expired: int  # batches failed by the watchdog, ever
    sent: int = 0  # batches put in flight, ever
    rows: int = 0  # their rows: rows / sent is the operator's mean batch


class InFlight(Generic[B]):
    def __init__(self, now: float) -> None:
        self._out: dict[int, tuple[float, B]] = {}  # bid -> (sent at, batch), oldest first
        self._progress = now
        self._failing = False  # a batch expired since the last progress
        self.expired_total = 0
        self.sent_total = 0
        self.rows_total = 0
        self._rtts: deque[float] = deque(maxlen=RTT_WINDOW)  # sent -> came back, newest last

    def __len__(self) -> int:
        return len(self._out)

    def __contains__(self, bid: int) -> bool:
        return bid in self._out

    def add(self, bid: int, batch: B, now: float) -> None:
        if not self._out and not self._failing:  # idle until now: the wait starts here
            self._progress = max(self._progress, now)
        self._out[bid] = (now, batch)
        self.sent_total += 1
        self.rows_total += len(batch) if isinstance(batch, Sized) else 1

    def pop(self, bid: int, now: float) -> B | None:
        """The batch came back (or failed): progress. None if it is not in flight."""
        found = self._out.pop(bid, None)
        if found is None:
            return None
        self._progress, self._failing = now, False
        self._rtts.append(now - found[0])
        return found[1]

    def oldest_sent(self) -> float | None:
        """When the oldest batch in flight left (None: none is out)."""
        return min((sent for sent, _ in self._out.values()), default=None)

    def slowest_recent(self) -> float | None:
        """The longest round trip of the last ``RTT_WINDOW`` batches (None: none came back
        yet): what the data-path failure detector scales its limit by."""
        return max(self._rtts, default=None)

    def clear(self) -> list[B]:
        """A failover took the batches over (they run again under its plan). The round trips
        go too: they were the old primary's, and a new one's first batch runs cold."""
        batches = [batch for _, batch in self._out.values()]
        self._out.clear()
        self._rtts.clear()
        return batches

    def expired(self, now: float, limit_s: float) -> list[tuple[int, B]]:
        """Remove and return the batches out for longer than ``limit_s``, oldest first. An
        expiry is not progress: a hung operator given more work stays stalled."""
        late = [bid for bid, (sent, _) in self._out.items() if now - sent > limit_s]
        self.expired_total += len(late)
        self._failing = self._failing or bool(late)
        return [(bid, self._out.pop(bid)[1]) for bid in late]

    def idle(self, now: float) -> None:
        """Nothing queued and nothing in flight: the operator is not behind."""
        if not self._out:
            self._progress, self._failing = now, False

    def stalled(self, now: float, limit_s: float, queued: int = 0) -> bool:
        """Work (in flight, or ``queued`` for the operator) and no batch finished for longer
        than ``limit_s``. The caller says ``idle`` whenever it has no work at all."""
        return bool(self._out or queued) and now - self._progress > limit_s

    def statistics(self, now: float) -> InFlightStats:
        oldest = min((sent for sent, _ in self._out.values()), default=now)
        return InFlightStats(len(self._out), now - oldest, now - self._progress,
                             self.expired_total, self.sent_total, self.rows_total)
