"""Deadline-ordered queue (parityserve.core.deadline_queue)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parityserve.core import deadline_queue
from parityserve.core.deadline_queue import DeadlineQueue, Entry, QueueStats
from parityserve.errors import ConfigError, QueueFull


def test_public_names() -> None:
    assert sorted(deadline_queue.__all__) == ["DeadlineQueue", "Entry", "QueueStats"]


def items(entries: list[Entry[str]]) -> list[str]:
    return [e.item for e in entries]


def test_pops_earliest_deadline_first_with_fifo_ties() -> None:
    q: DeadlineQueue[str] = DeadlineQueue(10)
    for name, deadline in [("c", 3.0), ("a1", 1.0), ("b", 2.0), ("a2", 1.0), ("a3", 1.0)]:
        q.try_put(name, deadline=deadline, enqueued_at=0.0)
    batch, expired = q.pop_batch(now=0.0, max_size=4)
    assert items(batch) == ["a1", "a2", "a3", "b"] and expired == []
    assert items(q.pop_batch(0.0, 4)[0]) == ["c"]
    assert q.pop_batch(0.0, 4) == ([], [])


def test_entry_records_what_was_put() -> None:
    q: DeadlineQueue[str] = DeadlineQueue(2)
    e = q.try_put("x", deadline=5.0, enqueued_at=1.5)
    assert (e.item, e.deadline, e.enqueued_at) == ("x", 5.0, 1.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.deadline = 9.0  # type: ignore[misc]


def test_try_put_raises_queue_full_and_changes_nothing() -> None:
    q: DeadlineQueue[int] = DeadlineQueue(2)
    q.try_put(1, deadline=1.0, enqueued_at=0.0)
    q.try_put(2, deadline=2.0, enqueued_at=0.0)
    with pytest.raises(QueueFull):
        q.try_put(3, deadline=0.5, enqueued_at=0.0)
    assert len(q) == 2 and q.earliest_deadline() == 1.0
    assert q.statistics().rejected == 1


def test_pop_batch_drops_expired_entries_on_the_way() -> None:
    q: DeadlineQueue[str] = DeadlineQueue(10)
    for name, deadline in [("late1", 1.0), ("due-now", 2.0), ("ok1", 3.0), ("ok2", 4.0)]:
        q.try_put(name, deadline=deadline, enqueued_at=0.0)
    batch, expired = q.pop_batch(now=2.0, max_size=1)
    assert items(batch) == ["ok1"]
    assert items(expired) == ["late1", "due-now"]  # deadline <= now counts as expired
    assert len(q) == 1 and q.earliest_deadline() == 4.0


def test_drop_expired() -> None:
    q: DeadlineQueue[str] = DeadlineQueue(10)
    for name, deadline in [("a", 1.0), ("b", 5.0), ("c", 2.0)]:
        q.try_put(name, deadline=deadline, enqueued_at=0.0)
    assert items(q.drop_expired(2.5)) == ["a", "c"]
    assert q.drop_expired(2.5) == []
    assert len(q) == 1 and q.statistics().expired == 2


def test_requeue_restores_the_original_position_and_bypasses_capacity() -> None:
    q: DeadlineQueue[str] = DeadlineQueue(3)
    first = q.try_put("first", deadline=1.0, enqueued_at=0.1)
    q.try_put("second", deadline=1.0, enqueued_at=0.2)
    batch, _ = q.pop_batch(0.0, 1)
    assert batch == [first]
    q.try_put("third", deadline=1.0, enqueued_at=0.3)
    q.try_put("fourth", deadline=0.5, enqueued_at=0.4)
    q.requeue(first)  # the queue is full, yet the crashed worker's entry comes back
    assert len(q) == 4 and q.oldest_enqueued_at() == 0.1
    assert items(q.pop_batch(0.0, 10)[0]) == ["fourth", "first", "second", "third"]
    stats = q.statistics()
    assert stats.requeued == 1 and stats.depth == 0


def test_requeue_of_a_queued_entry_is_an_error() -> None:
    q: DeadlineQueue[str] = DeadlineQueue(3)
    e = q.try_put("x", deadline=1.0, enqueued_at=0.0)
    with pytest.raises(ValueError, match="already"):
        q.requeue(e)
    assert len(q) == 1


def test_requeued_expired_entry_is_dropped_as_expired() -> None:
    q: DeadlineQueue[str] = DeadlineQueue(3)
    e = q.try_put("x", deadline=1.0, enqueued_at=0.0)
    q.pop_batch(0.0, 1)
    q.requeue(e)
    assert q.pop_batch(now=1.5, max_size=5) == ([], [e])


def test_remove_cancels_lazily_but_correctly() -> None:
    q: DeadlineQueue[str] = DeadlineQueue(5)
    a = q.try_put("a", deadline=1.0, enqueued_at=0.0)
    b = q.try_put("b", deadline=2.0, enqueued_at=1.0)
    assert q.remove(a) is True
    assert q.remove(a) is False
    assert len(q) == 1
    assert q.earliest_deadline() == 2.0 and q.oldest_enqueued_at() == 1.0
    assert q.pop_batch(0.0, 5) == ([b], [])
    assert q.remove(b) is False  # already dispatched
    assert q.statistics().cancelled == 1


def test_remove_frees_capacity() -> None:
    q: DeadlineQueue[str] = DeadlineQueue(1)
    a = q.try_put("a", deadline=1.0, enqueued_at=0.0)
    q.remove(a)
    q.try_put("b", deadline=1.0, enqueued_at=0.0)
    assert len(q) == 1


def test_empty_queue_queries() -> None:
    q: DeadlineQueue[str] = DeadlineQueue(1)
    assert q.oldest_enqueued_at() is None and q.earliest_deadline() is None
    assert q.pop_batch(0.0, 8) == ([], []) and q.drop_expired(1e9) == []
    assert q.statistics() == QueueStats(
        depth=0, capacity=1, enqueued=0, dispatched=0, expired=0, rejected=0, requeued=0)


def test_oldest_enqueued_at_is_not_the_earliest_deadline() -> None:
    q: DeadlineQueue[str] = DeadlineQueue(5)
    q.try_put("patient", deadline=9.0, enqueued_at=1.0)
    q.try_put("urgent", deadline=2.0, enqueued_at=1.5)
    assert q.oldest_enqueued_at() == 1.0 and q.earliest_deadline() == 2.0
    q.pop_batch(0.0, 1)
    assert q.oldest_enqueued_at() == 1.0
    q.pop_batch(0.0, 1)
    assert q.oldest_enqueued_at() is None


def test_invalid_arguments() -> None:
    with pytest.raises(ConfigError, match="capacity"):
        DeadlineQueue(0)
    with pytest.raises(ValueError, match="max_size"):
        DeadlineQueue[int](1).pop_batch(0.0, -1)


def test_memory_stays_bounded_under_churn() -> None:
    q: DeadlineQueue[int] = DeadlineQueue(10)
    for i in range(5000):
        e = q.try_put(i, deadline=float(i), enqueued_at=float(i))
        if i % 2:
            q.remove(e)
        else:
            q.pop_batch(-1.0, 1)
    assert len(q) == 0
    rows = len(q._by_deadline) + len(q._by_arrival)  # internal, but the point of the test
    assert rows <= 200


# --- model-based property ---------------------------------------------------------------

operations = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 50), st.integers(0, 50)),
        st.tuples(st.just("pop"), st.integers(0, 50), st.integers(0, 4)),
        st.tuples(st.just("expire"), st.integers(0, 50), st.just(0)),
        st.tuples(st.just("remove"), st.integers(0, 1000), st.just(0)),
        st.tuples(st.just("requeue"), st.integers(0, 1000), st.just(0)),
    ),
    max_size=80,
)


@given(capacity=st.integers(1, 8), ops=operations)
def test_queue_matches_a_sorted_list_model(
    capacity: int, ops: list[tuple[str, int, int]]
) -> None:
    q: DeadlineQueue[int] = DeadlineQueue(capacity)
    model: list[Entry[int]] = []  # live entries
    popped: list[Entry[int]] = []  # candidates for requeue, like a crashed worker's batch
    for step, (op, a, b) in enumerate(ops):
        _apply_op(q, model, popped, step, op, a, b)
        assert len(q) == len(model)
        assert q.earliest_deadline() == min((e.deadline for e in model), default=None)
        assert q.oldest_enqueued_at() == min((e.enqueued_at for e in model), default=None)
    s = q.statistics()
    assert s.enqueued + s.requeued == s.depth + s.dispatched + s.expired + s.cancelled


def _apply_op(
    q: DeadlineQueue[int],
    model: list[Entry[int]],
    popped: list[Entry[int]],
    step: int,
    op: str,
    a: int,
    b: int,
) -> None:
    if op == "put":
        _put(q, model, step, float(a), float(b))
    elif op == "pop":
        _pop(q, model, popped, float(a), b)
    elif op == "expire":
        dropped = q.drop_expired(float(a))
        assert sorted(dropped, key=_order) == dropped
        assert {id(e) for e in dropped} == {id(e) for e in model if e.deadline <= a}
        model[:] = [e for e in model if e.deadline > a]
    elif op == "remove" and model:
        entry = model.pop(a % len(model))
        assert q.remove(entry)
    elif op == "requeue" and popped:
        entry = popped.pop(a % len(popped))
        q.requeue(entry)
        model.append(entry)


def _order(e: Entry[int]) -> tuple[float, int]:
    return (e.deadline, e.seq)


def _put(q: DeadlineQueue[int], model: list[Entry[int]], step: int, d: float, t: float) -> None:
    if len(q) >= q.statistics().capacity:
        with pytest.raises(QueueFull):
            q.try_put(step, deadline=d, enqueued_at=t)
    else:
        model.append(q.try_put(step, deadline=d, enqueued_at=t))


def _pop(
    q: DeadlineQueue[int],
    model: list[Entry[int]],
    popped: list[Entry[int]],
    now: float,
    size: int,
) -> None:
    batch, expired = q.pop_batch(now, size)
    expected_expired = sorted((e for e in model if e.deadline <= now), key=_order)
    alive = sorted((e for e in model if e.deadline > now), key=_order)
    assert expired == expected_expired
    assert batch == alive[:size]  # earliest deadlines first, FIFO on ties
    assert all(e.deadline > now for e in batch)
    taken = {id(e) for e in batch + expired}
    model[:] = [e for e in model if id(e) not in taken]
    popped.extend(batch)
