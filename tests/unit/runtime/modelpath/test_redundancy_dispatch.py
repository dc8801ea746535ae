"""Redundancy modes in the serving path (core/scheduling/modes.py driven by
runtime/modelpath/dispatch.py).

Same approach as ``test_dispatch.py``: a fake link records what would go to workers, results
are handed to ``ModelPath.on_result`` by hand (usually "echo": outputs = inputs, a linear
model that every code decodes exactly or nearly so), and the path reads a fake clock. Only
the modes' own timers (reactive re-issue, ParM's group wait) run on the real event loop,
with timeouts of a few milliseconds. The modes' timer decisions themselves are tested on the
scheduler alone, on a fake clock, in ``test_scheduler.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from parityserve.config import BatchingConfig, Deployment, ParityConfig, RedundancyConfig
from parityserve.core.batching import AIMDController
from parityserve.core.cache import ClockCache
from parityserve.core.scheduling import modes
from parityserve.errors import InvalidInput, PredictError
from parityserve.runtime.modelpath.dispatch import ModelPath, Replica
from parityserve.runtime.modelpath.metrics import Metrics
from parityserve.runtime.workers import wire
from tests.unit.runtime.modelpath.dispatch_fakes import T0, FakeClock, FakeLink

SLO = 0.1


def deployment(mode: str = "none", *, replicas: int = 1, max_batch: int = 8,
               parity: ParityConfig | None = None, **redundancy: Any) -> Deployment:
    return Deployment(
        name="m", source="zoo:echo", replicas=replicas,
        batching=BatchingConfig(max_batch_size=max_batch, max_delay_ms=0.0),
        redundancy=RedundancyConfig(mode=mode, **redundancy), parity=parity)


class Rig:
    """A ModelPath under one redundancy mode, wired to fakes."""

    def __init__(self, dep: Deployment, *, cache_bytes: int = 0) -> None:
        self.clock = FakeClock()
        self.link = FakeLink()
        self.metrics = Metrics()
        self.cache: ClockCache[tuple[str, int, bytes], Any] = ClockCache(cache_bytes)
        self.path = ModelPath(dep, link=self.link, metrics=self.metrics, cache=self.cache,
                              clock=self.clock, slo_s=SLO, max_queue=100)

    def add(self, rid: str, *, initial: int = 1, pool: str = "data",
            state: str = "ready") -> Replica:
        aimd = AIMDController(self.path.deployment.batching.max_batch_size, SLO,
                              initial=initial)
        replica = Replica(rid, len(self.path.replicas), aimd, self.clock(), state=state,
                          pool=pool)
        self.path.replicas[rid] = replica
        return replica

    def submit(self, value: Any, ttl: float = 10.0) -> asyncio.Future[Any]:
        future, cached = self.path.submit(np.asarray(value, dtype=np.float32),
                                          self.clock() + ttl)
        assert not cached
        self.path.pump()  # as if each query came in an event-loop pass of its own
        return future

    def answer(self, index: int, outputs: Any) -> None:
        """Answer the message at ``index`` of the link's log, from the replica it went to."""
        rid, header, _ = self.link.sent[index]
        desc, frames = wire.pack_payload(outputs)
        self.path.on_result(self.path.replicas[rid],
                            {"t": wire.RESULT, "bid": header["bid"], "ok": True, "out": desc},
                            [bytes(f) for f in frames])

    def echo(self, index: int, *, plus: float = 0.0) -> None:
        """Answer like a linear model: outputs = inputs (+ ``plus``, to fake a wrong one)."""
        self.answer(index, np.asarray(self.link.batch(index)) + np.float32(plus))

    def fail(self, index: int, error: str = "ValueError: boom", *,
             bad_input: bool = False) -> None:
        rid, header, _ = self.link.sent[index]
        self.path.on_result(self.path.replicas[rid], {"t": wire.RESULT, "bid": header["bid"],
                                                      "ok": False, "error": error,
                                                      "bad_input": bad_input}, [])


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(body())  # type: ignore[arg-type]


def values(futures: list[asyncio.Future[Any]]) -> list[list[float]]:
    return [f.result().tolist() for f in futures]


def parm(k: int = 2, **options: Any) -> Deployment:
    return deployment("parm", parity=ParityConfig(k=k, **options))


# --- make_redundancy ------------------------------------------------------------------------


@pytest.mark.parametrize(("dep", "kind", "mode"), [
    (deployment(), modes.Redundancy, "none"),
    (deployment("equal-resources"), modes.Redundancy, "none"),
    (deployment("replication", replicas=3, d=3), modes.Replication, "replication"),
    (deployment("reactive", timeout_ms=20), modes.Reactive, "reactive"),
    (parm(), modes.Parm, "parm"),
    (deployment("berrut", replicas=3, K=2, S=1), modes.Berrut, "berrut"),
    (deployment("systematic-berrut", replicas=3, K=2, S=1), modes.Berrut,
     "systematic-berrut"),
])
def test_make_redundancy_picks_the_mode(dep: Deployment, kind: type, mode: str) -> None:
    async def body() -> None:
        redundancy = Rig(dep).path.redundancy
        assert type(redundancy) is kind and redundancy.mode == mode

    run(body)


