"""The door's shape rule (core/hams/door.py): only what is declared, never what a client sent
first. A graph once learned its input shape from the first row it answered, so one request of
a shape its model also took (the LSTM's [2, 2]) locked every [4] row out until a restart."""

from __future__ import annotations

import pytest

from parityserve.core.hams.door import admits, door_shape
from parityserve.core.hams.topology import GraphError


@pytest.mark.parametrize(("declared", "entries", "door"), [
    (None, [], None),  # nothing declared: the door is open
    ((4,), [], (4,)),
    (None, [(-1, 4)], (-1, 4)),  # an entry model's signature, wildcards kept
    ((2, 4), [(-1, 4), (2, -1)], (2, 4)),
    (None, [(-1, 4), (3, -1)], (3, 4)),  # two entry models: what both take
])
def test_the_door_is_what_is_declared(declared: tuple[int, ...] | None,
                                      entries: list[tuple[int, ...]],
                                      door: tuple[int, ...] | None) -> None:
    assert door_shape(declared, entries) == door


@pytest.mark.parametrize(("declared", "entries"), [
    ((4,), [(2, 2)]), ((4,), [(5,)]), (None, [(4,), (-1, 4)]),
])
def test_declarations_no_row_could_meet_are_refused(declared: tuple[int, ...] | None,
                                                    entries: list[tuple[int, ...]]) -> None:
    with pytest.raises(GraphError, match="no row fits both"):
        door_shape(declared, entries)


@pytest.mark.parametrize(("shape", "door", "ok"), [
    ((4,), None, True), ((2, 2), None, True), ((), None, True),
    ((4,), (4,), True), ((2, 2), (4,), False), ((2,), (4,), False),
    ((7, 4), (-1, 4), True), ((7, 3), (-1, 4), False), ((4,), (-1, 4), False),
])
def test_a_row_passes_when_its_shape_matches_the_door(shape: tuple[int, ...],
                                                      door: tuple[int, ...] | None,
                                                      ok: bool) -> None:
    assert admits(shape, door) is ok
