"""One model's serving path (parityserve.runtime.modelpath.dispatch) over a fake link and a fake
clock.

No processes and no real waiting: the fake link records what would go to workers, results are
handed to ``on_result`` by hand, and the path reads time from a mutable fake clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from parityserve.config import BatchingConfig, Deployment
from parityserve.core.batching import AIMDController
from parityserve.core.cache import ClockCache
from parityserve.errors import PredictError, QueueFull, WorkerError
from parityserve.runtime.modelpath import dispatch
from parityserve.runtime.modelpath.dispatch import ModelPath, Replica
from parityserve.runtime.modelpath.metrics import Metrics
from parityserve.runtime.workers import wire
from tests.unit.runtime.modelpath.dispatch_fakes import T0, FakeClock, FakeLink

SLO = 0.1


class Rig:
    """A ModelPath wired to fakes, plus helpers to add replicas and answer batches."""

    def __init__(self, *, max_batch: int = 8, max_delay_ms: float = 0.0, max_queue: int = 100,
                 cache_bytes: int = 0, clock: FakeClock | None = None) -> None:
        self.clock = clock or FakeClock()
        self.link = FakeLink()
        self.metrics = Metrics()
        self.cache: ClockCache[tuple[str, int, bytes], Any] = ClockCache(cache_bytes)
        deployment = Deployment(
            name="m", source="zoo:echo",
            batching=BatchingConfig(max_batch_size=max_batch, max_delay_ms=max_delay_ms))
        self.path = ModelPath(deployment, link=self.link, metrics=self.metrics, cache=self.cache,
                              clock=self.clock, slo_s=SLO, max_queue=max_queue)

    def add(self, rid: str, *, initial: int = 1, ceiling: int | None = None) -> Replica:
        ceiling = ceiling or self.path.deployment.batching.max_batch_size
        aimd = AIMDController(ceiling, SLO, initial=initial)
        replica = Replica(rid, len(self.path.replicas), aimd, self.clock(), state="ready")
        self.path.replicas[rid] = replica
        return replica

    def submit(self, value: Any, ttl: float = 10.0) -> asyncio.Future[Any]:
        future, cached = self.path.submit(np.asarray(value, dtype=np.float32),
                                          self.clock() + ttl)
        assert not cached
        # The path pumps once per event-loop pass; these tests step it query by query, as
        # if each query came in a pass of its own (the coalescing has tests of its own).
        self.path.pump()
        return future

    def answer(self, replica: Replica, header: dict[str, Any], outputs: Any,
               **extra: Any) -> None:
        desc, frames = wire.pack_payload(outputs)
        self.path.on_result(replica, {"t": wire.RESULT, "bid": header["bid"], "ok": True,
                                      "out": desc, **extra}, [bytes(f) for f in frames])

    def echo(self, replica: Replica, index: int = -1, scale: float = 1.0) -> None:
        """Answer the message at ``index`` of the link's log with its input times ``scale``."""
        header = self.link.sent[index][1]
        self.answer(replica, header, np.asarray(self.link.batch(index)) * scale)


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(body())  # type: ignore[arg-type]


def failure(future: asyncio.Future[Any]) -> BaseException | None:
    assert future.done()
    return future.exception()


def test_public_names() -> None:
    assert sorted(dispatch.__all__) == [
        "DATA_POOL", "InflightBatch", "ModelPath", "Query", "Replica", "ReplicaStats", "Task"]


# --- one query, one batch -----------------------------------------------------------------


def test_query_goes_to_an_idle_replica_and_its_result_resolves_the_future() -> None:
    async def body() -> None:
        rig = Rig()
        r1 = rig.add("r1")
        future = rig.submit([1.0, 2.0])
        assert len(rig.link.sent) == 1
        rid, header, _ = rig.link.sent[0]
        assert rid == "r1" and header["t"] == wire.PREDICT and isinstance(header["bid"], int)
        np.testing.assert_array_equal(rig.link.batch(0), [[1.0, 2.0]])
        assert not r1.idle and not future.done()
        assert rig.path.replica_stats()[0].inflight == 1
        rig.echo(r1, scale=10)
        np.testing.assert_array_equal(future.result(), [10.0, 20.0])
        assert r1.idle and r1.served == 1 and not rig.path.inflight

    run(body)