def test_make_redundancy_carries_the_settings() -> None:
    async def body() -> None:
        replication = Rig(deployment("replication", replicas=3, d=3)).path.redundancy
        assert isinstance(replication, modes.Replication) and replication.copies == 3
        reactive = Rig(deployment("reactive", timeout_ms=20)).path.redundancy
        assert isinstance(reactive, modes.Reactive) and reactive.timeout_s == pytest.approx(0.02)
        berrut = Rig(deployment("berrut", replicas=6, K=2, S=0, E=1)).path.redundancy
        assert isinstance(berrut, modes.Berrut)
        assert (berrut.K, berrut.S, berrut.E, berrut.batches_per_dispatch) == (2, 0, 1, 2)
        assert not berrut.systematic
        assert Rig(deployment()).path.redundancy.batches_per_dispatch == 1

    run(body)


# --- none -----------------------------------------------------------------------------------


def test_none_sends_each_batch_once() -> None:
    async def body() -> None:
        rig = Rig(deployment())
        rig.add("r1")
        rig.add("r2")
        future = rig.submit([1.0])
        assert rig.link.rids() == ["r1"]  # r2 stays idle: nothing is copied
        assert not rig.path.redundancy.has_pending("data")
        rig.echo(0)
        assert future.result().tolist() == [1.0]
        assert rig.path.reconstruction(future) is None and len(rig.link.sent) == 1

    run(body)


def test_an_error_result_splits_the_batch_and_fails_only_the_row_the_model_raised_on() -> None:
    async def body() -> None:
        rig = Rig(deployment())
        futures = [rig.submit([float(i)]) for i in range(2)]
        rig.add("r1", initial=2)
        rig.path.pump()
        rig.fail(0, "RuntimeError: boom")  # the batch of both
        assert not any(f.done() for f in futures)
        assert rig.link.batch(1).tolist() == [[0.0]]  # its halves, one at a time
        rig.fail(1, "RuntimeError: boom")
        rig.echo(2)
        error = futures[0].exception()
        assert isinstance(error, PredictError) and "boom" in str(error)
        assert futures[1].result().tolist() == [1.0]
        assert rig.path.replicas["r1"].idle and not rig.path.inflight

    run(body)


def test_a_row_the_model_blames_alone_fails_as_bad_input() -> None:
    async def body() -> None:
        rig = Rig(deployment())
        rig.add("r1")
        future = rig.submit([-1.0])
        rig.fail(0, "ValueError: negative", bad_input=True)
        error = future.exception()
        assert isinstance(error, InvalidInput) and "ValueError: negative" in str(error)

    run(body)


def test_a_result_the_frontend_refused_is_not_split() -> None:
    async def body() -> None:
        rig = Rig(deployment())
        futures = [rig.submit([float(i)]) for i in range(2)]
        replica = rig.add("r1", initial=2)
        rig.path.pump()
        assert rig.path.refuse_batch(replica, "malformed result")
        assert all(isinstance(f.exception(), PredictError) for f in futures)
        assert len(rig.link.sent) == 1

    run(body)


# --- replication ----------------------------------------------------------------------------


def test_replication_sends_one_batch_to_two_replicas_and_the_first_answer_wins() -> None:
    async def body() -> None:
        rig = Rig(deployment("replication", replicas=2, d=2))
        rig.add("r1")
        rig.add("r2")
        futures = [rig.submit([1.0, 2.0])]
        assert rig.link.rids() == ["r1", "r2"]
        np.testing.assert_array_equal(rig.link.batch(0), rig.link.batch(1))
        assert rig.link.sent[0][1]["bid"] != rig.link.sent[1][1]["bid"]
        task = rig.path.replicas["r1"].batch.task
        assert rig.path.replicas["r2"].batch.task is task and task.running == 2
        rig.echo(1)  # r2 is faster
        assert values(futures) == [[1.0, 2.0]] and task.done
        rig.answer(0, np.array([[-5.0, -5.0]], dtype=np.float32))  # the late copy
        assert values(futures) == [[1.0, 2.0]]
        assert rig.path.replicas["r1"].idle and rig.path.replicas["r2"].idle
        assert not rig.path.inflight and len(rig.link.sent) == 2
        assert rig.path.reconstruction(futures[0]) is None

    run(body)


def test_replication_copies_queue_until_a_replica_is_idle_and_are_dropped_once_answered() -> None:
    async def body() -> None:
        rig = Rig(deployment("replication", replicas=2, d=2))
        rig.add("r1")
        r2 = rig.add("r2", state="starting")
        future = rig.submit([3.0])
        assert rig.link.rids() == ["r1"] and rig.path.redundancy.has_pending("data")
        rig.echo(0)
        assert future.result().tolist() == [3.0]
        r2.state = "ready"
        rig.path.pump()
        assert rig.link.rids() == ["r1"]  # the copy is no longer needed: never sent
        assert not rig.path.redundancy.has_pending("data")

    run(body)


