"""Results a worker sends: accepted only from the replica the batch went to, and checked
(rows, dtype, finiteness) before any query is answered with them. Fakes only: a fake link
and clock (``dispatch_fakes``), results handed over as typed records."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from parityserve.config import Deployment, TensorSpec
from parityserve.core.batching import AIMDController
from parityserve.core.cache import ClockCache
from parityserve.errors import PredictError
from parityserve.runtime.modelpath.dispatch import ModelPath, Replica
from parityserve.runtime.modelpath.metrics import Metrics
from parityserve.runtime.workers.messages import Result
from tests.unit.runtime.modelpath.dispatch_fakes import FakeClock, FakeLink


def _path(**deployment: Any) -> ModelPath:
    dep = Deployment(name="m", source="zoo:echo",
                     output=TensorSpec(name="y", datatype="FP32", shape=(2,)), **deployment)
    return ModelPath(dep, link=FakeLink(), metrics=Metrics(), cache=ClockCache(0),
                     clock=FakeClock(), slo_s=0.1, max_queue=100)


def _replica(path: ModelPath, rid: str) -> Replica:
    aimd = AIMDController(8, 0.1, initial=8)
    replica = Replica(rid, len(path.replicas), aimd, 0.0, state="ready")
    path.replicas[rid] = replica
    return replica


def _submit(path: ModelPath, n: int) -> list[asyncio.Future[Any]]:
    futures = [path.submit(np.ones(2, np.float32) * i, 1e9)[0] for i in range(n)]
    path.pump()  # what the end of this event-loop pass would do
    return futures


def _bid(path: ModelPath, replica: Replica) -> int:
    assert replica.batch is not None
    return replica.batch.bid


def test_a_result_from_another_replica_is_refused_and_changes_nothing() -> None:
    async def body() -> None:
        path = _path()
        real, rogue = _replica(path, "real"), _replica(path, "rogue")
        futures = _submit(path, 1)
        bid = _bid(path, real)
        refused = path.accept_result(rogue, Result(bid, True, np.zeros((1, 2), np.float32)))
        assert refused is not None and refused[0] == "unknown_batch"
        assert not futures[0].done() and real.batch is not None and bid in path.inflight
        assert path.accept_result(real, Result(bid, True, np.full((1, 2), 7, np.float32))) is None
        np.testing.assert_array_equal(futures[0].result(), [7, 7])

    asyncio.run(body())


def test_a_result_for_a_batch_never_sent_is_refused() -> None:
    async def body() -> None:
        path = _path()
        replica = _replica(path, "r")
        _submit(path, 1)
        refused = path.accept_result(replica, Result(10**9, True, np.zeros((1, 2), np.float32)))
        assert refused is not None and refused[0] == "unknown_batch"
        assert replica.batch is not None

    asyncio.run(body())


@pytest.mark.parametrize(("outputs", "reason"), [
    (np.zeros((3, 2), np.float32), "wrong_shape"),  # 3 rows for 2 inputs
    (np.float32(1.0), "wrong_shape"),
    (7, "wrong_shape"),
    ({"a": 1}, "wrong_shape"),
    (np.array([["a", "b"], ["c", "d"]]), "wrong_dtype"),
    (np.zeros((2, 2), np.int64), "wrong_dtype"),
    (np.array([[np.nan, 0], [0, 0]], np.float32), "nonfinite"),
    (np.array([[np.inf, 0], [0, 0]], np.float64), "nonfinite"),
    ([[1.0, float("nan")], [0.0, 0.0]], "nonfinite"),
])
def test_unusable_outputs_answer_the_batch_with_an_error_once(outputs: Any, reason: str) -> None:
    async def body() -> None:
        path = _path()
        futures = _submit(path, 2)  # queued first, so both go in one batch
        replica = _replica(path, "r")
        path.pump()
        refused = path.accept_result(replica, Result(_bid(path, replica), True, outputs))
        assert refused is not None and refused[0] == reason
        assert all(isinstance(f.exception(), PredictError) for f in futures)
        assert replica.idle and not path.inflight  # the replica is free for the next batch

    asyncio.run(body())


def test_nonfinite_outputs_are_served_when_the_deployment_allows_them() -> None:
    async def body() -> None:
        path = _path(allow_nonfinite=True)
        replica = _replica(path, "r")
        futures = _submit(path, 1)
        outputs = np.array([[np.nan, 1]], np.float32)
        assert path.accept_result(replica, Result(_bid(path, replica), True, outputs)) is None
        assert np.isnan(futures[0].result()[0])

    asyncio.run(body())


def test_float64_outputs_fit_an_fp32_signature() -> None:
    async def body() -> None:
        path = _path()
        replica = _replica(path, "r")
        futures = _submit(path, 1)
        outputs = np.ones((1, 2), np.float64)
        assert path.accept_result(replica, Result(_bid(path, replica), True, outputs)) is None
        assert futures[0].result().tolist() == [1.0, 1.0]

    asyncio.run(body())


def test_a_malformed_result_fails_the_held_batch_instead_of_leaving_it_stuck() -> None:
    async def body() -> None:
        path = _path()
        replica = _replica(path, "r")
        assert not path.refuse_batch(replica, "nothing held")
        futures = _submit(path, 1)
        assert path.refuse_batch(replica, "malformed result")
        assert isinstance(futures[0].exception(), PredictError) and replica.idle
        assert not path.inflight

    asyncio.run(body())
