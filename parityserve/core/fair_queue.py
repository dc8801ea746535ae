"""A queue that shares its head fairly between origins (round-robin, one item per turn).

Why not a FIFO: a batch former that takes its queue in arrival order lets one request of
1,024 rows put every later request behind all of its rows; a well-behaved single-row query
then waits for sixteen batches it has no part in. Here each origin (one client request) has
its own FIFO lane and batches are filled one item per lane per turn, so a query waits for at
most one item of each other request per batch, whatever their sizes. Order within an origin
is kept; order between origins was never promised (they were concurrent).

Items with no origin share one lane, so a queue fed without origins is a plain FIFO.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Generic, TypeVar

__all__ = ["FairQueue"]

T = TypeVar("T")


class FairQueue(Generic[T]):
    def __init__(self, items: Iterable[tuple[Hashable, T]] = ()) -> None:
        self._lanes: dict[Hashable, deque[T]] = {}
        self._ring: deque[Hashable] = deque()  # origins with items, next turn first
        self._size = 0
        for origin, item in items:
            self.append(origin, item)

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[T]:
        """Every item, lane by lane in turn order (within a lane, in arrival order)."""
        for origin in self._ring:
            yield from self._lanes[origin]

    def lanes(self) -> int:
        return len(self._ring)

    def append(self, origin: Hashable, item: T) -> None:
        lane = self._lanes.get(origin)
        if lane is None:
            lane = self._lanes[origin] = deque()
            self._ring.append(origin)
        lane.append(item)
        self._size += 1

    def take(self, limit: int, kind: Callable[[T], Hashable] | None = None) -> list[T]:
        """Up to ``limit`` items, one per lane per turn. With ``kind``, only items of the
        first taken item's kind: a lane whose head is of another kind sits this batch out
        (its turn moves back), so one origin's odd item never cuts everyone's batch short."""
        taken: list[T] = []
        first: Hashable = None
        passed = 0  # lanes skipped in a row: a whole ring of them means nothing fits
        while self._ring and len(taken) < limit and passed < len(self._ring):
            origin = self._ring[0]
            lane = self._lanes[origin]
            if kind is not None and taken and kind(lane[0]) != first:
                self._ring.rotate(-1)
                passed += 1
                continue
            item = lane.popleft()
            if kind is not None and not taken:
                first = kind(item)
            taken.append(item)
            passed = 0
            self._size -= 1
            self._ring.popleft()
            if lane:
                self._ring.append(origin)
            else:
                del self._lanes[origin]
        return taken

    def remove(self, drop: Callable[[T], bool]) -> list[T]:
        """Take out every item ``drop`` selects; the others keep their lanes and turns."""
        removed: list[T] = []
        for origin in list(self._ring):
            lane = self._lanes[origin]
            kept: deque[T] = deque()
            for item in lane:
                (removed if drop(item) else kept).append(item)
            if len(kept) == len(lane):
                continue
            if kept:
                self._lanes[origin] = kept
            else:
                del self._lanes[origin]
                self._ring.remove(origin)
        self._size -= len(removed)
        return removed