def test_queries_of_one_event_loop_pass_leave_as_one_batch() -> None:
    async def body() -> None:
        rig = Rig()
        r1 = rig.add("r1", initial=8)
        futures = [rig.path.submit(np.full(2, i, np.float32), T0 + 10)[0] for i in range(5)]
        assert rig.link.sent == []  # nothing leaves before the pass ends
        await asyncio.sleep(0)
        assert len(rig.link.sent) == 1  # one pump for the pass, one batch of all five
        np.testing.assert_array_equal(rig.link.batch(0)[:, 0], [0, 1, 2, 3, 4])
        later = rig.path.submit(np.full(2, 9, np.float32), T0 + 10)[0]
        await asyncio.sleep(0)
        assert len(rig.link.sent) == 1 and len(rig.path.queue) == 1  # r1 is busy: it waits
        rig.echo(r1)
        assert all(f.done() for f in futures) and len(rig.link.sent) == 2
        rig.echo(r1)
        assert later.result().tolist() == [9.0, 9.0]

    run(body)


def test_a_pass_pump_finding_the_queue_already_served_sends_nothing_more() -> None:
    async def body() -> None:
        rig = Rig()
        rig.add("r1", initial=8)
        rig.path.submit(np.ones(2, np.float32), T0 + 10)
        rig.path.pump()  # something else (a replica joining) pumped first
        assert len(rig.link.sent) == 1
        await asyncio.sleep(0)
        assert len(rig.link.sent) == 1 and not rig.path.queue

    run(body)


def test_batch_rows_follow_deadline_order_and_answers_map_back_in_order() -> None:
    async def body() -> None:
        rig = Rig()
        late = rig.submit([1.0], ttl=9.0)
        early = rig.submit([2.0], ttl=3.0)
        middle = rig.submit([3.0], ttl=5.0)
        assert rig.link.sent == []  # no replica yet: everything waits in the queue
        r1 = rig.add("r1", initial=3)
        rig.path.pump()
        assert len(rig.link.sent) == 1
        np.testing.assert_array_equal(rig.link.batch(0), [[2.0], [3.0], [1.0]])
        rig.answer(r1, rig.link.sent[0][1], np.array([20.0, 30.0, 10.0], dtype=np.float32))
        assert [f.result() for f in (late, early, middle)] == [10.0, 20.0, 30.0]

    run(body)


# --- AIMD batch sizes ---------------------------------------------------------------------


def test_batch_size_follows_aimd_and_respects_the_ceiling() -> None:
    async def body() -> None:
        rig = Rig(max_batch=4)
        for i in range(14):
            rig.submit([float(i)])
        r1 = rig.add("r1", initial=2)
        rig.path.pump()
        sizes = []
        while rig.link.sent and len(sizes) < 10:
            sizes.append(len(rig.link.batch(-1)))
            before = len(rig.link.sent)
            rig.clock.advance(SLO / 10)  # well inside the SLO: full batches grow the limit
            rig.echo(r1)
            if len(rig.link.sent) == before:
                break
        assert sizes == [2, 3, 4, 4, 1]  # 2 + 3 + 4 + 4 + 1 = 14; never above the ceiling 4
        assert r1.aimd.max_batch_size == 4
        assert len(rig.path.queue) == 0

    run(body)


def test_aimd_backs_off_when_a_batch_takes_longer_than_the_slo() -> None:
    async def body() -> None:
        rig = Rig(max_batch=16)
        for i in range(20):
            rig.submit([float(i)])
        r1 = rig.add("r1", initial=10)
        rig.path.pump()
        assert len(rig.link.batch(-1)) == 10
        rig.clock.advance(SLO * 2)  # the batch came back late
        rig.echo(r1)
        assert r1.aimd.max_batch_size == 9
        assert r1.aimd.statistics().backoffs == 1
        assert len(rig.link.batch(-1)) == 9  # the next batch already uses the smaller limit
        assert [s.max_batch_size for s in rig.path.replica_stats()] == [9]

    run(body)


def test_replica_statistics_split_each_round_trip_into_worker_time_and_the_rest() -> None:
    async def body() -> None:
        rig = Rig()
        r1 = rig.add("r1")
        rig.submit([1.0])
        rig.clock.advance(0.005)
        rig.answer(r1, rig.link.sent[-1][1], np.ones((1, 1)), ms=3.0)
        rig.submit([2.0])
        rig.clock.advance(0.002)
        rig.answer(r1, rig.link.sent[-1][1], np.ones((1, 1)))  # a worker that does not say
        stats = rig.path.replica_stats()[0]
        assert stats.served == 2
        assert stats.round_trip_s == pytest.approx(0.007)
        assert stats.worker_s == pytest.approx(0.003)
        rig.submit([3.0])
        header = rig.link.sent[-1][1]
        assert rig.path.take_back(r1) == 1
        rig.clock.advance(1.0)
        rig.answer(r1, header, np.ones((1, 1)), ms=900.0)  # late: re-dispatched, not counted
        assert rig.path.replica_stats()[0].round_trip_s == pytest.approx(0.007)

    run(body)


