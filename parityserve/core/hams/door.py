"""A graph's door: the row shape it refuses before any batch, from declarations only.

The rule is never learned from traffic. A graph that took the shape of the first row it
answered let one client choose it: a [2, 2] row, which the LSTM also takes (four values),
locked every [4] row out until a restart (issue 38, attacker review). What may be declared:
the graph's own ``input_shape`` and its entry operators' models' input signatures (-1: any
size). With neither, the door is open and each row stands or falls alone: rows of two
shapes never share a batch, and a batch a model raised on is searched for its bad rows.

The door also remembers a stateful operator's "no room for a new stream, retry after t"
(``StreamGate``): until then a row of a stream the operator has not taken is refused here,
with the same 429, instead of crossing every operator before it first. That refusal once
cost a 1,024-row request about 55 ms of the frontend's CPU and every batch ahead of the
operator, every two seconds, for an answer known in advance.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from parityserve.core.hams.topology import GraphError

__all__ = ["Closed", "Shape", "StreamGate", "admits", "door_shape"]

Shape = tuple[int, ...]


def door_shape(declared: Shape | None, entries: Iterable[Shape]) -> Shape | None:
    """The one pattern every row must match (-1: any size), or None: nothing declared.

    ``declared`` is the graph's own, ``entries`` its entry models' signatures; every row goes
    to each entry operator, so it must fit them all. GraphError when no row could."""
    door = declared
    for shape in entries:
        door = shape if door is None else _both(door, shape)
    return door


def _both(a: Shape, b: Shape) -> Shape:
    if len(a) != len(b) or any(x != y and -1 not in (x, y) for x, y in zip(a, b, strict=True)):
        raise GraphError(f"input shapes {list(a)} and {list(b)} disagree: no row fits both")
    return tuple(y if x == -1 else x for x, y in zip(a, b, strict=True))


def admits(shape: Shape, door: Shape | None) -> bool:
    """Whether a row of ``shape`` passes: ranks agree and every sized dimension is equal."""
    return door is None or len(shape) == len(door) and all(
        d == -1 or s == d for s, d in zip(shape, door, strict=True))


@dataclass(frozen=True)
class Closed:
    """Why a row is refused at the door: ``op`` takes no new stream for ``retry_after_s``
    more (``reason``: its own words when it refused one), and ``row``'s stream is not one it
    holds."""

    op: str
    row: int
    stream: str
    retry_after_s: float
    reason: str


class StreamGate:
    """Per stateful operator: until when it refuses new streams, and the streams it took.

    The operator stays the judge; the gate only repeats its last answer while that answer
    cannot have changed: a full stream table frees a slot only when a stream goes idle, and
    the operator's ``retry_after_s`` is when the first one does. A stream is "taken" once the
    operator answered one of its rows. ``capacity`` bounds each operator's memory of taken
    streams (least recently used forgotten first); it must exceed the operator's table, or
    a stream the table still holds could be refused here until the retry time passes."""

    def __init__(self, ops: Iterable[str], capacity: int = 65_536) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._until: dict[str, float] = {}
        self._reason: dict[str, str] = {}
        self._taken: dict[str, OrderedDict[str, None]] = {op: OrderedDict() for op in ops}

    def refused(self, op: str, now: float, retry_after_s: float, reason: str = "") -> None:
        """``op`` refused a new stream, said why (no client's stream key in it) and when
        to retry."""
        if op in self._taken and retry_after_s > 0:
            self._until[op] = max(self._until.get(op, 0.0), now + retry_after_s)
            self._reason[op] = reason

    def took(self, op: str, stream: str) -> None:
        """``op`` answered a row of ``stream``: the stream holds a slot there."""
        taken = self._taken.get(op)
        if taken is None or not stream:
            return
        taken[stream] = None
        taken.move_to_end(stream)
        if len(taken) > self.capacity:
            taken.popitem(last=False)

    def closed(self, streams: Sequence[str], now: float) -> Closed | None:
        """The first row an operator would refuse now for want of room, or None. Rows with
        no stream, and streams an operator already holds, always pass."""
        for op, until in list(self._until.items()):
            if until <= now:  # the table may have room again: the operator decides
                del self._until[op]
                continue
            taken = self._taken[op]
            for row, stream in enumerate(streams):
                if stream and stream not in taken:
                    return Closed(op, row, stream, until - now, self._reason.get(op, ""))
        return None

    def closing(self) -> dict[str, float]:
        """Each operator refusing new streams, and until when (for /admin/state)."""
        return dict(self._until)
