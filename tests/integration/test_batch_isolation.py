"""One client's bad row never fails its batch-mates, with real worker processes.

Queries from several clients are lined up behind a batch the worker holds (the model waits on
a gate file while it holds the "holder" row), so that they leave as ONE batch when the gate
opens; the batch-size histogram on /metrics proves they did. The model then raises on that
batch because of some rows: negative values for ``picky`` (which declares its signature), rows
of another width for ``nospec`` (which declares none, so the frontend cannot refuse them and
``np.asarray`` fails on the mixed batch). Good rows must get their predictions and bad rows a
400 that names the row and what the model said about it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from conftest import model_state, start_server, wait_until
from prometheus_client.parser import text_string_to_metric_families

from parityserve.client import Client
from parityserve.runtime.server import RunningServer

pytestmark = pytest.mark.integration

HOLD = 999.0  # a row holding this value waits in predict while the gate file exists
SHARED = 12  # queries lined up to share one batch: more than any other batch here (<= 8)

MODELS = '''
import os
import time

import numpy as np

HOLD = 999.0


def _hold(batch, gate):
    while os.path.exists(gate) and (batch == HOLD).any():
        time.sleep(0.01)


class Picky:
    input_spec = {"name": "x", "datatype": "FP32", "shape": [2]}
    output_spec = {"name": "y", "datatype": "FP32", "shape": [2]}

    def __init__(self, gate):
        self.gate = gate

    def predict(self, batch):
        batch = np.asarray(batch, dtype=np.float32)
        _hold(batch, self.gate)
        negative = batch[(batch < 0).any(axis=1)]
        if len(negative):
            raise ValueError(f"negative values are not allowed: {negative[0].tolist()}")
        return batch * 2


class NoSpec:
    """Takes rows of 4 values; declares no signature."""

    def __init__(self, gate):
        self.gate = gate

    def predict(self, batch):
        batch = np.asarray(batch, dtype=np.float32)  # mixed widths: ValueError
        _hold(batch, self.gate)
        return batch @ np.ones(4, np.float32)  # a row of 2 alone: ValueError
'''


def _model(name: str, cls: str, gate: Path) -> dict[str, Any]:
    # AIMD's first full batch (of one) raises its limit straight to the ceiling; the queries
    # lined up may wait long on a loaded machine, and must not expire meanwhile.
    return {"name": name, "source": f"python:isolation_models:{cls}", "replicas": 1,
            "options": {"gate": str(gate)}, "timeout_ms": 120_000,
            "batching": {"max_batch_size": 16, "additive_step": 16, "busy_delay_ms": 0}}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    folder = tmp_path_factory.mktemp("isolation")
    (folder / "isolation_models.py").write_text(MODELS)
    gate = folder / "gate"
    config = {
        # The worker holds a batch while the test lines queries up: no heartbeat meanwhile.
        "server": {"http_port": 0, "cache_bytes": 0, "heartbeat_timeout_ms": 120_000},
        "models": [_model("picky", "Picky", gate), _model("nospec", "NoSpec", gate)],
    }
    server = start_server(config, folder)
    try:
        yield server, gate
    finally:
        server.stop()


def _infer(url: str, model: str, row: list[float]) -> httpx.Response:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, len(row)],
                        "data": row}]}
    return httpx.post(f"{url}/v2/models/{model}/infer", json=body, timeout=60)


def _batches_over(url: str, model: str, rows: int) -> float:
    """How many batches of more than ``rows`` queries ``model`` has run (its histogram's
    buckets are powers of two)."""
    families = text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
    buckets = {s.labels["le"]: s.value for f in families for s in f.samples
               if s.name == "parityserve_batch_size_bucket" and s.labels["model"] == model}
    # a model that has run no batch yet has no histogram series at all
    return buckets.get("+Inf", 0.0) - buckets.get(f"{float(rows)}", 0.0)


def _one_batch(server: RunningServer, gate: Path, model: str, holder: list[float],
               rows: list[list[float]]) -> list[httpx.Response]:
    """Send ``rows`` as concurrent one-row requests that the worker gets as one batch."""
    url = server.url
    answers: list[Any] = [None] * len(rows)

    def ask(i: int) -> None:
        answers[i] = _infer(url, model, rows[i])

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(rows))]
    held = threading.Thread(target=_infer, args=(url, model, holder))
    with Client(url) as client:
        # Warm: AIMD lets the replica take a whole batch of them at once.
        wait_until(lambda: _infer(url, model, holder).status_code == 200 and model_state(
            client, model)["replicas"][0]["max_batch_size"] >= len(rows), timeout_s=60)
        gate.touch()
        try:
            held.start()
            wait_until(lambda: model_state(client, model)["replicas"][0]["inflight"] == 1)
            for thread in threads:
                thread.start()
            wait_until(lambda: model_state(client, model)["queue"]["depth"] == len(rows))
        finally:
            gate.unlink()  # also on a failure: the worker must not stay held
    for thread in [held, *threads]:
        thread.join(60)
    assert _batches_over(url, model, SHARED // 2 + 2) >= 1  # they did share one batch
    return answers


def _check(answers: list[httpx.Response], rows: list[list[float]], bad: set[int],
           expected: Any, problem: str) -> None:
    for i, (answer, row) in enumerate(zip(answers, rows, strict=True)):
        if i in bad:
            assert answer.status_code == 400, (i, answer.text)
            error = answer.json()["error"]
            assert "row 0 of the input" in error and problem in error, error
        else:
            assert answer.status_code == 200, (i, answer.text)
            output = answer.json()["outputs"][0]["data"]
            np.testing.assert_allclose(output, expected(row), rtol=1e-6)


def test_rows_the_model_raises_on_fail_alone_and_their_batch_mates_are_answered(served) -> None:
    server, gate = served
    bad = {2, 7, 11}
    rows = [[-float(i), 1.0] if i in bad else [float(i), 1.0] for i in range(SHARED)]
    answers = _one_batch(server, gate, "picky", [HOLD, HOLD], rows)
    _check(answers, rows, bad, lambda row: np.multiply(row, 2),
           "ValueError: negative values are not allowed")


def test_rows_of_another_width_fail_alone_on_a_model_without_a_signature(served) -> None:
    server, gate = served
    bad = {0, 5, 6}
    rows = [[1.0, float(i)] if i in bad else [float(i), 1.0, 2.0, 3.0] for i in range(SHARED)]
    answers = _one_batch(server, gate, "nospec", [HOLD] * 4, rows)
    _check(answers, rows, bad, lambda row: [sum(row)], "ValueError: matmul")


def test_a_row_that_breaks_a_declared_signature_is_refused_before_it_is_batched(served) -> None:
    server, _ = served
    url = server.url
    before = _batches_over(url, "picky", 0)
    answer = _infer(url, "picky", [1.0, 2.0, 3.0])
    assert answer.status_code == 400 and "expected shape [-1, 2]" in answer.json()["error"]
    assert _batches_over(url, "picky", 0) == before  # no batch ran for it