# --- delayed batching ---------------------------------------------------------------------


def test_delayed_batching_holds_a_partial_batch_until_the_delay_passed() -> None:
    async def body() -> None:
        rig = Rig(max_batch=8, max_delay_ms=20)
        rig.add("r1", initial=4)
        rig.submit([1.0])
        assert rig.link.sent == [] and rig.path._wake is not None  # a wake-up is scheduled
        rig.clock.advance(0.010)
        rig.submit([2.0])
        rig.path.pump()
        assert rig.link.sent == []  # 10 ms into a 20 ms delay: still waiting
        rig.clock.advance(0.010)
        rig.path._on_wake()  # what the scheduled timer does when it fires
        assert len(rig.link.sent) == 1
        np.testing.assert_array_equal(rig.link.batch(0), [[1.0], [2.0]])

    run(body)


def test_delayed_batching_sends_a_full_batch_at_once() -> None:
    async def body() -> None:
        rig = Rig(max_batch=8, max_delay_ms=1000)
        rig.add("r1", initial=3)
        for i in range(3):
            rig.submit([float(i)])
        assert len(rig.link.sent) == 1 and len(rig.link.batch(0)) == 3

    run(body)


def test_wake_timer_is_measured_on_the_paths_clock() -> None:
    # The fake clock is far ahead of the event loop's own clock: the wake-up must still be
    # scheduled for when the *earliest* held batch is due, in the path's own time.
    async def body() -> None:
        rig = Rig(max_batch=8, max_delay_ms=20, clock=FakeClock(1e9))
        loop = asyncio.get_running_loop()
        r1 = rig.add("r1", initial=1)
        first = rig.submit([1.0])  # a batch of one is full for r1: sent at once
        rig.add("r2", initial=4)
        rig.clock.advance(0.015)
        before = loop.time()
        rig.submit([2.0])  # r2 holds it back: due at +0.035, 20 ms from now
        assert rig.path._wake is not None
        assert 0.0199 < rig.path._wake.when() - before < 0.030
        rig.path.take_back(r1)  # the first query goes back to the queue, enqueued at +0.0
        r1.state = "dead"
        before = loop.time()
        rig.path.pump()  # the held batch is now due at +0.020, i.e. in 5 ms
        assert len(rig.link.predicts()) == 1
        assert 0.0049 < rig.path._wake.when() - before < 0.015
        assert not first.done()
        rig.path.fail_all("test over")

    run(body)


# --- single queue -------------------------------------------------------------------------


def test_single_queue_idle_replicas_pull_and_busy_ones_do_not() -> None:
    async def body() -> None:
        rig = Rig()
        r1, r2 = rig.add("r1"), rig.add("r2")
        futures = [rig.submit([float(i)]) for i in range(3)]
        assert [r for r, _, _ in rig.link.sent] == ["r1", "r2"]
        assert len(rig.path.queue) == 1  # both replicas are busy: the third waits
        rig.echo(r2, index=1)
        assert [r for r, _, _ in rig.link.sent] == ["r1", "r2", "r2"]
        np.testing.assert_array_equal(rig.link.batch(2), [[2.0]])
        rig.echo(r1, index=0)
        rig.echo(r2, index=2)
        assert [f.result().tolist() for f in futures] == [[0.0], [1.0], [2.0]]
        assert len(rig.link.sent) == 3

    run(body)


def test_replicas_that_are_not_ready_get_nothing() -> None:
    async def body() -> None:
        rig = Rig()
        for state in ("starting", "dead", "retiring"):
            rig.add(state).state = state
        rig.submit([1.0])
        assert rig.link.sent == [] and len(rig.path.queue) == 1
        assert not rig.path.ready_replicas() and rig.path.has_capacity()

    run(body)


# --- deadlines ----------------------------------------------------------------------------


