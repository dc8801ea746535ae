"""Worker-side fault injection, set in the config and through the admin API, on real workers.

Only cheap models (``zoo:echo``, ``zoo:noop``) so that the injected faults are the only thing
that takes time. The cache is off: every query really reaches a worker.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import joblib
import numpy as np
import pytest
from conftest import model_state, wait_until

from parityserve.client import Client
from parityserve.errors import InvalidInput

pytestmark = pytest.mark.integration

VECTOR = {"name": "input", "datatype": "FP32", "shape": [4]}


def _app(name: str, slo_ms: float = 5000) -> dict:
    return {"name": name, "models": [name], "slo_ms": slo_ms, "default_output": "DEFAULT"}


@pytest.fixture(scope="module")
def text_labels(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A scikit-learn classifier whose predictions are strings, not numbers."""
    from sklearn.linear_model import LogisticRegression

    x = np.array([[0, 0], [1, 1], [0, 1], [1, 0]], dtype=np.float32)
    path = tmp_path_factory.mktemp("text") / "pets.joblib"
    joblib.dump(LogisticRegression().fit(x, ["cat", "dog", "cat", "dog"]), path)
    return str(path)


@pytest.fixture(scope="module")
def served(server_factory, text_labels):
    config = {
        "server": {"http_port": 0, "cache_bytes": 0, "heartbeat_timeout_ms": 3000},
        "models": [
            {"name": "delayed", "source": "zoo:noop", "replicas": 1,
             "faults": {"0": {"delay_ms": 150}}},
            {"name": "noisy", "source": "zoo:echo", "replicas": 1, "input": VECTOR,
             "faults": {"all": {"wrong_probability": 1.0, "wrong_kind": "noise",
                                "noise_sigma": 5}}},
            {"name": "plain", "source": "zoo:echo", "replicas": 1,  # no declared signature
             "faults": {"0": {"wrong_probability": 1.0, "noise_sigma": 5}}},
            {"name": "plain-lists", "source": "zoo:echo", "replicas": 1, "json_inputs": "python",
             "faults": {"0": {"wrong_probability": 1.0, "noise_sigma": 5}}},
            {"name": "text", "source": f"sklearn:{text_labels}", "replicas": 1,
             "faults": {"0": {"wrong_probability": 1.0, "wrong_kind": "labels"}}},
            {"name": "relabel", "source": "zoo:echo", "replicas": 1, "input": VECTOR,
             "faults": {"0": {"wrong_probability": 1.0, "wrong_kind": "labels"}}},
            {"name": "crashy", "source": "zoo:echo", "replicas": 2, "input": VECTOR,
             "faults": {"0": {"crash_after_batches": 2}}},
            {"name": "scaled", "source": "zoo:sleep", "options": {"sleep_ms": 100},
             "replicas": 1, "batching": {"max_batch_size": 1}},
            {"name": "bursty", "source": "zoo:noop", "replicas": 1,
             "faults": {"0": {"burst": {"every_ms": 200, "duration_ms": 200,
                                        "delay_ms": 100}}}},
        ],
        "applications": [_app("delayed"), _app("noisy"), _app("plain"), _app("plain-lists"),
                         _app("text"), _app("relabel"),
                         _app("crashy", slo_ms=10_000), _app("bursty"), _app("scaled")],
    }
    return server_factory(config)


@pytest.fixture
def client(served) -> Client:
    with Client(served.url) as c:
        yield c


def _timed(client: Client, app: str, x: object) -> tuple[dict, float]:
    started = time.monotonic()
    answer = client.predict(app, x)
    assert answer["default"] is False, answer
    return answer, time.monotonic() - started



