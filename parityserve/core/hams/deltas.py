"""Which part of a state the primary ships: the full state, or only the rows changed since
the previous copy (a declared delta; issue 39, case 6, beyond the paper).

A per-stream operator (``StreamLSTM``) writes a few rows of its slot table per batch: a
batch of 64 streams changes 64 of 1,024 rows, and copying and sending the whole table
after every batch is most of what ``hams`` adds to such a graph. An operator *declares*
what a batch wrote (rows along the first dimension of named tensors); the primary unions
those rows until its next copy, which then holds only them, read from the state at rest.

``DeltaLedger`` decides, per copy, full or delta. The full state goes:

* when any batch since the last copy wrote without saying where (an operator that
  declares nothing always ships full states);
* every ``full_every`` batches (a full state resets a backup that missed a link);
* when the rows changed are half the table or more (a full copy is then as cheap);
* after ``need_full`` (the backup reported a delta it could not place).

A delta's ``base`` is the copy before it: the backup applies it only onto exactly that
state (``BackupApplier``'s chain rule), so a delta is never applied out of order or onto
a gap. Pure: the worker holds it under the same lock as its copies.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["DeltaLedger", "Shipment"]


@dataclass(frozen=True)
class Shipment:
    """What the copy after request ``seq`` holds: the full state (``rows`` None), or rows
    ``rows`` of ``tensors`` as they are after ``seq``, to apply onto the state after
    ``base``."""

    seq: int
    base: int | None = None
    rows: tuple[int, ...] | None = None
    tensors: tuple[str, ...] = ()

    @property
    def full(self) -> bool:
        return self.rows is None


class DeltaLedger:
    """The primary's record of what changed since its last copy (one per primary)."""

    def __init__(self, table_rows: int, full_every: int, start_seq: int = 0) -> None:
        """``table_rows``: the first dimension of the row-indexed tensors (0: the operator
        declares nothing, every copy is full); ``full_every``: batches between full copies
        (1: every copy is full)."""
        if full_every < 1:
            raise ValueError(f"full_every must be >= 1, got {full_every}")
        self.table_rows, self.full_every = table_rows, full_every
        self._last = start_seq  # the copy a delta taken now would apply onto
        self._rows: set[int] | None = set()  # None: unknown, the next copy is full
        self._tensors: set[str] = set()
        self._since_full = 0  # batches since the last full copy
        self.fulls = self.deltas = 0

    def wrote(self, rows: Iterable[int] | None, tensors: Iterable[str] = ()) -> None:
        """A batch's update wrote these rows of these tensors and nothing else; ``None``: it
        did not say (anything may have changed)."""
        self._since_full += 1
        if rows is None or self._rows is None or not self.table_rows:
            self._rows = None
            return
        self._rows.update(rows)
        self._tensors.update(tensors)

    def take(self, seq: int) -> Shipment:
        """The copy after ``seq`` is taken now: what it holds. Starts a new record."""
        rows = self._rows
        full = rows is None or self._since_full >= self.full_every \
            or 2 * len(rows) >= self.table_rows
        shipment = Shipment(seq) if full else Shipment(
            seq, self._last, tuple(sorted(rows or ())), tuple(sorted(self._tensors)))
        if full:
            self._since_full, self.fulls = 0, self.fulls + 1
        else:
            self.deltas += 1
        self._last, self._rows, self._tensors = seq, set(), set()
        return shipment

    def need_full(self) -> None:
        """The backup could not place a delta (it lacks its base): the next copy is full."""
        self._rows = None

    def restart(self, seq: int) -> None:
        """The live state is now the copy after ``seq`` that the peer holds in full (a
        roll-back to the retained copy): the next delta applies onto it."""
        self._last, self._rows, self._tensors = seq, set(), set()
