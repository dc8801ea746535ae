"""Declared deltas (issue 39, case 6): the primary's ledger (full state or changed rows),
the backup's chain rule (a delta only onto the state it was cut from), the delta's bytes,
and the primary's retained copy folding deltas in. Pure: no process, no clock."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from parityserve.core.hams import BackupApplier, StateRecord
from parityserve.core.hams.deltas import DeltaLedger, Shipment
from parityserve.errors import ProtocolError
from parityserve.models.stateful import state_digest
from parityserve.runtime.graphs.hams_state import FlatDelta, FlatState
from parityserve.runtime.graphs.hams_worker import _fold

ROWS = 16


def table() -> dict[str, torch.Tensor]:
    return {"h": torch.zeros(ROWS, 3), "keys": torch.zeros(ROWS, dtype=torch.int64),
            "used": torch.zeros(ROWS, dtype=torch.float64), "w": torch.ones(2, 2)}


def write(state: dict[str, torch.Tensor], rows: list[int], value: float) -> None:
    """What a per-stream batch does: its slots' rows of h, keys and used, nothing else."""
    index = torch.tensor(rows, dtype=torch.int64)
    state["h"][index] = value + torch.arange(len(rows), dtype=torch.float32)[:, None]
    state["keys"][index] = int(value) + 1
    state["used"][index] = value


# -- the primary's ledger ------------------------------------------------------------------
def test_declared_rows_since_the_last_copy_go_as_a_delta_on_that_copy() -> None:
    ledger = DeltaLedger(ROWS, full_every=50, start_seq=4)
    ledger.wrote([3, 1], ["h", "keys"])
    ledger.wrote([1, 5], ["h", "used"])  # two batches folded into one copy: rows unioned
    assert ledger.take(9) == Shipment(9, base=4, rows=(1, 3, 5), tensors=("h", "keys", "used"))
    ledger.wrote([2], ["h"])
    assert ledger.take(10) == Shipment(10, base=9, rows=(2,), tensors=("h",))


def test_an_undeclared_write_makes_the_next_copy_full() -> None:
    ledger = DeltaLedger(ROWS, full_every=50)
    ledger.wrote([1], ["h"])
    ledger.wrote(None)  # e.g. the run form: it says nothing of where it wrote
    ledger.wrote([2], ["h"])
    assert ledger.take(3).full
    ledger.wrote([2], ["h"])
    assert not ledger.take(4).full  # the record starts again after each copy


