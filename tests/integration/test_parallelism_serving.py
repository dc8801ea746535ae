"""Service parallelism c on real workers: set live through the admin API, under load.

``zoo:echo`` answers its input, so every answer can be matched to its query. Batches of one
and a 20 ms delay per batch make a limit visible in which replicas serve; the cache is off,
so every query reaches a worker and the replicas' ``served`` counts add up to the queries.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from conftest import model_state, predict_all, wait_until

from parityserve.client import Client
from parityserve.errors import InvalidInput

pytestmark = pytest.mark.integration

VECTOR = {"name": "input", "datatype": "FP32", "shape": [4]}
MODEL = {"name": "echo", "source": "zoo:echo", "replicas": 3, "input": VECTOR,
         "batching": {"max_batch_size": 1}, "faults": {"all": {"delay_ms": 20}},
         "parallelism": 1}
APP = {"name": "echo", "models": ["echo"], "slo_ms": 30_000, "default_output": "DEFAULT"}


@pytest.fixture(scope="module")
def served(server_factory):
    config = {"server": {"http_port": 0, "cache_bytes": 0, "heartbeat_timeout_ms": 5000},
              "models": [MODEL], "applications": [APP]}
    server = server_factory(config)
    with Client(server.url) as c:
        wait_until(lambda: all(r["state"] == "ready"
                               for r in model_state(c, "echo")["replicas"]))
        # Admission allows a few batches per running replica until the service time is
        # measured; a few queries one at a time measure it, so the tests below are not shed.
        for _ in range(3):
            c.predict("echo", [0.0, 0.0, 0.0, 0.0])
    return server


@pytest.fixture
def client(served) -> Client:
    with Client(served.url) as c:
        yield c


def _served(client: Client) -> list[int]:
    return [r["served"] for r in sorted(model_state(client, "echo")["replicas"],
                                        key=lambda r: r["index"])]


def _check(answers: list[dict], xs: np.ndarray) -> None:
    for answer, x in zip(answers, xs, strict=True):
        assert answer["default"] is False, answer
        np.testing.assert_allclose(answer["output"], x, rtol=1e-5, atol=1e-5)


def test_the_configured_limit_holds_and_is_reported(served, client) -> None:
    assert model_state(client, "echo")["parallelism"] == 1
    before = _served(client)
    xs = np.random.default_rng(1).uniform(-1, 1, size=(12, 4)).astype(np.float32)
    _check(predict_all(served.url, "echo", xs, workers=6), xs)
    after = _served(client)
    # c = 1: the first replica in order pulls every batch; the other two stay warm.
    assert [a - b for a, b in zip(after, before, strict=True)] == [12, 0, 0]


def test_bad_values_are_refused_and_change_nothing(client) -> None:
    with pytest.raises(InvalidInput, match="greater than or equal to 1"):
        client.set_parallelism("echo", 0)
    with pytest.raises(InvalidInput, match="cannot be limited under redundancy"):
        client.set_redundancy("echo", "replication", d=2)
    assert model_state(client, "echo")["parallelism"] == 1


def test_every_query_is_answered_once_while_c_is_toggled(served, client) -> None:
    pids = sorted(r["pid"] for r in model_state(client, "echo")["replicas"])
    before = sum(_served(client))
    xs = np.random.default_rng(2).uniform(-1, 1, size=(200, 4)).astype(np.float32)
    done = threading.Event()
    changes: list[int | None] = []

    def toggle() -> None:
        with Client(served.url) as admin:
            for c in [3, 1, None, 1, 3, 2, 1, 3] * 4:
                if done.is_set():
                    break
                admin.set_parallelism("echo", c)
                changes.append(c)
                assert model_state(admin, "echo")["parallelism"] == c
                time.sleep(0.05)

    toggler = threading.Thread(target=toggle)
    toggler.start()
    try:
        answers = predict_all(served.url, "echo", xs, workers=12)
    finally:
        done.set()
        toggler.join()
    _check(answers, xs)
    assert len(changes) >= 6, changes
    # Each query computed exactly once (no redundancy, no cache): nothing lost or repeated.
    wait_until(lambda: sum(_served(client)) == before + 200, timeout_s=10)
    assert sum(_served(client)) == before + 200
    # Changing c never restarts a worker.
    assert sorted(r["pid"] for r in model_state(client, "echo")["replicas"]) == pids
    client.set_parallelism("echo", 1)
    assert model_state(client, "echo")["parallelism"] == 1
