"""HAMS's pure pieces one at a time: lineage, the request manager, Alg. 2's apply rule,
the output commit, the primary's shipping gate, graph validation and the recovery plan."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parityserve.core.hams import (
    FRONTEND,
    Arrival,
    BackupApplier,
    GraphError,
    Hop,
    OutputCommit,
    PrimaryShipper,
    RequestManager,
    StateRecord,
    Topology,
    client_of,
    extend,
    merge,
    plan_failover,
    seq_at,
)


def lin(*hops: tuple[str, int, str, int]) -> tuple[Hop, ...]:
    return tuple(Hop(*h) for h in hops)


# -- lineage -----------------------------------------------------------------------------
def test_lineage_records_every_hop_and_its_client() -> None:
    lineage = extend(extend((), [(FRONTEND, 7)], "A", 3), [("A", 3)], "B", 1)
    assert seq_at(lineage, "A") == 3 and seq_at(lineage, "B") == 1 and seq_at(lineage, "C") is None
    assert client_of(lineage) == 7


def test_join_merges_lineages_and_rejects_two_requests() -> None:
    a = lin((FRONTEND, 1, "A", 1))
    left, right = a + lin(("A", 1, "L", 1)), a + lin(("A", 1, "R", 4))
    assert merge([left, right]) == a + lin(("A", 1, "L", 1), ("A", 1, "R", 4))
    with pytest.raises(ValueError, match="disagree on A"):
        merge([left, lin((FRONTEND, 2, "A", 2))])


def test_a_lineage_without_a_client_is_an_error() -> None:
    with pytest.raises(ValueError, match="no client"):
        client_of(lin(("A", 1, "B", 1)))


# -- request manager ---------------------------------------------------------------------
def arrival(client: int, value: int = 0) -> Arrival[int]:
    return Arrival((), ((FRONTEND, client),), value)


def test_sequence_numbers_follow_execution_not_receipt() -> None:
    rm: RequestManager[int] = RequestManager("A")
    assert rm.offer(arrival(5)) and rm.offer(arrival(3))
    assert not rm.offer(arrival(5))  # a duplicate changes nothing
    assert [e.seq for e in rm.form_batch(1)] + [e.seq for e in rm.form_batch(4)] == [1, 2]
    assert [client_of(e.lineage) for e in rm.dispatched()] == [5, 3]


def test_outputs_are_retained_until_their_client_is_collected() -> None:
    rm: RequestManager[int] = RequestManager("A")
    for client in (1, 2):
        rm.offer(arrival(client))
    rm.form_batch(2)
    rm.record(1, 10)
    assert [e.output for e in rm.retained()] == [10] and [e.seq for e in rm.unanswered()] == [2]
    assert rm.collect(1) == 1 and rm.retained() == []
    assert rm.offer(arrival(1))  # collected: its sources are forgotten


def test_rollback_renumbers_what_ran_after_the_backup_and_drops_speculation() -> None:
    rm: RequestManager[int] = RequestManager("B")
    good = Arrival(lin((FRONTEND, 1, "A", 1)), (("A", 1),), 0)
    spec = Arrival(lin((FRONTEND, 2, "A", 2)), (("A", 2),), 0)
    rm.offer(good)
    rm.offer(spec)
    rm.form_batch(2)
    rm.rollback(0, {"A": 1})
    redo = rm.form_batch(5)
    assert [(e.seq, e.arrival) for e in redo] == [(1, good)]
    assert rm.offer(spec)  # the recomputed one is welcome


def test_discard_lets_a_replacement_reuse_its_original_number() -> None:
    rm: RequestManager[int] = RequestManager("S")
    for a_seq in (1, 2, 3):
        rm.offer(Arrival(lin((FRONTEND, a_seq, "A", a_seq)), (("A", a_seq),), 0))
    rm.form_batch(3)
    rm.discard({"A": 1})
    rm.offer(Arrival(lin((FRONTEND, 9, "A", 3)), (("A", 3),), 0))
    rm.offer(Arrival(lin((FRONTEND, 8, "A", 4)), (("A", 4),), 0))
    assert [e.seq for e in rm.form_batch(2)] == [3, 4]


# -- Alg. 2 and the output commit ----------------------------------------------------------
def state(seq: int, *lineages: tuple[Hop, ...]) -> StateRecord[str]:
    return StateRecord("B", seq, lineages, f"s{seq}")


def test_backup_applies_only_when_every_upstream_state_is_durable() -> None:
    backup: BackupApplier[str] = BackupApplier("B", ["A"])
    needs_a2 = lin((FRONTEND, 1, "A", 2), ("A", 2, "B", 1))
    assert backup.receive(state(1, needs_a2)) == []
    assert backup.notify("A", 1) == []  # the paper's printed "<=" would apply here
    assert [s.tensors for s in backup.notify("A", 2)] == ["s1"]
    assert backup.applied_seq == 1


def test_backup_applies_in_order_and_ignores_stale_states_and_notices() -> None:
    backup: BackupApplier[str] = BackupApplier("B", ["A"])
    backup.receive(state(1, lin((FRONTEND, 1, "A", 5), ("A", 5, "B", 1))))
    assert backup.receive(state(2, lin((FRONTEND, 2, "A", 1), ("A", 1, "B", 2)))) == []
    assert backup.receive(state(2)) == []  # repeated
    assert [s.seq for s in backup.notify("A", 5)] == [1, 2]
    assert backup.notify("A", 3) == [] and backup.durable["A"] == 5  # late notice


def test_discard_beyond_drops_states_built_on_speculation() -> None:
    backup: BackupApplier[str] = BackupApplier("B", ["A"])
    backup.receive(state(1, lin((FRONTEND, 1, "A", 3), ("A", 3, "B", 1))))
    assert backup.discard_beyond({"A": 2}) == 1 and backup.pending() == 0


def test_a_reply_waits_for_every_stateful_operator_in_its_lineage() -> None:
    commit: OutputCommit[str] = OutputCommit(["A", "B"])
    lineage = lin((FRONTEND, 1, "A", 1), ("A", 1, "B", 1))
    assert commit.offer(1, lineage, "r") == [] and commit.held() == 1
    assert commit.notify("B", 1) == []
    assert [h.reply for h in commit.notify("A", 1)] == ["r"]
    assert commit.offer(1, lineage, "again") == []  # one answer per client request


def test_commit_discards_speculative_replies_and_takes_the_recomputed_one() -> None:
    commit: OutputCommit[str] = OutputCommit(["A"])
    commit.offer(1, lin((FRONTEND, 1, "A", 4)), "old")
    assert commit.discard_beyond({"A": 3}) == [1]
    commit.notify("A", 4)
    assert [h.reply for h in commit.offer(1, lin((FRONTEND, 1, "A", 4)), "new")] == ["new"]


# -- the primary's shipping -------------------------------------------------------------
def test_update_waits_for_the_copy_and_one_state_is_in_flight() -> None:
    ship = PrimaryShipper("A")
    order = ship.batch_finished((lin((FRONTEND, 1, "A", 1)),), 1)
    assert order is not None and order.seq == 1 and not ship.update_allowed
    sent = ship.copy_finished(1)
    assert sent is not None and sent.existing and ship.update_allowed
    assert ship.batch_finished((lin((FRONTEND, 2, "A", 2)),), 2) is None  # 1 in flight
    assert ship.batch_finished((lin((FRONTEND, 3, "A", 3)),), 3) is None
    coalesced = ship.received(1)
    assert coalesced is not None and coalesced.seq == 3 and len(coalesced.lineages) == 2


def test_a_window_of_two_ships_the_next_state_before_the_first_receipt() -> None:
    ship = PrimaryShipper("A", window=2)
    ship.batch_finished((lin((FRONTEND, 1, "A", 1)),), 1)
    assert ship.copy_finished(1) is not None
    second = ship.batch_finished((lin((FRONTEND, 2, "A", 2)),), 2)  # 1 in flight: room
    assert second is not None and second.seq == 2
    assert ship.copy_finished(2) is not None and ship.statistics().in_flight == 2
    assert ship.batch_finished((lin((FRONTEND, 3, "A", 3)),), 3) is None  # two in flight
    assert ship.batch_finished((lin((FRONTEND, 4, "A", 4)),), 4) is None
    assert ship.received(0) is None  # an old receipt frees nothing
    coalesced = ship.received(1)  # one place frees: the batches since go in one copy
    assert coalesced is not None and coalesced.seq == 4 and len(coalesced.lineages) == 2
    assert ship.copy_finished(4) is not None
    assert ship.received(4) is None and ship.statistics().in_flight is None  # 2 and 4


def test_a_new_backup_gets_every_unapplied_state_again_within_the_window() -> None:
    ship = PrimaryShipper("A", window=2)
    for seq in (1, 2):
        ship.batch_finished((lin((FRONTEND, seq, "A", seq)),), seq)
        ship.copy_finished(seq)
    ship.received(1)
    ship.applied(1)
    ship.batch_finished((lin((FRONTEND, 3, "A", 3)),), 3)
    ship.copy_finished(3)  # 2 and 3 in flight, unapplied
    first = ship.lost_backup()
    assert first is not None and first.existing and first.seq == 2
    assert ship.received(2) is not None  # the resends go in order, within the window


def test_a_window_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        PrimaryShipper("A", window=0)


def test_the_applied_copy_is_retained_and_a_new_backup_gets_every_state_again() -> None:
    ship = PrimaryShipper("A")
    ship.batch_finished((lin((FRONTEND, 1, "A", 1)),), 1)
    ship.copy_finished(1)
    ship.received(1)
    ship.applied(1)
    ship.batch_finished((lin((FRONTEND, 2, "A", 2)),), 2)
    ship.copy_finished(2)
    assert ship.retained_seq == 1
    resend = ship.lost_backup()
    assert resend is not None and resend.existing and resend.seq == 2


def test_a_copy_that_was_not_ordered_is_an_error() -> None:
    with pytest.raises(ValueError, match="was copying None"):
        PrimaryShipper("A").copy_finished(1)


# -- topology ----------------------------------------------------------------------------
def diamond() -> Topology:
    return Topology.build(
        ["F", "L", "R", "J"],
        [(FRONTEND, "F"), ("F", "L"), ("F", "R"), ("L", "J"), ("R", "J"), ("J", FRONTEND)],
        stateful=["L", "J"])


def test_next_and_previous_stateful_operators() -> None:
    graph = diamond()
    assert graph.operators[0] == "F" and graph.operators[-1] == "J"
    assert graph.next_stateful("F") == ("L", "J")
    assert graph.next_stateful("J") == (FRONTEND,)
    assert graph.prev_stateful("J") == ("L",)
    assert graph.entries == ("F",) and graph.exits == ("J",)


@pytest.mark.parametrize(("ops", "edges", "stateful", "message"), [
    (["A", "B"], [(FRONTEND, "A"), ("A", "B"), ("B", "A"), ("B", FRONTEND)], [], "cycle"),
    (["A"], [(FRONTEND, "A"), ("A", "Z"), ("A", FRONTEND)], [], "unknown operator 'Z'"),
    (["A", "J"], [(FRONTEND, "A"), ("A", FRONTEND)], [], "'J' has no input"),
    (["A"], [(FRONTEND, "A"), ("A", FRONTEND)], ["X"], "stateful names unknown"),
    (["A", "A"], [], [], "repeat"),
    ([], [], [], "at least one"),
    (["frontend"], [], [], "reserved"),
    (["A", "B"], [(FRONTEND, "A"), (FRONTEND, "B"), ("A", FRONTEND), ("B", FRONTEND)], [],
     "exactly one operator answers"),
])
def test_bad_graphs_are_rejected_with_the_reason(
        ops: list[str], edges: list[tuple[str, str]], stateful: list[str], message: str) -> None:
    with pytest.raises(GraphError, match=message):
        Topology.build(ops, edges, stateful)


# -- recovery plan -----------------------------------------------------------------------
def test_plan_promotes_downstream_operators_that_saw_speculation_transitively() -> None:
    graph = Topology.build(["A", "B", "C"], [(FRONTEND, "A"), ("A", "B"), ("B", "C"),
                                             ("C", FRONTEND)], stateful=["A", "B", "C"])
    b_saw = [lin((FRONTEND, 1, "A", 5), ("A", 5, "B", 2))]
    c_saw = [lin((FRONTEND, 0, "A", 1), ("A", 1, "B", 4), ("B", 4, "C", 1))]  # B beyond 3
    plan = plan_failover(graph, ["A"], {"A": 4, "B": 3, "C": 0},
                         {"B": b_saw, "C": c_saw, FRONTEND: c_saw}, epoch=1)
    assert plan.promote == ("A", "B", "C") and dict(plan.bounds) == {"A": 4, "B": 3, "C": 0}
    assert plan.frontend_discards and plan.roll_back_in_place == ()


def test_plan_leaves_operators_untouched_by_speculation_alone() -> None:
    plan = plan_failover(diamond(), ["L"], {"L": 2, "J": 1},
                         {"J": [lin((FRONTEND, 1, "L", 2), ("L", 2, "J", 1))]}, epoch=1)
    assert plan.promote == ("L",) and not plan.frontend_discards


def test_plan_rolls_back_in_place_when_the_backup_is_gone_too() -> None:
    plan = plan_failover(diamond(), ["L"], {"L": 1, "J": 0},
                         {"J": [lin((FRONTEND, 1, "L", 2), ("L", 2, "J", 1))]}, epoch=2,
                         dead_backups=["J"])
    assert plan.promote == ("L",) and plan.roll_back_in_place == ("J",)


@pytest.mark.parametrize(("failed", "dead", "message"), [
    (["F"], [], "not stateful"), (["L"], ["L"], "both lost")])
def test_plans_outside_the_failure_model_are_refused(
        failed: list[str], dead: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_failover(diamond(), failed, {"L": 0, "J": 0}, {}, epoch=1, dead_backups=dead)


def test_a_batch_during_a_new_backups_catch_up_orders_no_copy() -> None:
    """With a window of two, a place is free while a new backup is sent old copies again:
    a batch ending then must not be handed a resend (the worker takes what batch_finished
    returns for a new copy: it would label the live state with an old number)."""
    ship = PrimaryShipper("A", window=2)
    for seq in (1, 2):
        ship.batch_finished((lin((FRONTEND, seq, "A", seq)),), seq)
        ship.copy_finished(seq)
    first = ship.lost_backup()  # 1 goes again; 2 waits with a place free
    assert first is not None and first.existing and first.seq == 1
    assert ship.batch_finished((lin((FRONTEND, 3, "A", 3)),), 3) is None
    again = ship.received(1)
    assert again is not None and again.existing and again.seq == 2
    new = ship.received(2)
    assert new is not None and not new.existing and new.seq == 3


@settings(max_examples=1000, deadline=None)
@given(window=st.integers(1, 3), steps=st.lists(st.integers(0, 3), max_size=24))
def test_batch_finished_never_hands_out_an_existing_copy(window: int, steps: list[int]) -> None:
    """Any sequence of batches, copies, receipts, applies and lost backups: what
    batch_finished returns is a new copy or nothing, and every state shipped is received
    in the order it left."""
    ship = PrimaryShipper("A", window=window)
    seq, flying = 0, []  # the states sent, oldest first
    for step in steps:
        if step == 0 and ship.update_allowed:
            seq += 1
            order = ship.batch_finished((lin((FRONTEND, seq, "A", seq)),), seq)
            assert order is None or not order.existing
            if order is not None:
                order = ship.copy_finished(order.seq)
        elif step == 1 and flying:
            order = ship.received(flying.pop(0))
        elif step == 2 and flying:
            ship.applied(flying[0])
            order = ship.received(flying.pop(0))
        elif step == 3:
            flying.clear()
            order = ship.lost_backup()
        else:
            continue
        while order is not None:  # the state thread: an existing copy is sent, a new
            if order.existing:  # one taken first
                flying.append(order.seq)
                break
            order = ship.copy_finished(order.seq)
        assert len(flying) <= window