def test_replication_other_copy_answers_when_one_replica_dies() -> None:
    async def body() -> None:
        rig = Rig(deployment("replication", replicas=2, d=2))
        r1 = rig.add("r1")
        rig.add("r2")
        future = rig.submit([4.0])
        assert rig.path.take_back(r1) == 0  # the other copy is still running: nothing requeued
        r1.state = "dead"
        assert not rig.path.redundancy.has_pending("data") and len(rig.path.queue) == 0
        rig.echo(1)
        assert future.result().tolist() == [4.0]
        assert len(rig.link.sent) == 2

    run(body)


def test_replication_last_copy_lost_is_sent_again() -> None:
    async def body() -> None:
        rig = Rig(deployment("replication", replicas=2, d=2))
        r1, r2 = rig.add("r1"), rig.add("r2")
        future = rig.submit([4.0])
        rig.path.take_back(r1)
        r1.state = "dead"
        assert rig.path.take_back(r2) == 1  # the last copy: the task goes back
        r2.state = "dead"
        r3 = rig.add("r3")
        rig.path.pump()
        assert rig.link.rids() == ["r1", "r2", "r3"] and r3.batch is not None
        rig.echo(2)
        assert future.result().tolist() == [4.0]

    run(body)


def test_replication_error_from_one_copy_does_not_fail_while_another_runs() -> None:
    async def body() -> None:
        rig = Rig(deployment("replication", replicas=2, d=2))
        rig.add("r1")
        rig.add("r2")
        future = rig.submit([5.0])
        rig.fail(0)
        assert not future.done()
        rig.echo(1)
        assert future.result().tolist() == [5.0]

    run(body)


def test_replication_error_with_a_copy_still_queued_does_not_fail() -> None:
    async def body() -> None:
        rig = Rig(deployment("replication", replicas=2, d=2))
        rig.add("r1")
        future = rig.submit([5.0])
        assert rig.link.rids() == ["r1"]  # the copy waits: r1 is the only replica
        rig.fail(0)
        assert not future.done()
        assert rig.link.rids() == ["r1", "r1"]  # r1, idle again, pulls the queued copy
        rig.echo(1)
        assert future.result().tolist() == [5.0]

    run(body)


def test_replication_fails_once_every_copy_failed() -> None:
    async def body() -> None:
        rig = Rig(deployment("replication", replicas=2, d=2))
        rig.add("r1")
        rig.add("r2")
        future = rig.submit([5.0])
        rig.fail(0)
        rig.fail(1, "RuntimeError: also broken")
        error = future.exception()
        assert isinstance(error, PredictError) and "also broken" in str(error)

    run(body)


# --- reactive -------------------------------------------------------------------------------


def test_reactive_reissues_an_unanswered_batch_to_another_replica() -> None:
    async def body() -> None:
        rig = Rig(deployment("reactive", replicas=2, timeout_ms=20))
        rig.add("r1")
        rig.add("r2")
        future = rig.submit([6.0])
        assert rig.link.rids() == ["r1"]  # nothing copied up front
        await asyncio.sleep(0.06)
        assert rig.link.rids() == ["r1", "r2"]  # re-issued after the timeout
        np.testing.assert_array_equal(rig.link.batch(1), [[6.0]])
        assert rig.path.replicas["r1"].batch.task is rig.path.replicas["r2"].batch.task
        rig.echo(1)
        assert future.result().tolist() == [6.0]
        rig.answer(0, np.array([[-1.0]], dtype=np.float32))  # the slow original, late
        assert future.result().tolist() == [6.0]
        assert len(rig.link.sent) == 2

    run(body)


# --- ParM -----------------------------------------------------------------------------------


def parm_rig(*, cache_bytes: int = 0, **options: Any) -> tuple[Rig, list[asyncio.Future[Any]]]:
    """k = 2: batch 0 (two rows) on d0, batch 1 (one row) on d1, parity on p0."""
    rig = Rig(parm(**options), cache_bytes=cache_bytes)
    futures = [rig.submit([1.0, 2.0]), rig.submit([3.0, 4.0])]
    rig.add("d0", initial=2)
    rig.add("d1", initial=1)
    rig.add("p0", pool="parity0")
    rig.path.pump()
    assert rig.link.rids() == ["d0"]
    futures.append(rig.submit([10.0, 20.0]))
    return rig, futures


def test_parm_full_group_sends_the_sum_of_its_batches_to_the_parity_replica() -> None:
    async def body() -> None:
        rig, _ = parm_rig()
        assert rig.link.rids() == ["d0", "d1", "p0"]
        np.testing.assert_array_equal(rig.link.batch(0), [[1.0, 2.0], [3.0, 4.0]])
        np.testing.assert_array_equal(rig.link.batch(1), [[10.0, 20.0]])
        # Row-aligned sum; the short batch is padded with a zero row.
        np.testing.assert_array_equal(rig.link.batch(2), [[11.0, 22.0], [3.0, 4.0]])
        parity = rig.path.replicas["p0"].batch.task
        assert parity.kind == "parity" and parity.pool == "parity0" and parity.entries == []
        run_ = parity.group
        assert [t.kind for t in run_.tasks] == ["data", "data", "parity"]
        assert "p0" in run_.assigned and rig.path.redundancy.open is None
        rig.path.fail_all("test over")

    run(body)


