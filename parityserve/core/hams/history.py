"""The durable history of one stateful operator, rebuilt from what clients saw.

Output commit lets a reply leave only once the state after its batch is durable, and a
promoted backup re-executes everything past its state under new numbers; so the replies
clients got describe exactly the batches the surviving state went through. With audit on,
each reply names its row's place in its batch, the batch's size and its noise seed, and
carries the operator's sequence number; the router numbers a batch's rows contiguously in
execution order (``RequestManager.form_batch``), so the batch began at ``seq - row``.

``durable_batches`` groups the rows back into batches and checks they form one gapless
run from the first request: anything else (one number reported twice differently, two
rows of one batch disagreeing, a row missing, a gap) means the history cannot be
replayed, and says why.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["AuditRow", "HistoryBatch", "HistoryError", "durable_batches"]


class HistoryError(ValueError):
    """The replies do not describe one run of whole batches: replies were lost, or two
    executions of one batch were both seen."""


@dataclass(frozen=True)
class AuditRow:
    """What one reply says about its row at the operator."""

    seq: int  # the operator's sequence number for the row (the reply's ``seqs[op]``)
    row: int  # its place in the batch the operator ran
    size: int  # that batch's size
    seed: int  # that batch's noise seed

    @property
    def first(self) -> int:
        return self.seq - self.row


@dataclass(frozen=True)
class HistoryBatch:
    first: int
    size: int
    seed: int

    @property
    def seqs(self) -> range:
        return range(self.first, self.first + self.size)


def durable_batches(rows: Iterable[AuditRow], after: int = 0) -> list[HistoryBatch]:
    """The batches, in execution order, covering every number from ``after + 1`` on. Raises
    ``HistoryError`` naming the first thing that is not one gapless run of whole batches."""
    groups: dict[int, dict[int, AuditRow]] = {}
    for r in _distinct(rows):
        if not 0 <= r.row < r.size or r.first <= after:
            raise HistoryError(f"seq {r.seq}: row {r.row} of a batch of {r.size} would start "
                               f"at {r.first}, outside the history (after {after})")
        groups.setdefault(r.first, {})[r.row] = r
    batches = [_batch(first, groups[first]) for first in sorted(groups)]
    _check_contiguous(batches, after)
    return batches


def _distinct(rows: Iterable[AuditRow]) -> list[AuditRow]:
    """One row per number; the same reply twice is harmless, two different ones are not."""
    seen: dict[int, AuditRow] = {}
    for r in rows:
        if seen.setdefault(r.seq, r) != r:
            raise HistoryError(f"seq {r.seq} was reported twice, differently: {seen[r.seq]} "
                               f"and {r}")
    return list(seen.values())


def _batch(first: int, rows: dict[int, AuditRow]) -> HistoryBatch:
    kinds = {(r.size, r.seed) for r in rows.values()}
    if len(kinds) > 1:
        raise HistoryError(f"the batch at seq {first} was reported with different sizes or "
                           f"seeds {sorted(kinds)}: rows of two executions were both seen")
    size, seed = kinds.pop()
    missing = sorted(set(range(size)) - set(rows))
    if missing:
        raise HistoryError(f"the batch at seq {first} of {size} rows lacks rows {missing} "
                           f"(seqs {[first + m for m in missing]}): their replies were lost")
    return HistoryBatch(first, size, seed)


def _check_contiguous(batches: list[HistoryBatch], after: int) -> None:
    """Only gaps are left to find: batches are whole by now and each number has one row, so
    two batches cannot overlap."""
    expected = after + 1
    for batch in batches:
        if batch.first != expected:
            raise HistoryError(f"seqs {expected}..{batch.first - 1} are in no reply: a gap "
                               "in the history")
        expected = batch.first + batch.size