def test_expired_queued_queries_are_dropped_not_sent() -> None:
    async def body() -> None:
        rig = Rig()
        stale = rig.submit([1.0], ttl=0.05)
        fresh = rig.submit([2.0], ttl=5.0)
        rig.clock.advance(0.1)
        r1 = rig.add("r1", initial=4)
        rig.path.pump()
        assert len(rig.link.sent) == 1
        np.testing.assert_array_equal(rig.link.batch(0), [[2.0]])  # only the live query
        assert isinstance(failure(stale), WorkerError)
        rig.echo(r1)
        assert fresh.result().tolist() == [2.0]

    run(body)


def test_expire_stale_fails_queued_work_while_no_replica_pulls() -> None:
    async def body() -> None:
        rig = Rig()
        stale = rig.submit([1.0], ttl=0.05)
        rig.clock.advance(0.05)  # deadline <= now counts as passed
        rig.path.expire_stale(rig.clock())
        assert isinstance(failure(stale), WorkerError)
        assert len(rig.path.queue) == 0 and rig.path.queue.statistics().expired == 1

    run(body)


# --- failures -----------------------------------------------------------------------------


def test_take_back_requeues_a_batch_and_a_late_result_is_ignored() -> None:
    async def body() -> None:
        rig = Rig()
        r1, r2 = rig.add("r1"), rig.add("r2")
        r2.state = "starting"
        future = rig.submit([7.0])
        old_bid = rig.link.sent[0][1]["bid"]
        assert rig.path.take_back(r1) == 1
        assert r1.batch is None and old_bid not in rig.path.inflight
        r1.state = "dead"
        r2.state = "ready"
        rig.path.pump()
        assert [r for r, _, _ in rig.link.sent] == ["r1", "r2"]
        new_bid = rig.link.sent[1][1]["bid"]
        assert new_bid != old_bid
        np.testing.assert_array_equal(rig.link.batch(1), [[7.0]])
        rig.answer(r1, {"bid": old_bid}, np.array([[-1.0]], dtype=np.float32))  # late, stale
        assert not future.done() and r2.batch is not None
        rig.echo(r2)
        assert future.result().tolist() == [7.0]  # the answer from r2, not the stale one
        rig.answer(r1, {"bid": old_bid}, np.array([[-1.0]], dtype=np.float32))
        assert future.result().tolist() == [7.0] and len(rig.link.sent) == 2

    run(body)


def test_take_back_of_an_idle_replica_returns_zero() -> None:
    async def body() -> None:
        rig = Rig()
        assert rig.path.take_back(rig.add("r1")) == 0

    run(body)


def test_failed_send_requeues_and_marks_the_replica_dead() -> None:
    async def body() -> None:
        rig = Rig()
        r1 = rig.add("r1")
        rig.link.broken.add("r1")
        future = rig.submit([3.0])
        assert r1.state == "dead" and r1.batch is None
        assert len(rig.path.queue) == 1 and not future.done()
        assert rig.link.sent == [] and not rig.path.inflight
        r2 = rig.add("r2")
        rig.path.pump()
        assert [r for r, _, _ in rig.link.sent] == ["r2"]
        rig.echo(r2)
        assert future.result().tolist() == [3.0]

    run(body)


def test_failed_send_falls_through_to_the_next_idle_replica() -> None:
    async def body() -> None:
        rig = Rig()
        r1, r2 = rig.add("r1"), rig.add("r2")
        rig.link.broken.add("r1")
        rig.submit([3.0])
        assert r1.state == "dead"
        assert [r for r, _, _ in rig.link.sent] == ["r2"] and r2.batch is not None

    run(body)


def test_error_result_splits_the_batch_until_each_query_fails_alone() -> None:
    async def body() -> None:
        rig = Rig()
        futures = [rig.submit([float(i)]) for i in range(3)]
        r1 = rig.add("r1", initial=3)
        rig.path.pump()
        while r1.batch is not None:  # the model raises on every part it is given
            bid = rig.link.sent[-1][1]["bid"]
            rig.path.on_result(r1, {"t": wire.RESULT, "bid": bid, "ok": False,
                                    "error": "ValueError: boom"}, [])
        assert len(rig.link.sent) == 5  # 2n - 1 parts: 3, then 2 and 1, then 1 and 1
        for future in futures:
            error = failure(future)
            assert isinstance(error, PredictError) and "boom" in str(error)
        assert r1.idle and not rig.path.inflight

    run(body)


