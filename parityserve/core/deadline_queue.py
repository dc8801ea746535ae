"""A bounded, deadline-ordered queue of pending queries (earliest deadline first).

Serving by earliest deadline lets the batcher spend a replica on queries that can still be
answered on time, and drop the ones that cannot instead of wasting a batch slot on them
(the application answers those with its default output). Ties go first-in, first-out by a
sequence number, which also makes ordering total and deterministic.

``try_put`` is the non-waiting call and raises ``QueueFull``; a waiting put, if any, is
built on it by the runtime. ``requeue`` ignores the capacity on purpose: work re-dispatched
after a worker crash was already accepted, and every accepted query must get an answer.

Cancellation is lazy: a removed entry stays in the heaps and is skipped when it surfaces,
and the heaps are rebuilt once dead entries outnumber live ones, so every operation stays
O(log n) amortised and memory stays O(live entries).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Generic, TypeVar

from parityserve.errors import ConfigError, QueueFull

__all__ = ["DeadlineQueue", "Entry", "QueueStats"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True, eq=False)
class Entry(Generic[T]):
    """One queued item. Identity, not value, tells entries apart (``eq=False``)."""

    item: T
    deadline: float
    enqueued_at: float
    seq: int


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A snapshot of a ``DeadlineQueue``.

    Every entry ever put or requeued is accounted for exactly once:
    ``enqueued + requeued == depth + dispatched + expired + cancelled``.
    """

    depth: int
    capacity: int
    enqueued: int
    dispatched: int
    expired: int
    rejected: int
    requeued: int
    cancelled: int = 0


# Heap rows carry (key, seq, entry); seq is unique, so comparison never reaches the entry.
_Row = tuple[float, int, Entry[T]]


class DeadlineQueue(Generic[T]):
    """Earliest-deadline-first queue with a capacity, expiry and cancellation."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ConfigError(f"queue capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        self._live: dict[int, Entry[T]] = {}
        self._by_deadline: list[_Row[T]] = []
        self._by_arrival: list[_Row[T]] = []
        self._next_seq = 0
        self._counts = {k: 0 for k in ("enqueued", "dispatched", "expired", "rejected")}
        self._counts.update(requeued=0, cancelled=0)

    def try_put(self, item: T, *, deadline: float, enqueued_at: float) -> Entry[T]:
        """Queue an item, or raise ``QueueFull`` at capacity (nothing is changed then)."""
        if len(self._live) >= self._capacity:
            self._counts["rejected"] += 1
            raise QueueFull(f"queue is at its capacity of {self._capacity} entries")
        entry = Entry(item, deadline, enqueued_at, self._next_seq)
        self._next_seq += 1
        self._push(entry)
        self._counts["enqueued"] += 1
        return entry

    def requeue(self, entry: Entry[T]) -> None:
        """Put a popped entry back where it was in the order, even beyond capacity."""
        if entry.seq in self._live:
            raise ValueError(f"entry {entry.seq} is already queued")
        # Keep fresh sequence numbers above every requeued one so FIFO ties stay FIFO.
        self._next_seq = max(self._next_seq, entry.seq + 1)
        self._push(entry)
        self._counts["requeued"] += 1

    def pop_batch(self, now: float, max_size: int) -> tuple[list[Entry[T]], list[Entry[T]]]:
        """Take up to ``max_size`` unexpired entries, earliest deadline first.

        Returns ``(batch, expired)``: the expired entries (``deadline <= now``) are dropped
        on the way. In deadline order they all come before any live one, so after this call
        no expired entry remains in the queue.
        """
        if max_size < 0:
            raise ValueError(f"max_size must be >= 0, got {max_size}")
        expired = self.drop_expired(now)
        batch = [self._pop_head() for _ in range(min(max_size, len(self._live)))]
        self._counts["dispatched"] += len(batch)
        return batch, expired

    def drop_expired(self, now: float) -> list[Entry[T]]:
        """Remove and return every entry whose deadline is ``<= now``."""
        expired: list[Entry[T]] = []
        while (head := self._head(self._by_deadline)) is not None and head.deadline <= now:
            expired.append(self._pop_head())
        self._counts["expired"] += len(expired)
        return expired

    def remove(self, entry: Entry[T]) -> bool:
        """Cancel a queued entry; False if it is no longer queued."""
        if self._live.get(entry.seq) is not entry:
            return False
        del self._live[entry.seq]
        self._counts["cancelled"] += 1
        self._maybe_compact()
        return True

    def oldest_enqueued_at(self) -> float | None:
        head = self._head(self._by_arrival)
        return None if head is None else head.enqueued_at

    def earliest_deadline(self) -> float | None:
        head = self._head(self._by_deadline)
        return None if head is None else head.deadline

    def __len__(self) -> int:
        return len(self._live)

    def statistics(self) -> QueueStats:
        return QueueStats(depth=len(self._live), capacity=self._capacity, **self._counts)

    def _push(self, entry: Entry[T]) -> None:
        self._live[entry.seq] = entry
        heapq.heappush(self._by_deadline, (entry.deadline, entry.seq, entry))
        heapq.heappush(self._by_arrival, (entry.enqueued_at, entry.seq, entry))

    def _pop_head(self) -> Entry[T]:
        """Remove the live entry with the earliest deadline (the caller checked there is one)."""
        entry = heapq.heappop(self._by_deadline)[2]
        while self._live.get(entry.seq) is not entry:
            entry = heapq.heappop(self._by_deadline)[2]
        del self._live[entry.seq]
        self._maybe_compact()
        return entry

    def _head(self, heap: list[_Row[T]]) -> Entry[T] | None:
        """The first live entry of a heap, discarding dead rows above it."""
        while heap and self._live.get(heap[0][1]) is not heap[0][2]:
            heapq.heappop(heap)
        return heap[0][2] if heap else None

    def _maybe_compact(self) -> None:
        # Dead rows linger in a heap until they surface; rebuild when they dominate so
        # memory stays proportional to the live entries (O(n), amortised over n removals).
        if len(self._by_arrival) + len(self._by_deadline) <= 4 * len(self._live) + 64:
            return
        self._by_deadline = [r for r in self._by_deadline if self._live.get(r[1]) is r[2]]
        self._by_arrival = [r for r in self._by_arrival if self._live.get(r[1]) is r[2]]
        heapq.heapify(self._by_deadline)
        heapq.heapify(self._by_arrival)
