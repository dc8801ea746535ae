"""A graph's door: the row shape it refuses before any batch, from declarations only.

The rule is never learned from traffic. A graph that took the shape of the first row it
answered let one client choose it: a [2, 2] row, which the LSTM also takes (four values),
locked every [4] row out until a restart (issue 38, attacker review). What may be declared:
the graph's own ``input_shape`` and its entry operators' models' input signatures (-1: any
size). With neither, the door is open and each row stands or falls alone: rows of two
shapes never share a batch, and a batch a model raised on is searched for its bad rows.
"""

from __future__ import annotations

from collections.abc import Iterable

from parityserve.core.hams.topology import GraphError

__all__ = ["Shape", "admits", "door_shape"]

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