def test_parm_rebuilds_a_missing_batch_from_the_others_and_the_parity_output() -> None:
    async def body() -> None:
        rig, futures = parm_rig(cache_bytes=1 << 20)
        rig.echo(1)  # batch 1 answers itself
        assert values(futures[2:]) == [[10.0, 20.0]]
        assert rig.path.reconstruction(futures[2]) is None
        assert not futures[0].done()
        rig.echo(2)  # the parity output: the "model" is linear, so f(a + b) = f(a) + f(b)
        assert values(futures[:2]) == [[1.0, 2.0], [3.0, 4.0]]  # exact
        for future in futures[:2]:
            assert rig.path.reconstruction(future) == "parm-subtraction"
        # The slow original arrives: the answer stands, its own prediction goes to the cache.
        rig.answer(0, np.array([[1.5, 2.5], [3.5, 4.5]], dtype=np.float32))
        assert values(futures[:2]) == [[1.0, 2.0], [3.0, 4.0]]
        await asyncio.sleep(0)  # let done-callbacks run
        for item, own in (([1.0, 2.0], [1.5, 2.5]), ([3.0, 4.0], [3.5, 4.5])):
            key = rig.path._key(np.asarray(item, dtype=np.float32))
            cached = rig.cache.get(key)
            assert cached is not None and cached[0].tolist() == own
        assert not rig.path.inflight

    run(body)


def test_parm_without_a_cache_ignores_the_late_original() -> None:
    async def body() -> None:
        rig, futures = parm_rig()
        rig.echo(1)
        rig.echo(2)
        rig.answer(0, np.array([[-1.0, -1.0], [-1.0, -1.0]], dtype=np.float32))
        assert values(futures) == [[1.0, 2.0], [3.0, 4.0], [10.0, 20.0]]
        assert rig.path.reconstruction(futures[0]) == "parm-subtraction"

    run(body)


def test_parm_group_answered_by_its_originals_decodes_nothing() -> None:
    async def body() -> None:
        rig, futures = parm_rig()
        rig.echo(0)
        rig.echo(1)
        assert values(futures) == [[1.0, 2.0], [3.0, 4.0], [10.0, 20.0]]
        assert all(rig.path.reconstruction(f) is None for f in futures)
        run_ = rig.path.replicas["p0"].batch.task.group
        assert run_.finished
        rig.echo(2)  # the parity output, no longer needed, changes nothing
        assert values(futures) == [[1.0, 2.0], [3.0, 4.0], [10.0, 20.0]]

    run(body)


def test_parm_batch_answered_before_the_next_joins_keeps_the_group_open() -> None:
    """Found by a flaky integration test: the first batch answered before the second joined,
    the group counted as finished, the second batch's parity was never sent, and when its
    replica crashed its query was lost."""
    async def body() -> None:
        rig = Rig(parm())
        rig.add("d0", initial=1)
        rig.add("p0", pool="parity0")
        first = rig.submit([1.0, 2.0])
        rig.echo(0)  # answered while the group is still open, waiting for a second batch
        assert values([first]) == [[1.0, 2.0]]
        second = rig.submit([3.0, 4.0])  # joins the same group, which is now full
        assert rig.link.rids() == ["d0", "d0", "p0"]  # so the parity goes out
        assert rig.path.take_back(rig.path.replicas["d0"]) == 1  # d0 crashed: requeued
        rig.echo(2)  # the parity output rebuilds it anyway, first
        assert values([second]) == [[3.0, 4.0]]
        assert rig.path.reconstruction(second) == "parm-subtraction"
        rig.path.fail_all("test over")

    run(body)


def test_parm_parity_before_the_others_waits_for_them() -> None:
    async def body() -> None:
        rig, futures = parm_rig()
        rig.echo(2)  # parity first: two batches still missing, one parity: cannot decode
        assert not any(f.done() for f in futures)
        rig.echo(0)
        assert values(futures[2:]) == [[10.0, 20.0]]
        assert rig.path.reconstruction(futures[2]) == "parm-subtraction"

    run(body)


def test_parm_second_group_opens_after_the_first_is_full() -> None:
    async def body() -> None:
        rig = Rig(parm())
        for rid in ("d0", "d1", "d2", "d3"):
            rig.add(rid)
        rig.add("p0", pool="parity0")
        rig.add("p1", pool="parity0")
        futures = [rig.submit([float(i)]) for i in range(4)]
        assert rig.link.rids() == ["d0", "d1", "p0", "d2", "d3", "p1"]
        np.testing.assert_array_equal(rig.link.batch(2), [[1.0]])
        np.testing.assert_array_equal(rig.link.batch(5), [[5.0]])
        groups = {rig.path.replicas[r].batch.task.group for r in ("d0", "d2")}
        assert len(groups) == 2
        rig.echo(0)
        rig.echo(4)
        rig.echo(2)
        rig.echo(5)
        assert values(futures) == [[0.0], [1.0], [2.0], [3.0]]
        assert [rig.path.reconstruction(f) for f in futures] == [
            None, "parm-subtraction", "parm-subtraction", None]

    run(body)


