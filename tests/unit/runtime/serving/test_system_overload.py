"""Admission and bad inputs on the ServingSystem's query paths, over a fake link and clock.

No processes: model paths are wired to ``dispatch_fakes`` by hand, replicas are added as
records, and results are handed to ``on_result`` the way the worker link would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import numpy as np
import pytest

from parityserve.config import ServingConfig
from parityserve.core.admission import ServiceEstimate
from parityserve.core.batching import AIMDController
from parityserve.errors import (
    DeadlineExceeded,
    InvalidInput,
    LimitExceeded,
    Overloaded,
    Unavailable,
)
from parityserve.runtime.modelpath.dispatch import ModelPath, Replica
from parityserve.runtime.serving.system import ServingSystem
from parityserve.runtime.workers import wire
from tests.unit.runtime.modelpath.dispatch_fakes import FakeClock, FakeLink

VECTOR = {"name": "x", "datatype": "FP32", "shape": [2]}
SLOW = ServiceEstimate(batch_s=0.05, rows=1.0, batches=1)  # 20 queries/s per replica
# SLO 500 ms: (0.5 - 0.05) / 0.05 = 9 queries may wait.
BOUND = 9


class Rig:
    def __init__(self, models: list[str], policy: str = "single",
                 allow_nonfinite: bool = False, limits: dict[str, int] | None = None,
                 spec: dict[str, object] | None = VECTOR,
                 settings: dict[str, dict[str, object]] | None = None) -> None:
        """``settings`` adds deployment settings per model name."""
        self.clock = FakeClock()
        self.link = FakeLink()
        config = ServingConfig.model_validate({
            "server": {"limits": limits or {}},
            "models": [{"name": m, "source": "zoo:echo", "input": spec, "timeout_ms": 500,
                        "batching": {"max_batch_size": 1},
                        "allow_nonfinite": allow_nonfinite, **(settings or {}).get(m, {})}
                       for m in models],
            "applications": [{"name": "app", "models": models, "slo_ms": 500,
                              "policy": policy, "default_output": "D"}]})
        self.system = ServingSystem(config, clock=self.clock)
        for dep in config.models:
            path = ModelPath(dep, link=self.link, metrics=self.system.metrics,
                             cache=self.system.cache, clock=self.clock, slo_s=0.5,
                             max_queue=config.server.max_queue)
            self.system.models[dep.name] = path

    def path(self, model: str) -> ModelPath:
        return self.system.models[model]

    def add(self, model: str, state: str = "ready") -> Replica:
        path = self.path(model)
        rid = f"{model}/r{len(path.replicas)}"
        replica = Replica(rid, len(path.replicas), AIMDController(1, 0.5), self.clock(),
                          state=state)
        path.replicas[rid] = replica
        return replica

    def flood(self, model: str, count: int = BOUND) -> None:
        """A measured, slow model whose queue already holds ``count`` queries."""
        path = self.path(model)
        self.add(model, state="starting")  # counts as capacity, pulls nothing yet
        path.service = SLOW
        for i in range(count):
            path.submit(np.array([i, i], dtype=np.float32), self.clock() + 10)

    async def answer_all(self, model: str) -> None:
        """Echo every batch sent to ``model``'s replicas, once one has been sent."""
        path = self.path(model)
        for _ in range(100):  # the handler reads state (an await) before it queues
            if self.link.predicts():
                break
            await asyncio.sleep(0)
        for rid, header, frames in list(self.link.sent):
            if header["t"] == wire.PREDICT and rid in path.replicas:
                out = np.asarray(wire.unpack_payload(header["in"], frames))
                desc, bufs = wire.pack_payload(out)
                path.on_result(path.replicas[rid], {"t": wire.RESULT, "bid": header["bid"],
                                                    "ok": True, "out": desc},
                               [bytes(b) for b in bufs])


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(body())  # type: ignore[arg-type]