def test_the_full_state_goes_every_n_batches_and_when_half_the_table_changed() -> None:
    ledger = DeltaLedger(ROWS, full_every=3)
    kinds = []
    for seq in range(1, 8):
        ledger.wrote([seq % ROWS], ["h"])
        kinds.append(ledger.take(seq).full)
    assert kinds == [False, False, True, False, False, True, False]
    ledger.wrote(range(ROWS // 2), ["h"])  # half the rows: a full copy is as cheap
    assert ledger.take(8).full and ledger.fulls == 3 and ledger.deltas == 5


def test_an_operator_that_declares_nothing_always_ships_the_full_state() -> None:
    ledger = DeltaLedger(0, full_every=50)
    ledger.wrote([1], ["h"])
    assert ledger.take(1).full


def test_need_full_and_restart() -> None:
    ledger = DeltaLedger(ROWS, full_every=50)
    ledger.wrote([1], ["h"])
    ledger.need_full()  # the backup could not place a delta
    assert ledger.take(1).full
    ledger.wrote([2], ["h"])
    ledger.restart(1)  # rolled back to the retained copy after 1: nothing changed since
    ledger.wrote([3], ["h"])
    assert ledger.take(2) == Shipment(2, base=1, rows=(3,), tensors=("h",))
    with pytest.raises(ValueError, match="full_every"):
        DeltaLedger(ROWS, full_every=0)


# -- the backup's chain rule ---------------------------------------------------------------
def record(seq: int, base: int | None, tensors: str = "", lineage: int = 0
           ) -> StateRecord[str]:
    hops = ((("frontend", lineage, "A", lineage),),) if lineage else ()
    from parityserve.core.hams import Hop

    return StateRecord("B", seq, tuple(tuple(Hop(*h) for h in lin) for lin in hops),
                       tensors or f"s{seq}", base)


def test_a_delta_is_taken_only_onto_the_newest_state_here() -> None:
    backup: BackupApplier[str] = BackupApplier("B", [], applied_seq=5)
    assert [r.seq for r in backup.receive(record(7, base=5))] == [7]
    assert not backup.fits(record(9, base=8))  # its base never came: a gap
    assert backup.receive(record(9, base=8)) == [] and backup.applied_seq == 7
    assert backup.receive(record(10, base=9)) == []  # the chain stays broken...
    assert [r.seq for r in backup.receive(record(11, base=None))] == [11]  # ...until full
    assert [r.seq for r in backup.receive(record(12, base=11))] == [12]


def test_deltas_wait_in_order_behind_a_state_that_is_not_durable_yet() -> None:
    backup: BackupApplier[str] = BackupApplier("B", ["A"], applied_seq=1)
    assert backup.receive(record(2, base=1, lineage=3)) == []  # needs A's 3 durable
    assert backup.fits(record(4, base=2))  # chained on the buffered one, not the applied
    assert backup.receive(record(4, base=2, lineage=1)) == []  # behind it, in order
    assert [r.seq for r in backup.notify("A", 3)] == [2, 4]


# -- the delta's bytes ---------------------------------------------------------------------
def test_a_delta_carries_only_its_rows_and_rebuilds_the_primarys_state() -> None:
    primary, backup = table(), table()
    write(primary, [2, 9], 5.0)
    delta = FlatDelta.capture(3, 0, primary, [2, 9], ["h", "keys", "used"])
    assert [(name, shape[0]) for name, _, shape, _ in delta.layout] == [
        ("h", 2), ("keys", 2), ("used", 2)]  # two rows of each, and no "w"
    FlatDelta.received(3, 0, delta.layout, bytes(delta.frames()[0]),
                       bytes(delta.frames()[1])).install(backup)
    assert state_digest(backup) == state_digest(primary)


def test_a_delta_that_does_not_fit_the_state_writes_nothing() -> None:
    primary = table()
    write(primary, [1], 2.0)
    delta = FlatDelta.capture(1, 0, primary, [1], ["h", "keys"])
    other = {**table(), "h": torch.zeros(ROWS, 4)}  # built with other options
    with pytest.raises(ProtocolError, match="same options"):
        delta.install(other)
    assert not other["keys"].any()
    bad = FlatDelta(1, 0, np.array([ROWS], dtype=np.int64), delta.layout, delta.buffer)
    with pytest.raises(ProtocolError, match="run past"):
        bad.install(table())
    with pytest.raises(ProtocolError, match="bad delta rows"):
        FlatDelta.received(1, 0, delta.layout, bytes(delta.frames()[0]), b"\0" * 5)


def test_the_retained_copy_folds_deltas_in_order_and_stays_full() -> None:
    live = table()
    copies: dict[int, FlatState | FlatDelta] = {0: FlatState.capture(0, live)}
    write(live, [1], 1.0)
    copies[1] = FlatDelta.capture(1, 0, live, [1], ["h", "keys", "used"])
    write(live, [1, 4], 2.0)
    copies[2] = FlatDelta.capture(2, 1, live, [1, 4], ["h", "keys", "used"])
    write(live, [7], 3.0)
    copies[3] = FlatDelta.capture(3, 2, live, [7], ["h", "keys", "used"])
    folded = _fold(copies, 2)  # the backup applied 2: the retained copy is the state at 2
    assert sorted(folded) == [2, 3] and isinstance(folded[2], FlatState)
    at_two = table()
    folded[2].install(at_two)
    folded[3].install(at_two)
    assert state_digest(at_two) == state_digest(live)
    with pytest.raises(ProtocolError, match="folded into"):
        copies[3].apply_to(FlatState.capture(0, table()))


# -- the whole rule, shipped and applied over random batches --------------------------------
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, ROWS - 1), min_size=0, max_size=6,
                                   unique=True), st.booleans(), st.booleans()),
                min_size=1, max_size=40),
       st.integers(1, 8), st.integers(0, 2**31))
