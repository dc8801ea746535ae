"""Batch isolation: find the rows a model raises on by splitting the batch, answer the rest.

Queries of different clients share a batch, and a model that raises fails the batch as a
whole, though usually one row is to blame: a value out of range, or rows of another width
that ``np.stack`` refuses in a model that declares no signature. Failing every query of the
batch would let one client's bad row fail its batch-mates. Instead the batch is split in two
and each half is tried again; a half that succeeds answers its queries, a half that fails is
split again, and a part of one row that fails gets the error as its own.

The bounds: a batch of ``n`` rows has ``levels_for(n)`` = ceil(log2 n) levels below it, a part
is tried once at its level and split only into the next one, so no row waits more than
ceil(log2 n) extra round trips and the model runs at most 2n - 1 parts in all. Only a batch the
model itself raised on is split (not outputs the frontend refused, nor a lost worker, which
are the replica's fault, not a row's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Bisection", "halves", "levels_for", "split_after_failure"]

_T = TypeVar("_T")


def levels_for(rows: int) -> int:
    """How many times a batch of ``rows`` can be halved before every part is one row."""
    return max(0, rows - 1).bit_length()


@dataclass(frozen=True, slots=True)
class Bisection:
    """Where a part stands: ``level`` halvings below the batch as it was formed, which
    allows ``levels`` in all."""

    level: int
    levels: int

    @classmethod
    def start(cls, rows: int) -> Bisection:
        """The batch as formed: level 0 of ``levels_for(rows)``."""
        return cls(0, levels_for(rows))

    def deeper(self) -> Bisection:
        return Bisection(self.level + 1, self.levels)


def split_after_failure(rows: int, raised: bool, at: Bisection | None) -> Bisection | None:
    """A part of ``rows`` unanswered rows failed: the level its two halves run at, or None
    when its rows fail now (one row left, the failure was not the model raising, or no level
    is left). ``at`` is where the part stands; None: a batch as formed."""
    if not raised or rows <= 1:
        return None
    here = at if at is not None else Bisection.start(rows)
    return here.deeper() if here.level < here.levels else None


def halves(items: Sequence[_T]) -> tuple[list[_T], list[_T]]:
    """The first ceil(n/2) items and the rest, in order (both non-empty for n >= 2)."""
    middle = (len(items) + 1) // 2
    return list(items[:middle]), list(items[middle:])