def _restarts(client: Client, model: str) -> float:
    pattern = rf'^parityserve_replica_restarts_total\{{model="{model}",replica="0"\}} (\S+)$'
    found = re.search(pattern, client.metrics_text(), re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def _batch_times(client: Client, app: str, inputs: Iterator[list[float]],
                 done: Callable[[list[float]], bool], timeout_s: float = 60.0) -> list[float]:
    """Send ``inputs`` one at a time (each its own batch) until ``done(times)``: each batch's
    time as its worker measured it (the replica's ``worker_s`` grows by it, ``served`` by one),
    the injected delay included, and no client's or frontend's clock in it."""
    def replica() -> tuple[int, float]:
        r = model_state(client, app)["replicas"][0]
        return r["served"], r["worker_s"]

    times: list[float] = []
    deadline = time.monotonic() + timeout_s
    served, work = replica()
    while not done(times):
        assert time.monotonic() < deadline, f"not done after {len(times)} batches: {times}"
        _timed(client, app, next(inputs))
        now_served, now_work = replica()
        assert now_served == served + 1, (served, now_served)  # one query, one batch
        times.append(now_work - work)
        served, work = now_served, now_work
    return times


def test_configured_delay_then_cleared_through_the_admin_api(client) -> None:
    # Each batch's time on its worker's clock: the injected sleep is a lower bound while the
    # fault is set, and a no-op batch takes microseconds once it is cleared.
    slow = _batch_times(client, "delayed", ([float(i)] for i in range(3)), lambda t: len(t) == 3)
    assert min(slow) >= 0.15, slow
    reply = client.set_faults("delayed", "0")  # every setting at its default: no fault
    assert reply["replica"] == "0" and reply["faults"]["delay_ms"] == 0
    fast = _batch_times(client, "delayed", ([float(10 + i)] for i in range(3)),
                        lambda t: len(t) == 3)
    assert min(fast) < 0.15, fast  # were the fault still set, every one would be >= 0.15
    assert model_state(client, "delayed")["replicas"][0]["state"] == "ready"


def test_noise_makes_outputs_differ_from_inputs(client) -> None:
    rng = np.random.default_rng(0)
    for _ in range(5):
        x = rng.normal(size=4).astype(np.float32)
        answer, _ = _timed(client, "noisy", x.tolist())
        out = np.asarray(answer["output"], dtype=np.float32)
        assert out.shape == (4,)
        assert not np.allclose(out, x, atol=1e-3), (out, x)


@pytest.mark.parametrize("app", ["plain", "plain-lists"])
def test_noise_reaches_a_model_without_a_signature(client, app: str) -> None:
    # zoo:echo with no declared input gets (and returns) one array per batch by default, and
    # plain JSON lists with json_inputs: python; the worker corrupts either.
    x = [1.0, 2.0, 3.0]
    answer, _ = _timed(client, app, x)
    assert len(answer["output"]) == 3 and answer["output"] != x


def test_outputs_that_cannot_be_corrupted_are_served_not_crashed_on(client) -> None:
    # String class labels cannot be made wrong by the worker: it answers them as they are
    # instead of dying on every batch (which left the model with no replica at all).
    pid = model_state(client, "text")["replicas"][0]["pid"]
    answers = [_timed(client, "text", [float(a), float(b)])[0]["output"]
               for a, b in [(0, 0), (1, 1), (0, 0), (1, 1)]]
    assert set(answers) <= {"cat", "dog"}
    assert [r["pid"] for r in model_state(client, "text")["replicas"]] == [pid]
    assert _restarts(client, "text") == 0


def test_label_faults_move_the_argmax(client) -> None:
    rng = np.random.default_rng(1)
    for _ in range(5):
        scores = rng.permutation(np.arange(4, dtype=np.float32))
        answer, _ = _timed(client, "relabel", scores.tolist())
        out = np.asarray(answer["output"], dtype=np.float32)
        assert int(np.argmax(out)) != int(np.argmax(scores)), (out, scores)
        np.testing.assert_array_equal(np.sort(out), np.sort(scores))  # a swap, not noise


def test_faults_cleared_on_one_model_leave_the_others_alone(client) -> None:
    x = [0.0, 3.0, 1.0, 2.0]
    answer, _ = _timed(client, "relabel", x)
    assert int(np.argmax(answer["output"])) != 1
    client.set_faults("relabel", "all")
    answer, _ = _timed(client, "relabel", x)
    assert answer["output"] == x  # the echo is honest again
    noisy, _ = _timed(client, "noisy", x)
    assert noisy["output"] != x  # another model's faults are untouched


def test_crash_after_batches_restarts_the_worker_and_loses_no_query(client) -> None:
    before = _restarts(client, "crashy")
    pid = next(r["pid"] for r in model_state(client, "crashy")["replicas"] if r["index"] == 0)
    inputs = [[float(i), 0.0, 0.0, 0.0] for i in range(8)]
    answers = [_timed(client, "crashy", x)[0] for x in inputs]
    assert [a["output"] for a in answers] == inputs  # answered, correctly, exactly once each
    assert len({a["query_id"] for a in answers}) == len(inputs)
    assert _restarts(client, "crashy") >= before + 1

    def restarted() -> bool:
        replicas = model_state(client, "crashy")["replicas"]
        return (len(replicas) == 2 and all(r["state"] == "ready" for r in replicas)
                and pid not in [r["pid"] for r in replicas])

    wait_until(restarted)
    # The replacement came back without the one-shot crash: it keeps serving.
    again = [_timed(client, "crashy", [float(i), 1.0, 0.0, 0.0])[0] for i in range(4)]
    assert all(a["output"][1] == 1.0 for a in again)
    assert _restarts(client, "crashy") == before + 1


def test_bursts_slow_down_some_queries_but_not_all(client) -> None:
    """Guards burst injection: a batch served inside a burst is delayed by its 100 ms, one
    served between bursts is not. The verdict reads each batch's time on its worker's clock:
    the injected sleep makes a burst's batch take at least 100 ms, and a no-op batch between
    bursts takes microseconds; queries go on until both kinds are seen (bursts start at
    exponential gaps, mean 200 ms, and last 200 ms), or fail after 60 s."""
    inputs = ([float(i)] for i in itertools.count())
    times = _batch_times(client, "bursty", inputs,
                         lambda t: any(s >= 0.1 for s in t) and any(s < 0.1 for s in t))
    assert min(times) < 0.1 <= max(times), times


def test_faults_set_while_a_replica_starts_reach_it_once_ready(client) -> None:
    client.set_replicas("scaled", 2)
    client.set_faults("scaled", "1", delay_ms=300)  # replica 1 is still loading
    wait_until(lambda: [r["state"] for r in model_state(client, "scaled")["replicas"]]
          == ["ready", "ready"])
    # Batches of one on two replicas: four concurrent queries put two on each replica.
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: _timed(client, "scaled", [float(i)]), range(4)))
    # Each replica's own time per batch, as its worker measured it (the injected delay
    # included): a lower bound the sleeps guarantee, and an ordering, not a client's clock.
    per_batch = {r["index"]: r["worker_s"] / r["served"]
                 for r in model_state(client, "scaled")["replicas"] if r["served"]}
    assert per_batch[1] >= 0.4, per_batch  # 100 ms of model plus 300 ms injected on replica 1
    assert per_batch[0] < per_batch[1] - 0.2, per_batch  # replica 0 has no fault


def test_unknown_replica_index_is_invalid_input(client) -> None:
    with pytest.raises(InvalidInput, match="no replica '7'"):
        client.set_faults("delayed", "7", delay_ms=10)


@pytest.mark.parametrize("body", [
    {"replica": "0", "faults": {"wrong_probability": 2}},
    {"replica": "0", "faults": {"delay_ms": -1}},
    {"replica": "0", "faults": {"nonsense": 1}},
    {"replica": "first", "faults": {}},
    {"replica": "0", "faults": {"burst": {"every_ms": 100}}},
])
def test_invalid_fault_body_is_a_400_and_changes_nothing(served, client, body) -> None:
    r = httpx.post(f"{served.url}/admin/models/delayed/faults", json=body,
                   headers={"Authorization": f"Bearer {served.token}"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_input" and r.json()["error"]
    with pytest.raises(InvalidInput):
        client.set_faults("delayed", body["replica"], **body["faults"])
    # Still serving, with no delay of a second or more: the batch's time on its worker's
    # clock (the replica served it), not a client's, which a loaded machine can stretch.
    [worker_s] = _batch_times(client, "delayed", iter([[float(len(str(body)))]]),
                              lambda t: len(t) == 1)
    assert worker_s < 1.0, worker_s