def test_parm_error_fails_the_group_only_when_nothing_can_answer() -> None:
    async def body() -> None:
        unusable = np.zeros((3, 2), np.float32)  # three rows for two: refused, not raised
        rig, futures = parm_rig()
        rig.answer(0, unusable)  # batch 0's outputs are refused: the parity can rebuild it
        assert not futures[0].done()
        rig.echo(1)
        rig.echo(2)
        assert values(futures[:2]) == [[1.0, 2.0], [3.0, 4.0]]
        assert rig.path.reconstruction(futures[0]) == "parm-subtraction"

        rig, futures = parm_rig()
        rig.answer(0, unusable)
        rig.fail(2, "RuntimeError: parity broken")
        rig.echo(1)
        assert values(futures[2:]) == [[10.0, 20.0]]
        for future in futures[:2]:
            assert isinstance(future.exception(), PredictError)

    run(body)


def test_parm_a_batch_the_model_raised_on_leaves_its_group_and_is_split() -> None:
    # Not rebuilt from the parity: the parity of a bad row would rebuild garbage for it.
    async def body() -> None:
        rig, futures = parm_rig()
        rig.fail(0)  # batch 0, two rows: split; d0 takes the first half at once
        rig.fail(2, "RuntimeError: parity broken")  # the group's parity fails too
        assert rig.link.rids() == ["d0", "d1", "p0", "d0"]
        rig.echo(1)  # batch 1 answers itself; d1 takes the second half
        assert values(futures[2:]) == [[10.0, 20.0]]
        assert not futures[0].done() and not futures[1].done()
        rig.fail(3, "ValueError: a bad row", bad_input=True)
        rig.echo(4)
        assert isinstance(futures[0].exception(), InvalidInput)
        assert values(futures[1:2]) == [[3.0, 4.0]]
        assert rig.path.reconstruction(futures[1]) is None

    run(body)


# --- Berrut (ApproxIFER) --------------------------------------------------------------------


def test_berrut_codes_two_batches_into_three_tasks_on_three_replicas() -> None:
    async def body() -> None:
        rig = Rig(deployment("berrut", replicas=3, K=2, S=1))
        inputs = [[1.0, 2.0], [3.0, 5.0], [-2.0, 7.0], [4.0, 0.5]]
        futures = [rig.submit(x) for x in inputs]
        for rid in ("r0", "r1", "r2"):
            rig.add(rid, initial=2)
        rig.path.pump()  # one dispatch: 2 * K queries, two batches, three coded tasks
        assert rig.link.rids() == ["r0", "r1", "r2"]
        tasks = [rig.path.replicas[r].batch.task for r in ("r0", "r1", "r2")]
        assert [t.kind for t in tasks] == ["coded"] * 3 and [t.slot for t in tasks] == [0, 1, 2]
        assert len({id(t.group) for t in tasks}) == 1 and all(t.entries == [] for t in tasks)
        run_ = tasks[0].group
        assert run_.assigned == {"r0", "r1", "r2"}
        assert [len(es) for es in run_.entries.values()] == [2, 2]
        assert all(rig.link.batch(i).shape == (2, 2) for i in range(3))
        rig.echo(2)
        assert not any(f.done() for f in futures)
        rig.echo(0)  # any two results decode
        for future, x in zip(futures, inputs, strict=True):
            np.testing.assert_allclose(future.result(), x, rtol=1e-4, atol=1e-4)
            assert rig.path.reconstruction(future) == "berrut"
        rig.echo(1)  # the third result changes nothing
        for future, x in zip(futures, inputs, strict=True):
            np.testing.assert_allclose(future.result(), x, rtol=1e-4, atol=1e-4)
        assert all(r.located == 0 for r in rig.path.replicas.values())

    run(body)


def test_aimd_learns_from_the_rows_a_coded_task_computed() -> None:
    # Coded tasks answer no query directly; AIMD must still count their rows, or a Berrut
    # replica's batch-size limit would never grow past its additive step.
    async def body() -> None:
        rig = Rig(deployment("berrut", replicas=3, K=2, S=1))
        futures = [rig.submit([float(i), 1.0]) for i in range(4)]
        for rid in ("r0", "r1", "r2"):
            rig.add(rid, initial=2)
        rig.path.pump()
        before = rig.path.replicas["r0"].aimd.max_batch_size
        rig.echo(0)
        rig.echo(1)
        assert all(f.done() for f in futures)
        assert rig.path.replicas["r0"].aimd.max_batch_size == before + 1  # on time: +1 row

    run(body)


