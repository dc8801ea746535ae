"""Batch isolation in the scheduler (core/scheduling driving core/isolation.py), under every
redundancy mode: a batch the model raises on is split until only the rows it raises on fail,
each with its own error, and every other row is answered exactly once, whatever order the
replicas answer in. No processes, no clock: the rig's model raises on any payload holding a
NaN (a bad row, or a parity or coded task that mixed one in) and echoes anything else."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parityserve.core.isolation import levels_for
from parityserve.core.scheduling import (
    DATA_POOL,
    Answer,
    Expire,
    Fail,
    ModeSettings,
    ParitySettings,
    Redundant,
    Send,
    parity_pool,
)
from tests.unit.core.scheduling.scheduler_rig import Rig

MAX_BATCH = 16
MODES = {
    "none": ModeSettings(),
    "replication": ModeSettings("replication", copies=2),
    "reactive": ModeSettings("reactive", reissue_after_s=0.01),
    "parm": ModeSettings("parm", parity=ParitySettings(k=2)),
    "berrut": ModeSettings("berrut", K=2, S=1),
    "systematic-berrut": ModeSettings("systematic-berrut", K=2, S=1),
}


def _rig(mode: str, values: list[list[float]]) -> Rig:
    """Every query queued before any replica is ready, so they leave as full batches."""
    rig = Rig(MODES[mode], max_batch=MAX_BATCH)
    pools = [(f"r{i}", DATA_POOL) for i in range(4)]
    if mode == "parm":
        pools.append(("p0", parity_pool(0)))
    for rid, pool in pools:
        rig.add(rid, pool=pool, initial=MAX_BATCH, state="starting")
    for value in values:
        rig.submit(value)
    for rid, _ in pools:
        rig.ready(rid)
    return rig


def _serve(rig: Rig, pick: Any) -> None:
    """Replicas answer, in the order ``pick`` chooses, until nothing runs or waits."""
    for _ in range(10_000):
        busy = [r for r in rig.machine.replicas.values() if r.batch is not None]
        if not busy:
            if not rig.machine._timers:  # nothing left to wake up for either
                return
            rig.at(0.05).record(rig.machine.tick(rig.now))
            continue
        replica = busy[pick(len(busy))]
        assert replica.batch is not None
        if np.isnan(np.asarray(replica.batch.task.payload, dtype=np.float64)).any():
            rig.record(rig.machine.task_error(replica.batch, "ValueError: a NaN", rig.now,
                                              raised=True, bad_input=True))
        else:
            rig.echo(replica.rid)
    raise AssertionError("the scheduler never settled")


def _outcomes(rig: Rig) -> tuple[Counter[int], dict[int, Any], list[Fail]]:
    """How many answers each query got, the answered rows (own predictions only), and the
    failures."""
    count: Counter[int] = Counter()
    rows: dict[int, Any] = {}
    fails: list[Fail] = []
    for action in rig.actions:
        if isinstance(action, Answer | Fail | Expire):
            count.update(e.item.handle for e in action.entries)
        if isinstance(action, Answer) and action.method is None:
            for entry, row in zip(action.entries, action.outputs, strict=True):
                rows[entry.item.handle] = np.asarray(row).tolist()
        if isinstance(action, Fail):
            fails.append(action)
    return count, rows, fails


def _check(rig: Rig, bad: set[int]) -> None:
    n = len(rig.queries)
    count, rows, fails = _outcomes(rig)
    assert count == Counter(range(n)), "every query answered exactly once"
    assert all(len(f.entries) == 1 and f.bad_input for f in fails), "each its own error"
    assert {f.entries[0].item.handle for f in fails} == bad  # and never a good row
    for qid, row in rows.items():
        assert row == [float(qid)]


@pytest.mark.parametrize("mode", MODES)
def test_one_bad_row_fails_alone_and_its_batch_mates_are_answered(mode: str) -> None:
    values = [[float(i)] for i in range(8)]
    values[5] = [float("nan")]
    rig = _rig(mode, values)
    _serve(rig, lambda busy: 0)
    _check(rig, {5})


def test_the_split_is_bounded_and_counted() -> None:
    values = [[float(i)] for i in range(MAX_BATCH)]
    values[3] = [float("nan")]
    rig = Rig(MODES["none"], max_batch=MAX_BATCH)
    rig.add("r0", initial=MAX_BATCH, state="starting")
    for value in values:
        rig.submit(value)
    rig.ready("r0")
    _serve(rig, lambda busy: 0)
    _check(rig, {3})
    sends = [a for a in rig.actions if isinstance(a, Send)]
    # the batch, then two halves per level down to the bad row: 1 + 2 * log2(16) tries
    assert sorted(s.batch.task.rows for s in sends) == [1, 1, 2, 2, 4, 4, 8, 8, 16]
    assert sum(isinstance(a, Redundant) and a.kind == "split" for a in rig.actions) == 4
    assert levels_for(MAX_BATCH) == 4


def test_a_failure_the_model_did_not_raise_is_not_split() -> None:
    rig = Rig(MODES["none"], max_batch=4)
    rig.add("r0", initial=4, state="starting")
    for i in range(4):
        rig.submit([float(i)])
    rig.ready("r0")
    batch = rig.machine.replicas["r0"].batch
    assert batch is not None
    rig.record(rig.machine.task_error(batch, "unusable outputs", rig.now, computed=True))
    fails = [a for a in rig.actions if isinstance(a, Fail)]
    assert len(fails) == 1 and len(fails[0].entries) == 4 and not fails[0].bad_input


@settings(max_examples=60, deadline=None)
@given(mode=st.sampled_from(sorted(MODES)), n=st.integers(1, 40), data=st.data())
def test_every_good_row_is_answered_once_and_every_bad_row_gets_its_own_error(
        mode: str, n: int, data: st.DataObject) -> None:
    bad = data.draw(st.sets(st.integers(0, n - 1), max_size=n), label="bad rows")
    values = [[float("nan")] if i in bad else [float(i)] for i in range(n)]
    rig = _rig(mode, values)
    _serve(rig, lambda busy: data.draw(st.integers(0, busy - 1), label="who answers"))
    _check(rig, bad)
