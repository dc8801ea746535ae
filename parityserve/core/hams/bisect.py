"""Which rows of a failed batch fail it: split the batch and retry the halves (issue 38).

An operator that raises on a batch does not say which rows were at fault, and failing
the whole batch fails every batch-mate of one bad row. ``RowBisection`` plans the retries,
for any driver: the whole batch runs first; a part that fails is split in two and each
half runs again, until every row has either run in a part that succeeded or failed
alone. An error that names its rows (``culprits``, e.g. the new streams a full stream
table has no room for) skips the search: those rows fail and the rest runs again at once.

Parts run left before right, so the rows that succeed run in their batch order: a
stateful operator, whose state each part moves on, sees its rows in the order they were
numbered. A batch with k bad rows of n takes at most ``2n - 1`` runs, and about
``2k log2(n)`` when k is small. (The model path's ``core.isolation`` splits the same way
but runs the halves side by side through the scheduler; a stateful operator's cannot.)
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Generic, TypeVar

__all__ = ["Part", "RowBisection"]

E = TypeVar("E")
Part = tuple[int, ...]  # row indices into the batch, increasing


class RowBisection(Generic[E]):
    """Plans the runs that find a batch's bad rows; ``passed`` and ``failed`` report each."""

    def __init__(self, n: int) -> None:
        self._todo: list[Part] = [tuple(range(n))] if n else []  # a stack: next at the end
        self.ok: list[int] = []  # rows that ran in a part that succeeded, in run order
        self.errors: dict[int, E] = {}  # rows that failed alone (or were named), and why
        self.runs = 0

    def next_part(self) -> Part | None:
        """The part to run next; None once every row has its outcome."""
        return self._todo[-1] if self._todo else None

    def passed(self, part: Part) -> None:
        self._take(part)
        self.ok.extend(part)

    def failed(self, part: Part, error: E, culprits: Collection[int] = ()) -> None:
        """``part`` raised ``error``. ``culprits``: the rows (batch indices) the error names;
        honoured only when they are rows of this part, else the part is split."""
        self._take(part)
        named = [row for row in part if row in culprits]
        if named and len(set(culprits)) == len(named):
            for row in named:
                self.errors[row] = error
            rest = tuple(row for row in part if row not in culprits)
            if rest:
                self._todo.append(rest)
            return
        if len(part) == 1:
            self.errors[part[0]] = error
            return
        half = len(part) // 2
        self._todo += [part[half:], part[:half]]  # the left half runs first

    def _take(self, part: Part) -> None:
        if not self._todo or self._todo[-1] != part:
            raise ValueError(f"part {list(part)} is not the one to run next "
                             f"({list(self._todo[-1]) if self._todo else 'none left'})")
        self._todo.pop()
        self.runs += 1