@pytest.mark.parametrize("pair", [(0, 1), (0, 2), (1, 2)])
def test_berrut_any_two_of_three_results_decode(pair: tuple[int, int]) -> None:
    async def body() -> None:
        rig = Rig(deployment("berrut", replicas=3, K=2, S=1))
        inputs = [[1.0], [3.0], [-2.0], [6.0]]
        futures = [rig.submit(x) for x in inputs]
        for rid in ("r0", "r1", "r2"):
            rig.add(rid, initial=2)
        rig.path.pump()
        for i in pair:
            rig.echo(i)
        for future, x in zip(futures, inputs, strict=True):
            np.testing.assert_allclose(future.result(), x, rtol=1e-4, atol=1e-4)

    run(body)


def test_berrut_no_replica_gets_two_tasks_of_one_group() -> None:
    async def body() -> None:
        rig = Rig(deployment("berrut", replicas=3, K=2, S=1))
        futures = [rig.submit([float(i)]) for i in range(2)]
        rig.add("r0")
        rig.add("r1")
        r2 = rig.add("r2", state="starting")
        rig.path.pump()
        assert rig.link.rids() == ["r0", "r1"]  # the third task waits for a third replica
        run_ = rig.path.replicas["r0"].batch.task.group
        # r0 answers and is idle again, but may not take the group's third task.
        rig.answer(0, np.asarray(rig.link.batch(0)))
        assert rig.link.rids() == ["r0", "r1"] and rig.path.redundancy.has_pending("data")
        r2.state = "ready"
        rig.path.pump()
        assert rig.link.rids() == ["r0", "r1", "r2"]
        assert run_.assigned == {"r0", "r1", "r2"}
        rig.echo(2)
        for i, future in enumerate(futures):
            np.testing.assert_allclose(future.result(), [float(i)], atol=1e-4)

    run(body)


def test_berrut_error_locator_names_the_corrupted_replica_only() -> None:
    async def body() -> None:
        rig = Rig(deployment("berrut", replicas=6, K=2, S=0, E=1))
        inputs = [[1.0, 2.0], [3.0, -1.0], [0.5, 4.0], [2.0, 2.0]]
        futures = [rig.submit(x) for x in inputs]
        rids = [f"r{i}" for i in range(6)]
        for rid in rids:
            rig.add(rid, initial=2)
        rig.path.pump()
        assert rig.link.rids() == rids
        for i in range(6):
            rig.echo(i, plus=100.0 if i == 3 else 0.0)
        assert [rig.path.replicas[r].located for r in rids] == [0, 0, 0, 1, 0, 0]
        for future, x in zip(futures, inputs, strict=True):
            assert rig.path.reconstruction(future) == "berrut"
            # Berrut is only approximate past two nodes, but far from the +100 error.
            np.testing.assert_allclose(future.result(), x, atol=1.0)

    run(body)


def test_berrut_error_results_fail_the_group_once_nothing_else_can_answer() -> None:
    # Refused outputs (not the model raising): nothing to retry, the queries fail.
    async def body() -> None:
        rig = Rig(deployment("berrut", replicas=3, K=2, S=1))
        futures = [rig.submit([float(i)]) for i in range(2)]
        for rid in ("r0", "r1", "r2"):
            rig.add(rid)
        rig.path.pump()
        unusable = np.zeros((3, 1), np.float32)  # three rows for one
        rig.answer(0, unusable)
        rig.answer(1, unusable)
        assert not any(f.done() for f in futures)  # r2 still runs its task
        rig.answer(2, unusable)
        for future in futures:
            error = future.exception()
            assert isinstance(error, PredictError) and "unusable outputs" in str(error)
        assert len(rig.link.sent) == 3

    run(body)


def test_berrut_group_the_model_raised_on_is_sent_again_uncoded() -> None:
    # Two errors, then the third result: one result cannot decode K = 2 batches, and no task
    # is left that could help. A coded task mixes every row of the group, so no row can be
    # blamed: its batches go again uncoded (split there if they fail), each failing alone.
    async def body() -> None:
        rig = Rig(deployment("berrut", replicas=3, K=2, S=1))
        futures = [rig.submit([float(i)]) for i in range(2)]
        for rid in ("r0", "r1", "r2"):
            rig.add(rid)
        rig.path.pump()
        rig.fail(0)
        rig.fail(1, "RuntimeError: two gone")
        assert not any(f.done() for f in futures)
        rig.echo(2)
        assert rig.link.rids()[3:] == ["r0", "r1"]  # one plain batch per coded batch
        assert [rig.link.batch(i).tolist() for i in (3, 4)] == [[[0.0]], [[1.0]]]
        rig.fail(3, "RuntimeError: two gone")
        rig.echo(4)
        error = futures[0].exception()
        assert isinstance(error, PredictError) and "two gone" in str(error)
        assert futures[1].result().tolist() == [1.0]
        assert rig.path.reconstruction(futures[1]) is None

    run(body)


