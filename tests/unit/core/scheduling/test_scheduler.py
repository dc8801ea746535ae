"""The scheduler (core/scheduling) driven by plain event sequences, with no event loop.

Each scenario is a table row: the events in order, and for each event the actions the
scheduler answers with (``scheduler_rig.line`` writes them down). Every redundancy mode gets
one with a slow replica (``r0``, which answers last), a dead one (``r1``, taken back by the
supervisor) and a deadline miss (query 3's short deadline passes while it waits).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from parityserve.core.scheduling import (
    DATA_POOL,
    ModeSettings,
    ParitySettings,
    Send,
    is_parity_slot,
    parity_index,
    parity_pool,
    slot_name,
)
from parityserve.core.scheduling.modes import Parm, Reactive
from tests.unit.core.scheduling.scheduler_rig import SLO, T0, Rig

Step = tuple[tuple[Any, ...], list[str]]

SUBMIT: tuple[Any, ...] = ("submit",)
SHORT: tuple[Any, ...] = ("submit", None, 0.01)  # query 3: gone before a replica is free
CRASH = ("crash", "r1")
LATER = ("at", 0.02)

SCENARIOS: dict[str, tuple[ModeSettings, list[Step]]] = {
    "none": (ModeSettings(), [
        (SUBMIT, ["send r0 data [0]"]),
        (SUBMIT, ["send r1 data [1]"]),
        (SUBMIT, ["send r2 data [2]"]),
        (SHORT, []),
        (CRASH, []),  # query 1 goes back to the queue; nobody is idle
        (LATER, []),
        (("echo", "r2"), ["answer [2]", "expire [3]", "send r2 data [1]"]),
        (("echo", "r2"), ["answer [1]"]),
        (("echo", "r0"), ["answer [0]"]),
    ]),
    "equal-resources": (ModeSettings("equal-resources"), [
        (SUBMIT, ["send r0 data [0]"]),
        (SUBMIT, ["send r1 data [1]"]),
        (SUBMIT, ["send r2 data [2]"]),
        (SHORT, []),
        (CRASH, []),
        (LATER, []),
        (("echo", "r2"), ["answer [2]", "expire [3]", "send r2 data [1]"]),
        (("echo", "r2"), ["answer [1]"]),
        (("echo", "r0"), ["answer [0]"]),
    ]),
    "replication": (ModeSettings("replication", copies=2), [
        (SUBMIT, ["send r0 data [0]", "+copy", "send r1 data [0]"]),
        (SUBMIT, ["send r2 data [1]", "+copy"]),
        (SUBMIT, []),
        (SHORT, []),
        (CRASH, []),  # the copy on r0 still runs: nothing goes back
        (LATER, []),
        # r2 drops the answered batch's queued copy, and forms the next batch
        (("echo", "r2"), ["answer [1]", "expire [3]", "send r2 data [2]", "+copy"]),
        (("echo", "r2"), ["answer [2]"]),
        (("echo", "r0"), ["answer [0]"]),
    ]),
    "reactive": (ModeSettings("reactive", reissue_after_s=0.01), [
        (SUBMIT, ["send r0 data [0]", "wake +10ms"]),
        (SUBMIT, ["send r1 data [1]"]),
        (SUBMIT, ["send r2 data [2]"]),
        (("submit", None, 0.015), []),
        (CRASH, []),  # query 1's task is queued again, at the front
        (("tick",), ["+reissue", "+reissue", "+reissue"]),  # all three still unanswered
        (("at", 0.01), []),
        (("echo", "r2"), ["answer [2]", "send r2 data [1]"]),
        (("echo", "r2"), ["answer [1]", "send r2 data [0]"]),  # the slow r0's re-issue
        (("echo", "r2"), ["answer [0]", "expire [3]"]),
        (("echo", "r0"), []),  # the slow original, no longer needed
    ]),
    "parm": (ModeSettings("parm", parity=ParitySettings(k=2)), [
        (SUBMIT, ["send r0 data [0]", "wake +5ms"]),  # a group opens, closes in 5 ms
        (SUBMIT, ["send r1 data [1]", "+parity", "send p0 parity 0"]),  # ... or when full
        (("submit", None, 0.01), []),
        (CRASH, []),
        (LATER, []),
        (("echo", "p0"), []),  # two batches missing, one parity: nothing to decode yet
        (("echo", "r0"), ["answer [0]", "answer [1] parm-subtraction", "expire [2]"]),
    ]),
    "berrut": (ModeSettings("berrut", K=2, S=1), [
        (SUBMIT, ["+coded", "+coded", "+coded", "send r0 coded 0", "send r1 coded 1",
                  "send r2 coded 2"]),
        (SUBMIT, []),
        (SUBMIT, []),
        (SHORT, []),
        (CRASH, []),  # its coded task is queued again, but r0 and r2 have one of the group
        (LATER, []),
        (("echo", "r2"), ["expire [3]", "+coded", "+coded", "+coded", "send r2 coded 0"]),
        (("echo", "r2"), []),  # one task per replica per group
        (("echo", "r0"), ["answer [0] berrut", "send r0 coded 1"]),  # two of three decode
        (("echo", "r0"), ["answer [1, 2] berrut"]),
    ]),
    "systematic-berrut": (ModeSettings("systematic-berrut", K=2, S=1), [
        (SUBMIT, ["+coded", "send r0 data [0]", "send r1 coded 0"]),
        (SUBMIT, ["+coded", "send r2 data [1]"]),
        (SUBMIT, []),
        (SHORT, []),
        (CRASH, []),
        (LATER, []),
        (("echo", "r2"), ["answer [1]", "send r2 coded 0"]),  # the dead r1's coded task
        (("echo", "r2"), ["answer [0] systematic-berrut", "expire [3]", "+coded",
                          "send r2 data [2]"]),
        (("echo", "r0"), ["late [0]", "send r0 coded 0"]),  # the slow original, too late
        (("echo", "r2"), ["answer [2]"]),
    ]),
}


@pytest.mark.parametrize("mode", SCENARIOS)
def test_slow_dead_and_late_replicas_under_every_mode(mode: str) -> None:
    settings, steps = SCENARIOS[mode]
    rig = Rig(settings)
    pools = ([("r0", DATA_POOL), ("r1", DATA_POOL), ("p0", parity_pool(0))] if mode == "parm"
             else [("r0", DATA_POOL), ("r1", DATA_POOL), ("r2", DATA_POOL)])
    for rid, pool in pools:
        rig.add(rid, pool=pool)
    for event, expected in steps:
        before = len(rig.lines)
        getattr(rig, event[0])(*event[1:])
        assert rig.lines[before:] == expected, event
    answers = rig.answers()
    assert sorted(answers) == list(range(len(rig.queries)))  # each exactly once (a dict)
    for qid, answer in answers.items():
        if answer != "Expire":
            np.testing.assert_allclose(answer, [float(qid)], atol=1e-4)


# ---- batching and deadlines --------------------------------------------------------------
@pytest.mark.parametrize(("delay_s", "events", "expected"), [
    (0.0, [SUBMIT], ["send r0 data [0]"]),
    (0.02, [SUBMIT], ["wake +20ms"]),
    (0.02, [SUBMIT, ("at", 0.01), SUBMIT], ["wake +20ms"]),
    (0.02, [SUBMIT, ("at", 0.01), SUBMIT, ("tick",)], ["wake +20ms", "send r0 data [0, 1]"]),
    (0.02, [SUBMIT, SUBMIT, SUBMIT, SUBMIT], ["wake +20ms", "send r0 data [0, 1, 2, 3]"]),
])
def test_delayed_batching(delay_s: float, events: list[tuple[Any, ...]],
                          expected: list[str]) -> None:
    rig = Rig(ModeSettings(), max_delay_s=delay_s)
    rig.add("r0", initial=4)
    for event in events:
        getattr(rig, event[0])(*event[1:])
    assert rig.lines == expected


def test_queued_queries_that_cannot_finish_in_time_are_answered_not_sent() -> None:
    rig = Rig(ModeSettings())
    rig.add("r0")
    rig.submit()
    rig.at(0.05).echo("r0")  # one batch takes 50 ms: measured
    rig.submit(ttl=0.2)  # sent at once
    rig.submit(ttl=0.07)  # queued: at +100 ms, one more 50 ms batch ends past its deadline
    rig.submit(ttl=1.0)
    rig.at(0.05).echo("r0")
    assert rig.lines[-3:] == ["answer [1]", "expire [2]", "send r0 data [3]"]
    assert rig.machine.shed == 1


def test_a_lone_hopeless_query_is_still_sent_as_the_probe() -> None:
    rig = Rig(ModeSettings())
    rig.add("r0")
    rig.submit()
    rig.at(0.05).echo("r0")
    rig.submit(ttl=0.01)  # cannot finish, but nothing else waits: it refreshes the estimate
    assert rig.lines[-1] == "send r0 data [1]"


def test_admission_counts_what_it_sheds() -> None:
    rig = Rig(ModeSettings(), max_batch=1)
    rig.add("r0", state="starting")
    for _ in range(4):  # 4 full batches per replica before any measurement
        assert rig.machine.admit(1, T0 + 1, T0).admitted
        rig.submit()
    refused = rig.machine.admit(2, T0 + 1, T0)
    assert not refused.admitted and refused.bound == 4 and rig.machine.shed == 2


def test_a_failed_send_marks_the_replica_dead_and_the_next_one_gets_the_batch() -> None:
    rig = Rig(ModeSettings())
    rig.add("r0")
    rig.submit()
    (send,) = rig.actions
    assert isinstance(send, Send)
    rig.add("r1")
    rig.record(rig.machine.send_failed(send.batch, rig.now))
    assert rig.machine.replicas["r0"].state == "dead"
    assert rig.lines == ["send r0 data [0]", "send r1 data [0]"]


def test_shutdown_aborts_queued_and_inflight_queries_once() -> None:
    rig = Rig(ModeSettings())
    rig.add("r0")
    rig.submit()
    rig.submit()
    (abort,) = rig.machine.shutdown()
    assert sorted(e.item.handle for e in abort.entries) == [0, 1]
    assert rig.machine.shutdown() == []


# ---- moved from test_redundancy_dispatch.py: the modes' timers, now on a fake clock ------
def test_reactive_reissues_an_unanswered_batch_to_another_replica() -> None:
    rig = Rig(ModeSettings("reactive", reissue_after_s=0.02))
    rig.add("r1")
    rig.add("r2")
    rig.submit()
    assert rig.lines == ["send r1 data [0]", "wake +20ms"]  # nothing copied up front
    rig.tick()
    assert rig.lines[2:] == ["+reissue", "send r2 data [0]"]  # re-issued after the timeout
    r1, r2 = rig.machine.replicas["r1"], rig.machine.replicas["r2"]
    assert r1.batch is not None and r2.batch is not None and r1.batch.task is r2.batch.task
    rig.echo("r2")
    rig.echo("r1", plus=-7.0)  # the slow original, late
    assert rig.answers() == {0: [0.0]} and rig.lines[-1] == "answer [0]"


def test_reactive_batch_answered_in_time_is_not_reissued() -> None:
    rig = Rig(ModeSettings("reactive", reissue_after_s=0.02))
    rig.add("r1")
    rig.add("r2")
    rig.submit()
    rig.echo("r1")
    rig.tick()
    assert rig.lines == ["send r1 data [0]", "wake +20ms", "answer [0]"]
    assert not rig.machine.mode.has_pending("data")


def test_reactive_error_while_the_reissue_runs_does_not_fail() -> None:
    rig = Rig(ModeSettings("reactive", reissue_after_s=0.01))
    rig.add("r1")
    rig.add("r2")
    rig.submit()
    rig.tick()
    rig.fail("r1")
    assert rig.answers() == {}
    rig.echo("r2")
    assert rig.answers() == {0: [0.0]}


def test_parm_single_batch_group_closes_after_group_wait() -> None:
    rig = Rig(ModeSettings("parm", parity=ParitySettings(k=2, group_wait_s=0.01)))
    for rid, pool in (("d0", DATA_POOL), ("d1", DATA_POOL), ("p0", parity_pool(0))):
        rig.add(rid, pool=pool)
    rig.submit([5.0, 6.0])
    mode = rig.machine.mode
    assert isinstance(mode, Parm) and mode.open is not None
    rig.tick()
    assert rig.lines == ["send d0 data [0]", "wake +10ms", "+parity", "send p0 parity 0"]
    assert mode.open is None
    parity = rig.machine.replicas["p0"].batch
    assert parity is not None
    np.testing.assert_array_equal(parity.task.payload, [[5.0, 6.0]])  # plus a zero batch
    assert rig.crash("d0") == 1  # d0 dies: its batch is retried on d1
    assert rig.lines[-1] == "send d1 data [0]"
    rig.echo("p0")  # but the parity answers first: the batch is rebuilt
    assert rig.lines[-1] == "answer [0] parm-subtraction"
    rig.echo("d1")  # the retry's answer, late, changes nothing
    assert rig.answers() == {0: [5.0, 6.0]}


def test_parm_grace_delays_the_decode() -> None:
    rig = Rig(ModeSettings("parm", parity=ParitySettings(k=2, grace_s=0.02)))
    for rid, pool in (("d0", DATA_POOL), ("d1", DATA_POOL), ("p0", parity_pool(0))):
        rig.add(rid, pool=pool)
    rig.submit()
    rig.submit()
    rig.echo("d1")
    rig.echo("p0")
    assert rig.answers() == {1: [1.0]}  # the slow batch gets its grace period first
    rig.tick()  # the wake-up for the group's wait (it filled): asks for the grace's end
    assert rig.lines[-1] == "wake +20ms"
    rig.tick()
    assert rig.lines[-1] == "answer [0] parm-subtraction"


def test_parm_error_during_the_grace_period_still_rebuilds_the_batch() -> None:
    rig = Rig(ModeSettings("parm", parity=ParitySettings(k=2, grace_s=0.02)))
    for rid, pool in (("d0", DATA_POOL), ("d1", DATA_POOL), ("p0", parity_pool(0))):
        rig.add(rid, pool=pool)
    rig.submit()
    rig.submit()
    rig.echo("d1")
    rig.echo("p0")  # the decode is due once batch 0's grace is over
    rig.fail("d0")  # ... and batch 0's replica errors meanwhile: the decode still answers
    assert 0 not in rig.answers()
    rig.tick()
    rig.tick()
    assert rig.answers() == {0: [0.0], 1: [1.0]}
    assert rig.lines[-1] == "answer [0] parm-subtraction"


def test_set_mode_keeps_reissuing_tasks_of_the_old_mode() -> None:
    # A task the old mode sent re-issues after the switch: the copy must reach the queues
    # idle replicas pull from (the new mode's), not the old mode's, which nobody reads.
    rig = Rig(ModeSettings("reactive", reissue_after_s=0.01))
    rig.add("r1")
    rig.add("r2")
    rig.submit()
    old = rig.machine.mode
    rig.record(rig.machine.set_mode(ModeSettings("reactive", reissue_after_s=1.0), rig.now))
    assert isinstance(rig.machine.mode, Reactive) and rig.machine.mode is not old
    rig.tick()
    assert rig.lines[-1] == "send r2 data [0]"
    rig.echo("r2")
    assert rig.answers() == {0: [0.0]}


def test_set_mode_from_parm_with_an_open_group() -> None:
    # The old mode's open group closes after the switch; its parity goes to the parity pool
    # still deployed (parm -> parm, e.g. a new group wait), and rebuilds the lost batch.
    rig = Rig(ModeSettings("parm", parity=ParitySettings(k=2, group_wait_s=0.01)))
    rig.add("d0")
    rig.add("p0", pool=parity_pool(0))
    rig.submit([5.0])
    rig.record(rig.machine.set_mode(
        ModeSettings("parm", parity=ParitySettings(k=2, group_wait_s=1.0)), rig.now))
    rig.tick()
    assert [line for line in rig.lines if line.startswith("send")] == [
        "send d0 data [0]", "send p0 parity 0"]
    rig.crash("d0")
    rig.echo("p0")
    assert rig.answers() == {0: [5.0]} and rig.lines[-1] == "answer [0] parm-subtraction"


# ---- pools -------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "index", "slot"), [
    ("parity0", 0, True), ("parity12", 12, True), ("data", None, False),
    ("parity", None, False), ("parity²", None, False), ("parityx", None, False),
])
def test_pool_names_are_spelled_and_parsed_in_one_place(name: str, index: int | None,
                                                        slot: bool) -> None:
    assert parity_index(name) == index
    assert is_parity_slot(f"{name}-1") is slot
    if index is not None:
        assert parity_pool(index) == name and slot_name(1, name) == f"{name}-1"
    assert slot_name(2, DATA_POOL) == "2" and not is_parity_slot("2")
    assert not is_parity_slot("parity0-") and not is_parity_slot("parity0-x")


def test_slo_constant_matches_the_rig() -> None:
    assert Rig(ModeSettings()).machine.slo_s == SLO


# ---- the Berrut modes' group wait ----------------------------------------------------------
def _berrut_rig(mode: str, wait_s: float) -> Rig:
    rig = Rig(ModeSettings(mode, K=2, S=1, group_wait_s=wait_s))
    for rid in ("r0", "r1", "r2"):
        rig.add(rid)  # AIMD batch size 1: a full group is K x 1 = 2 queries
    return rig


def test_berrut_group_waits_for_a_second_query_then_codes_both() -> None:
    rig = _berrut_rig("berrut", 0.01)
    rig.submit()
    assert rig.lines == ["wake +10ms"]  # one query: hold the group, not three coded tasks
    rig.at(0.004).submit()  # the group is full: coded at once, before the wait is over
    assert rig.lines[1:] == ["+coded", "+coded", "+coded", "send r0 coded 0",
                             "send r1 coded 1", "send r2 coded 2"]
    rig.echo("r0")
    rig.echo("r1")
    assert rig.lines[-1] == "answer [0, 1] berrut"  # two of three decode both queries
    rig.tick()  # the stale wake-up forms nothing
    assert rig.lines[-1] == "answer [0, 1] berrut" and rig.machine.groups == 1


def test_berrut_group_wait_is_bounded_by_the_oldest_query() -> None:
    rig = _berrut_rig("berrut", 0.01)
    rig.submit()
    rig.at(0.004)
    rig.tick()  # the wake-up asked for, 10 ms after query 0, not after now
    assert rig.now == T0 + 0.01
    assert rig.lines == ["wake +10ms", "+coded", "+coded", "+coded", "send r0 coded 0",
                         "send r1 coded 1", "send r2 coded 2"]
    rig.echo("r2")
    rig.echo("r1")
    assert rig.answers() == {0: [0.0]}


def test_systematic_berrut_group_wait_fills_both_data_batches() -> None:
    rig = _berrut_rig("systematic-berrut", 0.01)
    rig.submit()
    assert rig.lines == ["wake +10ms"]
    rig.submit()
    assert rig.lines[1:] == ["+coded", "send r0 data [0]", "send r1 data [1]",
                             "send r2 coded 0"]
    rig.echo("r1")
    rig.echo("r2")  # the slow r0's batch is rebuilt from the other and the coded one
    assert rig.lines[-2:] == ["answer [1]", "answer [0] systematic-berrut"]


def test_berrut_without_a_group_wait_codes_a_lone_query_at_once() -> None:
    rig = _berrut_rig("berrut", 0.0)
    rig.submit()
    assert rig.lines == ["+coded", "+coded", "+coded", "send r0 coded 0", "send r1 coded 1",
                         "send r2 coded 2"]


def test_the_group_wait_is_the_longer_of_it_and_delayed_batching() -> None:
    rig = Rig(ModeSettings("berrut", K=2, S=1, group_wait_s=0.002), max_delay_s=0.006)
    for rid in ("r0", "r1", "r2"):
        rig.add(rid)
    rig.submit()
    assert rig.lines == ["wake +6ms"]


def test_other_modes_do_not_wait_to_form() -> None:
    rig = Rig(ModeSettings("none", group_wait_s=0.05))  # ignored outside the berrut modes
    rig.add("r0")
    rig.submit()
    assert rig.lines == ["send r0 data [0]"]


@pytest.mark.parametrize("mode", ["parm", "berrut"])
def test_finished_coding_groups_are_freed_without_the_cyclic_collector(mode: str) -> None:
    """A group and its tasks must not form a reference cycle: the serving frontend would
    leave every group to Python's cyclic collector, whose passes then land in the tail."""
    import gc

    from parityserve.core.scheduling.records import GroupRun, Task
    from parityserve.core.simulate import ServiceProfile, SimConfig, simulate

    config = SimConfig(mode=mode, replicas=4, k=2, K=2, S=1, slo_s=1.0)
    gc.collect()
    gc.disable()
    try:
        result = simulate(config, ServiceProfile.constant(5.0), np.arange(400) * 0.004,
                          np.random.default_rng(1))
        left = [o for o in gc.get_objects() if type(o) in (GroupRun, Task)]
    finally:
        gc.enable()
    assert result.summary()["n"] == 400
    assert result.counters["groups"] > 50  # the run coded many groups...
    assert left == []  # ...and refcounting alone freed every one of them and their tasks