def test_clipper_route_sheds_a_query_its_only_model_cannot_serve_in_time() -> None:
    async def body() -> None:
        rig = Rig(["a"])
        rig.flood("a")
        with pytest.raises(Overloaded) as caught:
            await rig.system.predict("app", [[1.0, 2.0]])
        assert (caught.value.model, caught.value.depth) == ("a", BOUND)
        assert caught.value.retry_after_s >= 1
        assert len(rig.path("a").queue) == BOUND  # nothing was queued for it

    run(body)


def test_clipper_batch_is_shed_whole_when_it_does_not_fit() -> None:
    async def body() -> None:
        rig = Rig(["a"])
        rig.flood("a", BOUND - 2)
        with pytest.raises(Overloaded):
            await rig.system.predict("app", [[1.0, 2.0]] * 3)
        assert len(rig.path("a").queue) == BOUND - 2

    run(body)


def test_a_clipper_request_is_admitted_once_by_the_model_that_took_it_whole() -> None:
    """The request-wide check admits all its queries; they are not admitted one by one
    again on that model (the V2 route's rule too). A second model the policy asks admits
    its own queries: the first check did not count them."""
    async def body() -> None:
        rig = Rig(["a", "b"], policy="exp4")
        asked: list[tuple[str, int]] = []
        for name in ("a", "b"):
            machine = rig.path(name).machine
            real = machine.admit

            def counted(count: int, deadline: float, now: float, real=real, name=name):
                asked.append((name, count))
                return real(count, deadline, now)

            machine.admit = counted  # type: ignore[method-assign]
            rig.add(name)
        rows = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]  # distinct: none shares another's answer
        task = asyncio.ensure_future(rig.system.predict("app", rows))
        await rig.answer_all("a")
        await rig.answer_all("b")
        assert len(await task) == 3
        assert asked == [("a", 3), ("b", 1), ("b", 1), ("b", 1)]

    run(body)


def test_several_models_one_overloaded_the_others_answer() -> None:
    async def body() -> None:
        rig = Rig(["a", "b"], policy="exp4")
        rig.flood("a")
        rig.add("b")
        task = asyncio.ensure_future(rig.system.predict("app", [[1.0, 2.0]]))
        await rig.answer_all("b")
        (prediction,) = await task
        assert not prediction.default
        assert prediction.model == "b" and prediction.extra["answered"] == 1

    run(body)


def test_several_models_all_overloaded_sheds() -> None:
    async def body() -> None:
        rig = Rig(["a", "b"], policy="exp4")
        rig.flood("a")
        rig.flood("b")
        with pytest.raises(Overloaded):
            await rig.system.predict("app", [[1.0, 2.0]])

    run(body)


def test_v2_sheds_a_batch_whole() -> None:
    async def body() -> None:
        rig = Rig(["a"])
        rig.flood("a", BOUND - 2)
        with pytest.raises(Overloaded) as caught:
            await rig.system.infer_detailed("a", None, np.ones((3, 2), np.float32))
        assert caught.value.depth == BOUND - 2
        assert len(rig.path("a").queue) == BOUND - 2
        assert rig.path("a").shed == 3

    run(body)


def test_v2_zero_rows_is_invalid_input() -> None:
    async def body() -> None:
        rig = Rig(["a"])
        rig.add("a")
        with pytest.raises(InvalidInput, match="zero rows"):
            await rig.system.infer_detailed("a", None, np.ones((0, 2), np.float32))

    run(body)


def test_v2_scalar_tensor_without_a_spec_is_invalid_input() -> None:
    async def body() -> None:
        rig = Rig(["a"], spec=None)
        rig.add("a")
        with pytest.raises(InvalidInput, match="scalar"):
            await rig.system.infer_detailed("a", None, np.array(1.0, np.float32))

    run(body)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_v2_nonfinite_rows_are_refused_unless_allowed(bad: float) -> None:
    async def body() -> None:
        rig = Rig(["a"])
        rig.add("a")
        batch = np.array([[1.0, 2.0], [bad, 0.0]], np.float32)
        with pytest.raises(InvalidInput, match="1 non-finite"):
            await rig.system.infer_detailed("a", None, batch)
        assert not rig.link.sent

        lenient = Rig(["a"], allow_nonfinite=True)
        lenient.add("a")
        task = asyncio.ensure_future(lenient.system.infer_detailed("a", None, batch))
        await lenient.answer_all("a")
        await lenient.answer_all("a")  # max_batch_size 1: the second row goes next
        out, _ = await task
        assert out.shape == (2, 2)

    run(body)


