"""The pure rules that keep one client's rows from hurting another's on a stateful graph
(issue 38): finding a failed batch's bad rows in row order (``RowBisection``), a stream
table that evicts idle streams or refuses a new one's rows alone (``plan_streams``), and
the watchdog's and readiness's view of an operator's batches in flight (``InFlight``)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parityserve.core.hams import (
    FRONTEND,
    Arrival,
    GraphRouter,
    InFlight,
    RequestManager,
    RowBisection,
    Topology,
    plan_streams,
)

# --- RowBisection ---------------------------------------------------------------------------


def search(n: int, bad: set[int], named: bool = False) -> tuple[RowBisection[str], list]:
    """Drive a bisection against a stand-in operator that raises on any part holding a bad
    row (naming those rows when ``named``); returns it and the parts that ran, in order."""
    plan: RowBisection[str] = RowBisection(n)
    ran = []
    while (part := plan.next_part()) is not None:
        ran.append(part)
        culprits = [row for row in part if row in bad]
        if culprits:
            plan.failed(part, f"bad {culprits}", culprits if named else ())
        else:
            plan.passed(part)
    return plan, ran


@given(st.integers(0, 80).flatmap(
    lambda n: st.tuples(st.just(n), st.sets(st.integers(0, max(n - 1, 0)), max_size=n))))
def test_every_bad_row_fails_alone_and_every_good_row_runs_once_in_order(
        case: tuple[int, set[int]]) -> None:
    n, bad = case
    bad = {row for row in bad if row < n}
    plan, ran = search(n, bad)
    assert set(plan.errors) == bad
    assert plan.ok == sorted(set(range(n)) - bad)  # once each, in batch order
    assert plan.runs == len(ran) <= max(2 * n - 1, 0)
    for row, error in plan.errors.items():
        assert error == f"bad [{row}]"  # the error it raised alone, not a batch-mate's
    if len(bad) == 1:
        assert plan.runs <= 2 * math.ceil(math.log2(n)) + 1


@given(st.integers(1, 80).flatmap(
    lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1), max_size=n))))
def test_an_error_that_names_its_rows_takes_one_retry(case: tuple[int, set[int]]) -> None:
    n, bad = case
    plan, ran = search(n, bad, named=True)
    assert set(plan.errors) == bad and plan.ok == sorted(set(range(n)) - bad)
    assert plan.runs == (2 if bad and len(bad) < n else 1)


def test_a_hint_that_names_rows_outside_the_part_is_not_trusted() -> None:
    plan: RowBisection[str] = RowBisection(4)
    plan.failed((0, 1, 2, 3), "x", culprits=(1, 9))  # 9 is no row of the part: split
    assert plan.next_part() == (0, 1) and not plan.errors


def test_parts_must_be_reported_in_the_order_they_were_planned() -> None:
    plan: RowBisection[str] = RowBisection(4)
    plan.failed((0, 1, 2, 3), "x")
    with pytest.raises(ValueError, match=r"part \[2, 3\] is not the one to run next"):
        plan.passed((2, 3))
    assert RowBisection(0).next_part() is None


# --- plan_streams ---------------------------------------------------------------------------

IDLE = 10.0


def test_held_streams_keep_their_slot_and_new_ones_take_free_slots_in_order() -> None:
    plan = plan_streams([5, 0, 7, 5], table=[5, 0, 0], used=[1.0, 0.0, 0.0], at=2.0,
                        idle_s=IDLE)
    assert plan.lane_of_row == [0, 1, 2, 0]  # the two rows of 5 share a lane
    assert plan.slots == [0, -1, 1] and plan.keys == [5, 0, 7]
    assert plan.known == [True, False, False] and not plan.refused and not plan.evicted


def test_a_new_stream_evicts_the_least_recently_used_idle_one() -> None:
    table, used = [1, 2, 3], [4.0, 2.0, 9.0]
    plan = plan_streams([3, 8], table, used, at=15.0, idle_s=IDLE)  # 1 and 2 idle; 2 oldest
    assert plan.slots == [2, 1] and plan.evicted == [1] and plan.known == [True, False]
    plan = plan_streams([8, 9, 6], table, used, at=15.0, idle_s=IDLE)
    assert plan.evicted == [1, 0] and plan.refused == [2]  # 3 (used at 9) is not idle yet
    assert plan.lane_of_row == [0, 1, -1] and plan.retry_after_s == pytest.approx(4.0)


def test_a_full_table_refuses_only_the_new_streams_rows() -> None:
    plan = plan_streams([1, 8, 2, 8, 0], table=[1, 2], used=[0.0, 0.0], at=3.0, idle_s=IDLE)
    assert plan.refused == [1, 3] and plan.lane_of_row == [0, -1, 1, -1, 2]
    assert plan.retry_after_s == pytest.approx(IDLE)  # both slots are used now, by 1 and 2


def test_a_stream_of_the_batch_is_never_the_one_evicted() -> None:
    plan = plan_streams([1, 9], table=[1], used=[0.0], at=100.0, idle_s=IDLE)
    assert plan.refused == [1] and not plan.evicted


@given(st.lists(st.integers(0, 6), max_size=12), st.lists(st.integers(0, 6), min_size=1,
                                                          max_size=5),
       st.lists(st.floats(0, 50), min_size=5, max_size=5), st.floats(0, 60))
def test_the_plan_is_a_function_of_the_table_and_the_batch(
        rows: list[int], table: list[int], used: list[float], at: float) -> None:
    """Whatever the table: the plan is the same when made again (a replay, or a backup),
    each held stream keeps its slot, no slot serves two streams, no slot used by a stream of
    the batch is evicted, and a refusal happens only when no slot was free or idle."""
    table = [k if k not in table[:i] else 0 for i, k in enumerate(table)]  # distinct keys
    used = used[:len(table)]
    plan = plan_streams(rows, table, used, at, IDLE)
    assert plan == plan_streams(rows, table, used, at, IDLE)
    stream_slots = [s for s in plan.slots if s >= 0]
    assert len(stream_slots) == len(set(stream_slots))
    held = {k: slot for slot, k in enumerate(table) if k}
    for lane, key in enumerate(plan.keys):
        if key in held:
            assert plan.slots[lane] == held[key] and plan.known[lane]
    in_batch = {held[k] for k in rows if k in held}
    assert not set(plan.evicted) & in_batch
    for slot in plan.evicted:
        assert used[slot] + IDLE <= at
    if plan.refused:  # every free and every idle slot went to a new stream first
        new_lanes = [lane for lane, key in enumerate(plan.keys) if key and not plan.known[lane]]
        idle = [s for s, k in enumerate(table) if k and s not in in_batch and used[s] + IDLE <= at]
        assert len(new_lanes) == table.count(0) + len(idle) and plan.retry_after_s >= 0
        assert all(rows[r] and rows[r] not in held for r in plan.refused)


# --- InFlight -------------------------------------------------------------------------------


def test_the_watchdog_takes_batches_out_past_their_deadline_and_counts_them() -> None:
    out: InFlight[str] = InFlight(now=0.0)
    out.add(1, "a", now=1.0)
    out.add(2, "b", now=4.0)
    assert out.expired(now=5.0, limit_s=3.0) == [(1, "a")]
    assert 1 not in out and 2 in out and out.expired_total == 1
    assert out.pop(1, now=5.0) is None  # a late answer for an expired batch finds nothing
    assert out.statistics(now=6.0).oldest_s == 2.0


def test_an_operator_that_finishes_nothing_is_stalled_until_it_does() -> None:
    out: InFlight[str] = InFlight(now=0.0)
    out.add(1, "a", now=10.0)  # idle before: the wait starts with this batch
    assert not out.stalled(now=12.0, limit_s=3.0)
    assert out.stalled(now=14.0, limit_s=3.0)
    out.expired(now=14.0, limit_s=3.0)  # failing it is not progress
    assert out.stalled(now=14.5, limit_s=3.0, queued=1)
    out.add(2, "b", now=14.5)  # nor is sending it more work
    assert out.stalled(now=14.5, limit_s=3.0)
    assert out.pop(2, now=15.0) == "b" and not out.stalled(now=15.0, limit_s=3.0)
    assert not out.stalled(now=30.0, limit_s=3.0)  # nothing to do is not a stall
    assert out.stalled(now=30.0, limit_s=3.0, queued=2)  # but waiting work is
    out.idle(now=30.0)  # the driver saw it idle at 30: the wait for the queue starts there
    assert not out.stalled(now=31.0, limit_s=3.0, queued=2) and out.clear() == []


# --- batches of one shape, and per-request records ------------------------------------------


def test_a_batch_ends_before_an_input_of_another_kind() -> None:
    """With ``same``, rows of two shapes never share a batch (np.stack would fail it), and
    the queue keeps its order."""
    rm: RequestManager[tuple[int, ...]] = RequestManager("A")
    for client, shape in enumerate([(4,), (4,), (2,), (4,), (2,), (2,)], 1):
        rm.offer(Arrival((), ((FRONTEND, client),), shape))
    batches = []
    while rm.queued():
        batches.append([e.arrival.payload for e in rm.form_batch(8, same=lambda p: p)])
    assert batches == [[(4,), (4,)], [(2,)], [(4,)], [(2,), (2,)]]
    assert [e.seq for e in rm.dispatched()] == [1, 2, 3, 4, 5, 6]  # numbered as they run


def test_every_record_of_a_request_goes_when_it_is_collected() -> None:
    topology = Topology.build(["A", "B"], [("frontend", "A"), ("A", "B"), ("B", "frontend")],
                              [])
    router: GraphRouter[int] = GraphRouter(topology, sum)
    router.submit(1, 10)
    router.submit(2, 20)
    (first, second) = router.batch("A", 8)
    router.output("A", first.seq, 11)
    assert router.records() == 2  # both executed at A, one output retained
    router.collect(1)  # answered (or failed): nothing of it stays
    router.collect(2)
    assert router.records() == 0


def test_in_flight_counts_the_batches_and_rows_it_ever_sent() -> None:
    out: InFlight[list[int]] = InFlight(now=0.0)
    out.add(1, [1, 2, 3], now=1.0)
    out.add(2, [4], now=2.0)
    out.pop(1, now=3.0)
    out.expired(now=9.0, limit_s=1.0)  # expired or answered, each was sent once
    stats = out.statistics(now=9.0)
    assert (stats.sent, stats.rows, stats.inflight) == (2, 4, 0)