def test_a_straggler_replica_does_not_shrink_the_models_queue_bound() -> None:
    """Guards per-replica service estimates: one replica's 3 s batch coming back after twenty
    5 ms ones on the other replica once made the model's one EWMA read 0.6 s a batch, and
    admission shed 'the queue holds 4 of the 4 it can serve in time' for a ParM model whose
    answers never waited for that replica (test_redundancy_serving, beside a CPU hog)."""
    rig = Rig(ModeSettings(), max_batch=1, slo_s=10.0)
    rig.add("r0")
    rig.add("r1")
    rig.submit()  # to r0, the straggler
    for _ in range(20):
        rig.submit()  # to r1
        rig.at(0.005).echo("r1")
    rig.at(3.0 - 20 * 0.005).echo("r0")
    service = rig.machine.service
    assert service.batch_s == pytest.approx(0.005) and service.batches == 21
    # at least what r1 alone finishes within the SLO; the one EWMA gave 31
    assert rig.machine.queue_bound() >= math.floor((10.0 - 0.005) / 0.005)
    rig.crash("r1")  # a replica that is gone no longer speaks for the model
    rig.submit()
    rig.at(3.0).echo("r0")
    assert rig.machine.service.batch_s == pytest.approx(3.0)


def test_a_straggler_measured_alone_does_not_bind_while_a_ready_replica_is_unmeasured() -> None:
    """test_redundancy_serving's ParM flake (series m run 10): the first query went to the
    straggler r0 and ParM answered it, so r1 had never computed a batch. r0's 3 s batch then
    came back and spoke for the model alone, 2 x (10 - 3) / 3 = 4 queries, and 12 concurrent
    queries were shed 'the queue holds 4 of the 4 it can serve in time' although r1 would
    have answered each in milliseconds. What r1 can do is not known yet: until every serving
    replica has been measured, admission keeps the unmeasured rule."""
    rig = Rig(ModeSettings(), max_batch=4, slo_s=10.0)
    rig.add("r0")
    rig.add("r1")
    rig.submit()  # to r0, the straggler
    rig.at(3.0).echo("r0")
    assert rig.machine.service.batch_s == pytest.approx(3.0)  # can_finish still knows r0
    assert rig.machine.queue_bound() == 4 * 4 * 2  # UNMEASURED_BATCHES full batches each
    assert rig.machine.admit(12, rig.now + 10.0, rig.now).admitted
    rig.submit()  # to r0 (idle again), then r1 takes the next
    rig.submit()
    rig.at(0.005).echo("r1")  # both measured now: the pooled rule speaks again
    assert rig.machine.queue_bound() > 4 * 4 * 2  # r1's rate counts: about 2,000
    assert rig.machine.all_measured()


def test_a_replica_let_in_by_a_parallelism_switch_does_not_shrink_a_measured_bound() -> None:
    """The other side (test_parallelism_controller_serving, CI at 5b87446): two fast measured
    replicas, then a switch lets a third serve before it computed anything. Falling back to
    the unmeasured default alone (4 full batches each) bounded the queue at 12 and shed
    queries the measured replicas had room for: the larger of the two holds."""
    rig = Rig(ModeSettings(), max_batch=1, slo_s=10.0)
    rig.add("r0")
    rig.add("r1")
    for _ in range(5):
        rig.submit()
        rig.submit()
        rig.at(0.005).echo("r0")
        rig.echo("r1")
    measured = rig.machine.queue_bound()
    assert measured > 1000
    rig.add("r2")  # ready, never measured
    assert not rig.machine.all_measured()
    assert rig.machine.queue_bound() >= measured
    assert rig.machine.admit(50, rig.now + 10.0, rig.now).admitted