def test_result_with_the_wrong_number_of_outputs_fails_the_batch() -> None:
    async def body() -> None:
        rig = Rig()
        futures = [rig.submit([float(i)]) for i in range(3)]
        r1 = rig.add("r1", initial=3)
        rig.path.pump()
        rig.answer(r1, rig.link.sent[0][1], np.zeros(2, dtype=np.float32))
        for future in futures:
            error = failure(future)
            assert isinstance(error, PredictError) and "2 outputs for 3 inputs" in str(error)
        assert r1.idle

    run(body)


def test_fail_all_answers_queued_and_inflight_queries() -> None:
    async def body() -> None:
        rig = Rig()
        rig.add("r1")
        inflight, queued = rig.submit([1.0]), rig.submit([2.0])
        rig.path.fail_all("shutting down")
        assert isinstance(failure(inflight), WorkerError)
        assert isinstance(failure(queued), WorkerError)

    run(body)


# --- cache --------------------------------------------------------------------------------


def test_equal_inputs_share_a_pending_future_then_hit_the_cache() -> None:
    async def body() -> None:
        rig = Rig(cache_bytes=1 << 20)
        r1 = rig.add("r1")
        first = rig.submit([1.0, 2.0])
        shared, cached = rig.path.submit(np.array([1.0, 2.0], dtype=np.float32), T0 + 10)
        assert shared is first and cached
        assert len(rig.link.sent) == 1
        rig.echo(r1, scale=3)
        assert first.result().tolist() == [3.0, 6.0]
        await asyncio.sleep(0)  # let the done-callback store the answer
        hits = rig.cache.statistics().hits
        third, cached = rig.path.submit(np.array([1.0, 2.0], dtype=np.float32), T0 + 10)
        assert cached and third.done() and third.result().tolist() == [3.0, 6.0]
        assert rig.cache.statistics().hits == hits + 1
        assert len(rig.link.sent) == 1  # never computed twice
        other, cached = rig.path.submit(np.array([1.0, 2.5], dtype=np.float32), T0 + 10)
        await asyncio.sleep(0)  # the end of this event-loop pass pumps it out
        assert not cached and len(rig.link.sent) == 2

    run(body)


def test_failed_queries_are_not_cached() -> None:
    async def body() -> None:
        rig = Rig(cache_bytes=1 << 20)
        r1 = rig.add("r1")
        first = rig.submit([4.0])
        bid = rig.link.sent[0][1]["bid"]
        rig.path.on_result(r1, {"t": wire.RESULT, "bid": bid, "ok": False, "error": "x"}, [])
        assert isinstance(failure(first), PredictError)
        await asyncio.sleep(0)
        again = rig.submit([4.0])  # computed again, not answered from cache or the failure
        assert again is not first and len(rig.link.sent) == 2

    run(body)


# --- capacity -----------------------------------------------------------------------------


def test_queue_full_when_capacity_is_exceeded() -> None:
    async def body() -> None:
        rig = Rig(max_queue=2)
        rig.submit([1.0])
        rig.submit([2.0])
        with pytest.raises(QueueFull):
            rig.submit([3.0])
        assert len(rig.path.queue) == 2 and rig.path.queue.statistics().rejected == 1

    run(body)


def test_shared_work_outlives_the_first_queries_deadline_when_a_sharer_waits_longer() -> None:
    async def body() -> None:
        rig = Rig(cache_bytes=1 << 20)
        first = rig.submit([4.0], ttl=0.05)
        shared, cached = rig.path.submit(np.array([4.0], dtype=np.float32), rig.clock() + 5.0)
        assert shared is first and cached
        rig.clock.advance(0.1)  # past the first deadline, well before the sharer's
        r1 = rig.add("r1")
        rig.path.pump()
        assert not shared.done() and len(rig.link.sent) == 1  # requeued and sent, not failed
        rig.echo(r1, scale=2)
        assert shared.result().tolist() == [8.0]

    run(body)


def test_shared_work_expires_once_every_sharer_has_given_up() -> None:
    async def body() -> None:
        rig = Rig(cache_bytes=1 << 20)
        first = rig.submit([5.0], ttl=0.05)
        rig.path.submit(np.array([5.0], dtype=np.float32), rig.clock() + 0.2)
        rig.clock.advance(0.3)
        rig.path.expire_stale(rig.clock())  # requeued under 0.2, which has passed too
        rig.path.expire_stale(rig.clock())
        assert isinstance(failure(first), WorkerError)
        assert len(rig.path.queue) == 0

    run(body)
