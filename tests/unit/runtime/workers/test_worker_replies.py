"""The worker's reply to a batch whose outputs cannot be sent: an error result, whatever the
packer raises (a fake socket records what would be sent; no process)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from parityserve.errors import PredictError
from parityserve.runtime.workers import messages, wire
from parityserve.runtime.workers.worker import WorkerSpec, _Worker


class _Sock:
    def __init__(self) -> None:
        self.sent: list[list[Any]] = []

    def send_multipart(self, frames: list[Any], **_: Any) -> None:
        self.sent.append([bytes(f) for f in frames])


class _Model:
    def __init__(self, outputs: Any) -> None:
        self.outputs = outputs

    def predict(self, batch: Any) -> Any:
        return self.outputs


@pytest.mark.parametrize("outputs", [
    [object()],  # msgpack: TypeError
    [2**70],  # msgpack: OverflowError
    ["x" * 10, {1: set()}],  # nested: TypeError from the default hook
])
def test_unsendable_outputs_become_an_error_result(outputs: Any) -> None:
    sock = _Sock()
    worker = _Worker(WorkerSpec("m/v1/0#1-ab", "m", 1, "zoo:echo"), _Model(outputs), sock)
    desc, frames = wire.pack_payload(np.zeros((1, 2), np.float32))
    worker.predict({"t": wire.PREDICT, "bid": 9, "in": desc}, [bytes(f) for f in frames])
    (reply,) = sock.sent
    result = messages.decode(reply)
    assert isinstance(result, messages.Result)
    assert (result.bid, result.ok) == (9, False)
    assert "cannot be sent" in result.error


class _Raises:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def predict(self, batch: Any) -> Any:
        raise self.error


def _wrapped(error: Exception) -> Exception:
    try:  # as LoadedModel.predict wraps what a user's predict raised
        raise PredictError(f"predict raised {error}") from error
    except PredictError as exc:
        return exc


@pytest.mark.parametrize(("error", "blamed"), [
    (ValueError("negative"), True),
    (TypeError("not a number"), True),
    (_wrapped(ValueError("inhomogeneous shape")), True),
    (RuntimeError("weights are garbage"), False),
    (_wrapped(RuntimeError("CUDA out of memory")), False),
    (PredictError("returned 2 outputs for 1 queries"), False),  # the model's own bug
])
def test_an_error_result_says_whether_the_model_blamed_its_input(error, blamed) -> None:
    sock = _Sock()
    worker = _Worker(WorkerSpec("m/v1/0#1-ab", "m", 1, "zoo:echo"), _Raises(error), sock)
    desc, frames = wire.pack_payload(np.zeros((1, 2), np.float32))
    worker.predict({"t": wire.PREDICT, "bid": 9, "in": desc}, [bytes(f) for f in frames])
    result = messages.decode(sock.sent[0])
    assert isinstance(result, messages.Result) and not result.ok
    assert result.bad_input is blamed


def _delays(worker: _Worker, batches: int) -> list[float]:
    plan = worker.plan
    assert plan is not None
    return [plan.next_batch(time.monotonic()).delay_s for _ in range(batches)]


def test_a_fault_set_again_draws_new_delays_and_a_seed_still_reproduces_them() -> None:
    faults = {"delay_ms": 10.0, "delay_distribution": "exponential", "seed": 5}
    spec = WorkerSpec("m/v1/0#1-ab", "m", 1, "zoo:echo", faults=faults)
    worker = _Worker(spec, _Model([0]), _Sock())
    first = _delays(worker, 20)
    worker.handle(wire.encode({"t": wire.FAULT, "spec": faults}))  # switched on again
    second = _delays(worker, 20)
    assert first != second  # a second window is not a replay of the first
    again = _Worker(spec, _Model([0]), _Sock())
    assert _delays(again, 20) == first  # the same seed, the same first window
    again.handle(wire.encode({"t": wire.FAULT, "spec": faults}))
    assert _delays(again, 20) == second