def test_v2_query_that_expires_in_the_queue_is_deadline_exceeded() -> None:
    async def body() -> None:
        rig = Rig(["a"])
        rig.add("a", state="starting")  # nobody pulls it
        task = asyncio.ensure_future(
            rig.system.infer_detailed("a", None, np.ones((1, 2), np.float32)))
        await asyncio.sleep(0)
        rig.clock.advance(1.0)
        rig.path("a").expire_stale(rig.clock())
        with pytest.raises(DeadlineExceeded, match="deadline passed"):
            await task

    run(body)


def test_a_clients_own_deadline_shorter_than_the_timeout_drops_its_rows_from_the_queue(
        ) -> None:
    """gRPC's deadline reaches the model path: a row still queued when the client has gone
    is dropped at the client's deadline (200 ms), not at the deployment's 500 ms, and never
    sent; with no deadline, the same row still waits at 200 ms."""
    async def body() -> None:
        rig = Rig(["a"])
        rig.add("a", state="starting")  # nobody pulls it
        one, other = np.ones((1, 2), np.float32), np.zeros((1, 2), np.float32)  # (distinct:
        # equal inputs would share one query, which waits for the later deadline)
        bounded = asyncio.ensure_future(rig.system.infer_detailed("a", None, one, 0.2))
        unbounded = asyncio.ensure_future(rig.system.infer_detailed("a", None, other))
        await asyncio.sleep(0)
        rig.clock.advance(0.25)
        rig.path("a").expire_stale(rig.clock())
        with pytest.raises(DeadlineExceeded, match=r"deadline passed.*\(timeout 200 ms\)"):
            await bounded
        assert not unbounded.done() and not rig.link.sent and len(rig.path("a").queue) == 1
        unbounded.cancel()

    run(body)


def test_a_deadline_already_passed_when_read_is_refused_before_queueing() -> None:
    async def body() -> None:
        rig = Rig(["a"])
        rig.add("a")
        with pytest.raises(DeadlineExceeded, match="the client's deadline had passed"):
            await rig.system.infer_detailed("a", None, np.ones((1, 2), np.float32), 0.0)
        assert not rig.link.sent and not rig.path("a").queue

    run(body)


def test_a_queued_query_that_can_no_longer_finish_is_answered_not_sent() -> None:
    async def body() -> None:
        rig = Rig(["a"])
        path = rig.path("a")
        path.service = SLOW
        replica = rig.add("a", state="starting")
        task = asyncio.ensure_future(
            rig.system.infer_detailed("a", None, np.ones((1, 2), np.float32)))
        await asyncio.sleep(0)
        rig.clock.advance(0.46)  # 40 ms left, one batch takes 50 ms
        fresh, _ = path.submit(np.array([5.0, 5.0], np.float32), rig.clock() + 10)
        replica.state = "ready"
        path.pump()
        assert len(rig.link.sent) == 1  # only the query that can still make it
        assert rig.link.batch(0).tolist() == [[5.0, 5.0]]
        with pytest.raises(DeadlineExceeded, match="cannot finish before its deadline"):
            await task
        assert path.shed == 1 and not fresh.done()

    run(body)




