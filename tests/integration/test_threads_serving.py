"""Intra-op threads set live on real torch workers through the admin API, under load.

``zoo:digits-mlp`` is a torch model (seed-0 weights), so the worker really calls
``torch.set_num_threads`` and its heartbeat reports ``torch.get_num_threads()``. The cache is
off and batches hold one query, so the replicas' ``served`` counts add up to the queries.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
from conftest import model_state, predict_all, wait_until

from parityserve.client import Client
from parityserve.errors import InvalidInput, UnknownModel

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 cores")]

CORES = os.cpu_count() or 1
MODEL = {"name": "digits", "source": "zoo:digits-mlp", "replicas": 2, "parallelism": 1,
         "batching": {"max_batch_size": 1}}
APP = {"name": "digits", "models": ["digits"], "slo_ms": 30_000, "default_output": "DEFAULT"}


@pytest.fixture(scope="module")
def served(server_factory):
    config = {"server": {"http_port": 0, "cache_bytes": 0, "heartbeat_timeout_ms": 5000},
              "models": [MODEL], "applications": [APP]}
    server = server_factory(config)
    with Client(server.url) as c:
        wait_until(lambda: _acked(c, 1))
        for _ in range(3):  # admission measures the service time before the load below
            c.predict("digits", [0.0] * 64)
    return server


@pytest.fixture
def client(served) -> Client:
    with Client(served.url) as c:
        yield c


def _acked(client: Client, threads: int) -> bool:
    """Every replica is ready and its latest heartbeat reports ``threads``."""
    replicas = model_state(client, "digits")["replicas"]
    return bool(replicas) and all(r["state"] == "ready" and r["threads"] == threads
                                  for r in replicas)


def _served(client: Client) -> int:
    return sum(r["served"] for r in model_state(client, "digits")["replicas"])


def test_threads_change_live_and_every_replica_acknowledges(client) -> None:
    pids = sorted(r["pid"] for r in model_state(client, "digits")["replicas"])
    assert client.set_threads("digits", 2) == {"model": "digits", "threads": 2}
    assert model_state(client, "digits")["threads"] == 2  # what was asked, at once
    wait_until(lambda: _acked(client, 2), timeout_s=10)  # what the workers run with
    client.set_threads("digits", 1)
    wait_until(lambda: _acked(client, 1), timeout_s=10)
    assert sorted(r["pid"] for r in model_state(client, "digits")["replicas"]) == pids


def test_threads_beyond_the_cores_are_refused_and_change_nothing(client) -> None:
    with pytest.raises(InvalidInput, match="oversubscribe"):
        client.set_threads("digits", CORES + 1)  # c = 1
    with pytest.raises(InvalidInput, match="greater than or equal to 1"):
        client.set_threads("digits", 0)
    with pytest.raises(UnknownModel):
        client.set_threads("nope", 1)
    state = model_state(client, "digits")
    assert state["threads"] == 1 and all(r["threads"] == 1 for r in state["replicas"])


def test_every_query_is_answered_once_while_threads_change(served, client) -> None:
    pids = sorted(r["pid"] for r in model_state(client, "digits")["replicas"])
    xs = np.random.default_rng(3).uniform(0, 1, size=(200, 64)).astype(np.float32)
    reference = [client.predict("digits", x.tolist())["output"] for x in xs[:20]]
    before = _served(client)
    done = threading.Event()
    changes: list[int] = []

    def toggle() -> None:
        with Client(served.url) as admin:
            for threads in [2, 1] * 20:
                if done.is_set():
                    break
                admin.set_threads("digits", threads)
                changes.append(threads)
                time.sleep(0.05)

    toggler = threading.Thread(target=toggle)
    toggler.start()
    try:
        answers = predict_all(served.url, "digits", xs, workers=8)
    finally:
        done.set()
        toggler.join()
    assert len(changes) >= 4, changes
    assert all(a["default"] is False for a in answers)
    for answer, expected in zip(answers[:20], reference, strict=True):
        np.testing.assert_allclose(answer["output"], expected, rtol=1e-5, atol=1e-6)
    wait_until(lambda: _served(client) == before + 200, timeout_s=10)
    assert _served(client) == before + 200  # each query computed exactly once
    assert sorted(r["pid"] for r in model_state(client, "digits")["replicas"]) == pids
    client.set_threads("digits", 1)
    wait_until(lambda: _acked(client, 1), timeout_s=10)


def test_the_threads_route_is_in_openapi_behind_the_token(served) -> None:
    import httpx

    doc = httpx.get(served.url + "/openapi.json", timeout=10).json()
    operation = doc["paths"]["/admin/models/{model}/threads"]["post"]
    assert operation.get("security"), operation
    ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    body = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert body["required"] == ["threads"] and body["properties"]["threads"]["minimum"] == 1