def test_berrut_with_fewer_queries_than_k_pads_the_group() -> None:
    async def body() -> None:
        rig = Rig(deployment("berrut", replicas=3, K=2, S=1))
        for rid in ("r0", "r1", "r2"):
            rig.add(rid)
        future = rig.submit([9.0])
        assert rig.link.rids() == ["r0", "r1", "r2"]
        rig.echo(0)
        rig.echo(1)
        np.testing.assert_allclose(future.result(), [9.0], atol=1e-4)
        assert rig.path.reconstruction(future) == "berrut"

    run(body)


def test_berrut_with_uncodable_inputs_sends_them_plainly() -> None:
    async def body() -> None:
        rig = Rig(deployment("berrut", replicas=3, K=2, S=1))
        futures = [rig.path.submit(word, T0 + 10)[0] for word in ("a", "b")]
        for rid in ("r0", "r1", "r2"):
            rig.add(rid)
        rig.path.pump()
        assert rig.link.rids() == ["r0", "r1"]  # two plain batches, no coded ones
        assert rig.link.batch(0) == ["a"] and rig.link.batch(1) == ["b"]
        rig.answer(0, ["A"])
        rig.fail(1, "ValueError: no b")
        assert futures[0].result() == "A"
        assert isinstance(futures[1].exception(), PredictError)
        assert rig.path.reconstruction(futures[0]) is None

    run(body)


# --- systematic Berrut ----------------------------------------------------------------------


def systematic_rig() -> tuple[Rig, list[asyncio.Future[Any]], list[list[float]]]:
    rig = Rig(deployment("systematic-berrut", replicas=3, K=2, S=1))
    inputs = [[1.0, 2.0], [3.0, 5.0], [-2.0, 7.0], [4.0, 0.5]]
    futures = [rig.submit(x) for x in inputs]
    for rid in ("r0", "r1", "r2"):
        rig.add(rid, initial=2)
    rig.path.pump()
    return rig, futures, inputs


def test_systematic_berrut_originals_settle_directly() -> None:
    async def body() -> None:
        rig, futures, inputs = systematic_rig()
        assert rig.link.rids() == ["r0", "r1", "r2"]
        tasks = [rig.path.replicas[r].batch.task for r in ("r0", "r1", "r2")]
        assert [t.kind for t in tasks] == ["data", "data", "coded"]
        np.testing.assert_array_equal(rig.link.batch(0), inputs[:2])
        np.testing.assert_array_equal(rig.link.batch(1), inputs[2:])
        rig.echo(1)
        assert values(futures[2:]) == inputs[2:] and not futures[0].done()
        rig.echo(0)
        assert values(futures) == inputs
        assert all(rig.path.reconstruction(f) is None for f in futures)
        assert tasks[0].group.finished
        rig.echo(2)  # the coded result, no longer needed
        assert values(futures) == inputs

    run(body)


def test_systematic_berrut_rebuilds_a_missing_original_from_the_coded_result() -> None:
    async def body() -> None:
        rig, futures, inputs = systematic_rig()
        rig.echo(1)
        rig.echo(2)
        for future, x in zip(futures[:2], inputs[:2], strict=True):
            np.testing.assert_allclose(future.result(), x, rtol=1e-4, atol=1e-4)
            assert rig.path.reconstruction(future) == "systematic-berrut"
        assert values(futures[2:]) == inputs[2:]
        assert all(rig.path.reconstruction(f) is None for f in futures[2:])
        rig.answer(0, np.full((2, 2), -1.0, dtype=np.float32))  # the late original
        for future, x in zip(futures[:2], inputs[:2], strict=True):
            np.testing.assert_allclose(future.result(), x, rtol=1e-4, atol=1e-4)

    run(body)


def test_systematic_berrut_subtract_decoder_rebuilds_unrelated_inputs_exactly() -> None:
    # zoo:echo is affine, so the subtraction decoder (set in the deployment) rebuilds the
    # missing batch exactly even from inputs that do not lie on a smooth curve.
    async def body() -> None:
        rig = Rig(deployment("systematic-berrut", replicas=5, K=4, S=1, decoder="subtract",
                             max_batch=1))
        inputs = [[1.0, -9.0], [30.0, 5.0], [-2.0, 70.0], [4.0, 0.5]]
        futures = [rig.submit(x) for x in inputs]
        for rid in ("r0", "r1", "r2", "r3", "r4"):
            rig.add(rid, initial=1)
        rig.path.pump()
        code = rig.path.replicas["r0"].batch.task.group.core.code
        assert code.decoder == "subtract"
        for i in (1, 2, 3, 4):
            rig.echo(i)
        np.testing.assert_allclose(future_values := values(futures), inputs, rtol=1e-4,
                                   atol=1e-3)
        assert future_values[0] != inputs[1]  # not a neighbour's answer
        assert rig.path.reconstruction(futures[0]) == "systematic-berrut"

    run(body)


def test_systematic_berrut_fails_a_batch_that_nothing_can_answer() -> None:
    async def body() -> None:
        rig, futures, _ = systematic_rig()
        unusable = np.zeros((3, 2), np.float32)  # refused outputs: nothing to split
        rig.answer(0, unusable)
        rig.answer(2, unusable)
        rig.echo(1)  # batch 1 answers itself; batch 0 has neither original nor code
        assert values(futures[2:]) == [[-2.0, 7.0], [4.0, 0.5]]
        for future in futures[:2]:
            assert isinstance(future.exception(), PredictError)

    run(body)