def _nest(depth: int) -> object:
    value: object = 1.0
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("spec", [VECTOR, None])
@pytest.mark.parametrize(("items", "ok"), [
    ([_nest(4)], True),            # an input counts from depth 3: lists at 3..6
    ([_nest(5)], False),
    ([[1.0, 2.0], _nest(5)], False),
])
def test_inputs_deeper_than_the_limit_are_refused_with_or_without_a_spec(
        spec: dict[str, object] | None, items: list[object], ok: bool) -> None:
    async def body() -> None:
        rig = Rig(["a"], limits={"max_json_depth": 6}, spec=spec)
        if ok and spec is None:  # past the limits; no replica, so the default answers
            (prediction,) = await rig.system.predict("app", items)
            assert prediction.default and "no running replica" in str(
                prediction.default_explanation)
            return
        if ok:  # past the limits, then the signature check refuses the shape
            with pytest.raises(InvalidInput, match="shape"):
                await rig.system.predict("app", items)
            return
        with pytest.raises(LimitExceeded, match="max_json_depth = 6"):
            await rig.system.predict("app", items)
        assert len(rig.path("a").queue) == 0

    run(body)


@pytest.mark.parametrize("spec", [VECTOR, None])
def test_inputs_with_more_elements_than_the_limit_are_refused(
        spec: dict[str, object] | None) -> None:
    async def body() -> None:
        rig = Rig(["a"], limits={"max_input_elements": 4}, spec=spec)
        for items in ([[1.0] * 5], [[1.0, 2.0], [[1.0, 2.0], [3.0, 4.0, 5.0]]]):
            with pytest.raises(LimitExceeded, match="max_input_elements = 4"):
                await rig.system.predict("app", items)
        assert len(rig.path("a").queue) == 0

    run(body)


def test_admin_state_shows_what_admission_sees() -> None:
    async def body() -> None:
        rig = Rig(["a"])
        rig.flood("a")
        with pytest.raises(Overloaded):
            await rig.system.predict("app", [[1.0, 2.0]])
        (model,) = rig.system.state()["models"]
        assert model["admission"] == {
            "bound": BOUND, "depth": BOUND, "max_queue": 1 << 20, "measured": True,
            "service_ms_per_query": pytest.approx(50.0), "batch_ms": pytest.approx(50.0),
            "shed": 1}

    run(body)


def test_shutdown_answers_queued_queries_as_unavailable_not_as_late() -> None:
    async def body() -> None:
        rig = Rig(["a"])
        rig.add("a", state="starting")
        task = asyncio.ensure_future(
            rig.system.infer_detailed("a", None, np.ones((1, 2), np.float32)))
        await asyncio.sleep(0)
        rig.path("a").fail_all("server shutting down")
        with pytest.raises(Unavailable, match="shutting down"):
            await task

    run(body)


def test_an_inflated_estimate_never_starves_the_model() -> None:
    """One very slow batch (a warm-up) must not make the model refuse everything: a query
    that finds the queue empty is admitted and sent, and its result refreshes the estimate."""
    async def body() -> None:
        rig = Rig(["a"])
        path = rig.path("a")
        replica = rig.add("a")
        path.service = ServiceEstimate(batch_s=2.0, rows=1.0, batches=1)  # > the 500 ms SLO
        task = asyncio.ensure_future(
            rig.system.infer_detailed("a", None, np.ones((1, 2), np.float32)))
        await rig.answer_all("a")
        out, _ = await task
        assert out.tolist() == [[1.0, 1.0]]
        # the inflated estimate is gone: the model's is now its replica's own (pooled per
        # replica; this rig's clock does not move, so that batch took 0 s)
        assert path.service != ServiceEstimate(batch_s=2.0, rows=1.0, batches=1)
        assert path.service.batch_s < 2.0
        assert replica.served == 1

    run(body)


def test_v2_batch_that_fits_is_queued_whole() -> None:
    async def body() -> None:
        rig = Rig(["a"])
        rig.flood("a", BOUND - 3)
        task = asyncio.ensure_future(
            rig.system.infer_detailed("a", None, np.arange(100, 106, dtype=np.float32)
                                      .reshape(3, 2)))  # distinct: the cache shares equals
        await asyncio.sleep(0)
        assert not task.done(), task
        assert len(rig.path("a").queue) == BOUND and rig.path("a").shed == 0
        task.cancel()

    run(body)