def test_a_backup_applying_the_chain_holds_the_primarys_state_at_every_applied_copy(
        batches: list[tuple[list[int], bool, bool]], full_every: int, seed: int) -> None:
    """Batches write random rows; a copy is taken after some (the others fold into the
    next); one copy in a few is lost on the way. Every copy the backup applies equals the
    primary's state when it was taken, and after the next full copy they agree again."""
    rng = random.Random(seed)
    primary, backup = table(), table()
    ledger = DeltaLedger(ROWS, full_every)
    applier: BackupApplier[FlatState | FlatDelta] = BackupApplier("B", [])
    taken: dict[int, str] = {}
    for seq, (rows, copy_now, lost) in enumerate(batches, start=1):
        write(primary, rows, float(seq))
        ledger.wrote(rows, ["h", "keys", "used"])
        if not copy_now and seq < len(batches):
            continue
        shipment = ledger.take(seq)
        flat: FlatState | FlatDelta = FlatState.capture(seq, primary) if shipment.full \
            else FlatDelta.capture(seq, shipment.base or 0, primary, shipment.rows or (),
                                   shipment.tensors)
        taken[seq] = state_digest(primary)
        if lost and rng.random() < 0.3:
            continue
        state = StateRecord("B", seq, (), flat, None if shipment.full else shipment.base)
        if not applier.fits(state):
            ledger.need_full()
        for ready in applier.receive(state):
            ready.tensors.install(backup)
            assert state_digest(backup) == taken[ready.seq]
    ledger.wrote(None)
    last = len(batches) + 1
    applier.receive(StateRecord("B", last, (), FlatState.capture(last, primary)))[0] \
        .tensors.install(backup)
    assert state_digest(backup) == state_digest(primary)


# -- what a copy depends on: the frontier of its batches' lineages ---------------------------
hops = st.tuples(st.sampled_from(["frontend", "feat", "A", "B"]), st.integers(1, 20),
                 st.sampled_from(["feat", "A", "B", "C"]), st.integers(1, 20))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(hops, max_size=5), min_size=1, max_size=8),
       st.dictionaries(st.sampled_from(["A", "B"]), st.integers(0, 20)))
def test_a_frontier_is_covered_exactly_when_every_lineage_is(
        raw: list[list[tuple[str, int, str, int]]], durable: dict[str, int]) -> None:
    from parityserve.core.hams import Hop, Watermarks, frontier

    lineages = [tuple(Hop(*h) for h in lin) for lin in raw]
    marks = Watermarks(["A", "B"])
    for op, seq in durable.items():
        marks.advance(op, seq)
    assert marks.covers(frontier(lineages, {"A", "B"})) == all(
        marks.covers(lin) for lin in lineages)


# -- the output commit's queues ------------------------------------------------------------
def test_a_held_reply_moves_from_queue_to_queue_and_leaves_once() -> None:
    from parityserve.core.hams import Hop, OutputCommit

    def lineage(client: int, a: int, b: int) -> tuple[Hop, ...]:
        return (Hop("frontend", client, "A", a), Hop("A", a, "B", b))

    commit: OutputCommit[str] = OutputCommit(["A", "B"])
    assert commit.offer(1, lineage(1, 1, 1), "r1") == []
    assert commit.offer(2, lineage(2, 2, 2), "r2") == []
    assert commit.notify("B", 2) == []  # both still wait for A
    assert [h.reply for h in commit.notify("A", 1)] == ["r1"]  # B was durable already
    assert commit.discard_beyond({"A": 1}) == [2]  # r2 was speculation: it goes
    assert commit.notify("A", 2) == []  # its stale queue entry is skipped
    assert commit.offer(2, lineage(2, 3, 3), "r2'") == []  # the recomputed reply
    assert commit.reset("B", 3) == []  # a failover's point: A still short
    assert [h.reply for h in commit.notify("A", 3)] == ["r2'"]
    assert commit.offer(2, lineage(2, 3, 3), "again") == [] and commit.held() == 0
