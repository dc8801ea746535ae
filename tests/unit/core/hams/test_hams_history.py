"""The durable history rebuilt from client replies (``core.hams.history``): whole batches in
one gapless run, or an error naming what breaks it."""

from __future__ import annotations

import pytest

from parityserve.core.hams import AuditRow, HistoryBatch, HistoryError, durable_batches


def rows_of(*batches: tuple[int, int, int]) -> list[AuditRow]:
    """Every row of each (first seq, size, seed) batch, as the replies would report them."""
    return [AuditRow(first + i, i, size, seed) for first, size, seed in batches
            for i in range(size)]


def test_rows_in_any_order_give_the_batches_in_execution_order() -> None:
    rows = rows_of((1, 3, 70), (4, 1, 71), (5, 2, 72))
    got = durable_batches(reversed(rows))
    assert got == [HistoryBatch(1, 3, 70), HistoryBatch(4, 1, 71), HistoryBatch(5, 2, 72)]
    assert list(got[0].seqs) == [1, 2, 3]


def test_no_replies_is_an_empty_history_and_a_repeated_reply_is_harmless() -> None:
    assert durable_batches([]) == []
    rows = rows_of((1, 2, 5))
    assert durable_batches(rows + rows[:1]) == [HistoryBatch(1, 2, 5)]


def test_a_history_may_start_after_a_known_point() -> None:
    assert durable_batches(rows_of((11, 2, 5)), after=10) == [HistoryBatch(11, 2, 5)]


@pytest.mark.parametrize(("rows", "match"), [
    (rows_of((1, 2, 5), (4, 1, 6)), r"seqs 3\.\.3 are in no reply: a gap"),
    (rows_of((2, 2, 5)), r"seqs 1\.\.1 are in no reply"),
    (rows_of((1, 3, 5))[:2], r"batch at seq 1 of 3 rows lacks rows \[2\] \(seqs \[3\]\)"),
    (rows_of((1, 2, 5))[:1] + rows_of((1, 2, 9))[1:],
     r"batch at seq 1 was reported with different sizes or seeds \[\(2, 5\), \(2, 9\)\]"),
    (rows_of((1, 2, 5)) + [AuditRow(2, 0, 1, 8)], r"seq 2 was reported twice, differently"),
    ([AuditRow(3, 3, 3, 1)], r"seq 3: row 3 of a batch of 3"),
    ([AuditRow(1, 1, 2, 1)], r"would start at 0, outside the history"),
])
def test_what_is_not_one_run_of_whole_batches_is_named(rows: list[AuditRow], match: str
                                                       ) -> None:
    with pytest.raises(HistoryError, match=match):
        durable_batches(rows)


def test_a_re_execution_seen_beside_the_first_is_caught() -> None:
    """Checkpoint-replay's case: the batch at 3 ran twice (new seed) and a client saw a row
    of each run."""
    first, again = rows_of((3, 2, 40)), rows_of((3, 2, 41))
    with pytest.raises(HistoryError, match="two executions"):
        durable_batches(rows_of((1, 2, 7)) + [first[0], again[1]])
