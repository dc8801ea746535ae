"""Batch isolation's pure rule (core/isolation.py): split a failed batch into halves, level by
level, until every failing part is one row. A model stand-in raises on any part holding a bad
row; hypothesis checks every good row is answered exactly once and every bad row gets its own
error, within the bounds the module promises."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parityserve.core.isolation import Bisection, halves, levels_for, split_after_failure


@pytest.mark.parametrize(("rows", "levels"), [(0, 0), (1, 0), (2, 1), (3, 2), (4, 2), (5, 3),
                                             (8, 3), (9, 4), (64, 6), (65, 7)])
def test_levels_are_ceil_log2(rows: int, levels: int) -> None:
    assert levels_for(rows) == levels


@pytest.mark.parametrize(("rows", "raised", "at", "expected"), [
    (8, True, None, Bisection(1, 3)),        # a batch as formed: its halves are level 1
    (4, True, Bisection(1, 3), Bisection(2, 3)),
    (2, True, Bisection(2, 3), Bisection(3, 3)),
    (1, True, Bisection(3, 3), None),        # one row: its error is its own
    (1, True, None, None),
    (8, False, None, None),                  # not the model raising: nothing to find
    (2, True, Bisection(3, 3), None),        # no level left (rows answered meanwhile can't
])                                           # make a part larger, but the bound holds anyway)
def test_split_after_failure(rows, raised, at, expected) -> None:
    assert split_after_failure(rows, raised, at) == expected


def test_halves_keep_order_and_every_item() -> None:
    assert halves([1, 2, 3, 4, 5]) == ([1, 2, 3], [4, 5])
    assert halves([1, 2]) == ([1], [2])


def _isolate(rows: list[int], bad: set[int]) -> tuple[list[int], list[list[int]], int, int]:
    """Run the rule to the end: (answered rows, failed parts, tries, deepest level tried).
    The stand-in model raises on any part that holds a bad row."""
    answered: list[int] = []
    failed: list[list[int]] = []
    tries, deepest = 0, 0
    work: deque[tuple[list[int], Bisection | None]] = deque([(rows, None)])
    tried: set[tuple[int, tuple[int, ...]]] = set()
    while work:
        part, at = work.popleft()
        level = at.level if at is not None else 0
        key = (level, tuple(part))
        assert key not in tried, f"part {part} tried twice at level {level}"
        tried.add(key)
        tries += 1
        deepest = max(deepest, level)
        if not bad.intersection(part):
            answered += part
            continue
        nxt = split_after_failure(len(part), True, at)
        if nxt is None:
            failed.append(part)
            continue
        first, second = halves(part)
        work += [(first, nxt), (second, nxt)]
    return answered, failed, tries, deepest


@given(st.integers(1, 200).flatmap(
    lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1)))))
def test_every_good_row_is_answered_once_and_every_bad_row_fails_alone(case) -> None:
    n, bad = case
    rows = list(range(n))
    answered, failed, tries, deepest = _isolate(rows, bad)
    assert sorted(answered) == sorted(set(rows) - bad)  # each good row exactly once
    assert all(len(part) == 1 for part in failed)  # its own error, never a batch-mate's
    assert sorted(p[0] for p in failed) == sorted(bad)
    assert deepest <= levels_for(n)  # at most ceil(log2 n) extra round trips
    assert tries <= 2 * n - 1