def test_systematic_berrut_a_batch_the_model_raised_on_is_split_not_decoded() -> None:
    async def body() -> None:
        rig, futures, _ = systematic_rig()
        rig.fail(0)  # batch 0's original raised: its rows leave the group, split in two
        rig.fail(2)  # the coded task raised too
        rig.echo(1)  # batch 1 answers itself
        assert values(futures[2:]) == [[-2.0, 7.0], [4.0, 0.5]]
        assert [rig.link.batch(i).tolist() for i in (3, 4)] == [[[1.0, 2.0]], [[3.0, 5.0]]]
        rig.echo(3)
        rig.fail(4, "ValueError: bad row", bad_input=True)
        assert values(futures[:1]) == [[1.0, 2.0]]
        assert isinstance(futures[1].exception(), InvalidInput)

    run(body)


# --- set_redundancy -------------------------------------------------------------------------


def test_set_redundancy_new_batches_use_the_new_mode() -> None:
    async def body() -> None:
        rig = Rig(deployment(replicas=2))
        rig.add("r1")
        rig.add("r2")
        first = rig.submit([1.0])
        assert rig.link.rids() == ["r1"]
        rig.echo(0)
        rig.path.set_redundancy(deployment("replication", replicas=2, d=2))
        assert isinstance(rig.path.redundancy, modes.Replication)
        assert rig.path.deployment.redundancy.mode == "replication"
        second = rig.submit([2.0])
        assert rig.link.rids() == ["r1", "r1", "r2"]  # now copied
        rig.echo(2)
        assert values([first, second]) == [[1.0], [2.0]]
        rig.path.set_redundancy(deployment(replicas=2))
        rig.echo(1)  # the old copy's late answer is harmless
        third = rig.submit([3.0])
        assert rig.link.rids() == ["r1", "r1", "r2", "r1"]  # and no longer copied
        rig.echo(3)
        assert values([third]) == [[3.0]]

    run(body)


def test_set_redundancy_moves_queued_tasks_to_the_new_mode() -> None:
    async def body() -> None:
        rig = Rig(deployment("replication", replicas=2, d=2))
        rig.add("r1")
        r2 = rig.add("r2", state="starting")
        future = rig.submit([4.0])
        old = rig.path.redundancy
        assert old.has_pending("data")  # the copy waits for a second replica
        copy = old.pending["data"][0]
        rig.path.set_redundancy(deployment(replicas=2))
        new = rig.path.redundancy
        assert new is not old and type(new) is modes.Redundancy
        assert list(new.pending["data"]) == [copy]
        r2.state = "ready"
        rig.path.pump()
        assert rig.link.rids() == ["r1", "r2"] and r2.batch.task is copy
        rig.echo(1)
        assert future.result().tolist() == [4.0]

    run(body)


def test_set_redundancy_to_berrut_forms_coded_groups() -> None:
    async def body() -> None:
        rig = Rig(deployment(replicas=3))
        rig.path.set_redundancy(deployment("berrut", replicas=3, K=2, S=1))
        futures = [rig.submit([float(i)]) for i in range(2)]
        for rid in ("r0", "r1", "r2"):
            rig.add(rid)
        rig.path.pump()
        assert rig.link.rids() == ["r0", "r1", "r2"]
        assert all(rig.path.replicas[r].batch.task.kind == "coded" for r in ("r0", "r1", "r2"))
        rig.echo(0)
        rig.echo(1)
        for i, future in enumerate(futures):
            np.testing.assert_allclose(future.result(), [float(i)], atol=1e-4)

    run(body)


def test_set_redundancy_from_parm_drops_the_parity_queue() -> None:
    async def body() -> None:
        rig = Rig(parm())
        rig.add("d0")
        rig.add("d1")
        futures = [rig.submit([1.0]), rig.submit([2.0])]  # the parity task waits: no p0
        assert rig.path.redundancy.has_pending("parity0")
        rig.path.set_redundancy(deployment(replicas=2))
        assert not rig.path.redundancy.has_pending("parity0")
        rig.echo(0)
        rig.echo(1)
        assert values(futures) == [[1.0], [2.0]]

    run(body)


def test_set_redundancy_then_a_lost_task_of_the_old_mode_is_sent_again() -> None:
    async def body() -> None:
        rig = Rig(deployment("replication", replicas=2, d=2))
        r1, r2 = rig.add("r1"), rig.add("r2")
        future = rig.submit([4.0])
        rig.path.set_redundancy(deployment(replicas=2))
        for replica in (r1, r2):
            rig.path.take_back(replica)
            replica.state = "dead"
        rig.add("r3")
        rig.path.pump()
        assert rig.link.rids() == ["r1", "r2", "r3"]
        rig.echo(2)
        assert future.result().tolist() == [4.0]

    run(body)
