"""The serving core end to end: real HTTP server, real worker processes, real clients."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import joblib
import numpy as np
import pytest
import tritonclient.http as triton
from conftest import metric_value, model_state, wait_until

from parityserve.client import Client
from parityserve.errors import InvalidInput, UnknownApplication, UnknownModel

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def served(server_factory, digits_model: Path):
    config = {
        # test_admin_api_round_trip redeploys the sklearn (pickle) model through the API.
        "server": {"http_port": 0, "max_body_bytes": 64 * 1024, "heartbeat_timeout_ms": 1500,
                   "allow_code_sources": True, "model_roots": [str(digits_model.parent)]},
        "models": [
            {"name": "digits", "source": f"sklearn:{digits_model}", "replicas": 2,
             "batching": {"max_batch_size": 16}},
            # 3 s: the tight app's default must come while this model is still computing.
            {"name": "slow", "source": "zoo:sleep", "options": {"sleep_ms": 3000},
             "replicas": 1},
            {"name": "sleepy", "source": "zoo:sleep", "options": {"sleep_ms": 400},
             "replicas": 2, "batching": {"max_batch_size": 4}},
        ],
        "applications": [
            {"name": "digits", "models": ["digits"], "slo_ms": 2000, "default_output": -1},
            {"name": "tight", "models": ["slow"], "slo_ms": 50, "default_output": "fallback"},
            {"name": "sleepy", "models": ["sleepy"], "slo_ms": 10000, "default_output": -1},
        ],
    }
    return server_factory(config)


@pytest.fixture
def client(served) -> Client:
    with Client(served.url) as c:
        yield c


def _triton(served) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(served.url.removeprefix("http://"))


def _expected(digits_model: Path, x: np.ndarray) -> np.ndarray:
    return joblib.load(digits_model).predict(x)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_v2_infer_through_tritonclient(served, digits_model, digits_data, binary) -> None:
    x = digits_data[2][:8].astype(np.float32)
    tc = _triton(served)
    assert tc.is_server_live() and tc.is_server_ready() and tc.is_model_ready("digits")
    meta = tc.get_model_metadata("digits")
    assert meta["inputs"][0]["datatype"] == "FP32"
    inp = triton.InferInput(meta["inputs"][0]["name"], list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out_name = meta["outputs"][0]["name"]
    result = tc.infer("digits", [inp], outputs=[
        triton.InferRequestedOutput(out_name, binary_data=binary)])
    np.testing.assert_array_equal(result.as_numpy(out_name).ravel(), _expected(digits_model, x))
    tc.close()


def test_v2_versioned_route_and_unknown_version(served, digits_data) -> None:
    x = digits_data[2][:2].astype(np.float32)
    tc = _triton(served)
    inp = triton.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    assert tc.infer("digits", [inp], model_version="1").as_numpy(
        tc.get_model_metadata("digits")["outputs"][0]["name"]).shape[0] == 2
    with pytest.raises(triton.InferenceServerException, match="version"):
        tc.infer("digits", [inp], model_version="7")
    tc.close()


def test_clipper_predict_single_and_batch(client, digits_model, digits_data) -> None:
    x = digits_data[2][:5]
    expected = _expected(digits_model, x)
    one = client.predict("digits", x[0])
    assert one["default"] is False and one["output"] == expected[0] and "query_id" in one
    many = client.predict_batch("digits", list(x))
    assert [m["output"] for m in many] == list(expected)
    assert len({m["query_id"] for m in many}) == 5


def test_replica_state_splits_round_trips_into_worker_time_and_transport(client) -> None:
    def sums() -> tuple[float, float, int]:
        replicas = model_state(client, "sleepy")["replicas"]
        return (sum(r["round_trip_s"] for r in replicas), sum(r["worker_s"] for r in replicas),
                sum(r["served"] for r in replicas))

    trip0, work0, served0 = sums()
    started = time.monotonic()
    assert client.predict("sleepy", [1.0])["default"] is False
    elapsed = time.monotonic() - started
    trip, work, served = sums()
    assert served == served0 + 1
    assert 0.4 <= work - work0 < trip - trip0  # the worker's 400 ms sleep, inside the trip
    assert trip - trip0 < elapsed  # and the trip inside the client's wait, not the test's


def test_update_stores_feedback(client, digits_data) -> None:
    before = client.state()["applications"][0]["feedback_stored"]
    reply = client.update("digits", "user-1", digits_data[2][0], int(digits_data[3][0]))
    assert reply["ok"] is True and reply["feedback_stored"] == before + 1


def test_default_output_on_slo_miss(client) -> None:
    """The default comes at the 50 ms deadline, flagged and counted, not when the 3 s model
    finishes: its replica has served nothing yet when the answer is in (an ordering of
    states, not a clock bound)."""
    defaults = metric_value(client, "parityserve_default_outputs_total", app="tight")
    served = sum(r["served"] for r in model_state(client, "slow")["replicas"])
    answer = client.predict("tight", [0.0])
    assert sum(r["served"] for r in model_state(client, "slow")["replicas"]) == served
    assert answer["default"] is True and answer["output"] == "fallback"
    assert "50 ms SLO" in answer["default_explanation"]
    assert metric_value(client, "parityserve_default_outputs_total", app="tight") == defaults + 1


def test_cache_hit_for_repeated_input(served, client, digits_data) -> None:
    x = digits_data[2][100] + 0.001  # an input no other test sends
    hits = served.system.cache.statistics().hits
    counted = metric_value(client, "parityserve_cache_hits_total", model="digits")
    first, second = client.predict("digits", x), client.predict("digits", x)
    assert first["output"] == second["output"]
    assert served.system.cache.statistics().hits == hits + 1
    assert metric_value(client, "parityserve_cache_hits_total", model="digits") == counted + 1


def test_worker_killed_mid_batch_loses_no_query(served, client) -> None:
    """A replica SIGKILLed while it holds a batch loses none of it: its queries go back to
    the queue (the queue's requeued count shows the kill landed mid-batch) and every query
    is answered once, by the model, and the replica is replaced."""
    replicas = model_state(client, "sleepy")["replicas"]
    victim, slot = replicas[0]["pid"], str(replicas[0]["index"])
    # The victim holds its batches 5 s longer: the kill lands inside one, however slow the
    # machine (the fault goes with the process; its replacement has none).
    client.set_faults("sleepy", slot, delay_ms=5000)
    requeued = model_state(client, "sleepy")["queue"]["requeued"]
    restarts = metric_value(client, "parityserve_replica_restarts_total", model="sleepy",
                            replica=slot)

    def victim_busy() -> bool:
        return any(r["pid"] == victim and r["inflight"] > 0
                   for r in model_state(client, "sleepy")["replicas"])

    inputs = [[float(i)] for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(client.predict, "sleepy", x) for x in inputs]
        wait_until(victim_busy)
        os.kill(victim, signal.SIGKILL)
        answers = [f.result(timeout=30) for f in futures]
    assert model_state(client, "sleepy")["queue"]["requeued"] > requeued
    assert all(a["default"] is False for a in answers), answers
    assert len({a["query_id"] for a in answers}) == 8
    wait_until(lambda: all(r["state"] == "ready" for r in model_state(client, "sleepy")["replicas"])
          and victim not in [r["pid"] for r in model_state(client, "sleepy")["replicas"]])
    assert metric_value(client, "parityserve_replica_restarts_total", model="sleepy",
                        replica=slot) == restarts + 1


def test_hung_worker_is_restarted_and_its_work_redispatched(client) -> None:
    client.set_faults("sleepy", "0", hang_after_batches=0)
    answers = [client.predict("sleepy", [float(100 + i)]) for i in range(3)]
    assert all(a["default"] is False for a in answers)


@pytest.mark.parametrize(("body", "status", "code"), [
    (b"{not json", 400, "malformed_request"),
    (b'{"input": [1, 2, 3]}', 400, "invalid_input"),           # wrong shape
    (b'{"input": [' + b'"x",' * 63 + b'"x"]}', 400, "invalid_input"),  # wrong dtype
    (b'{"inputs": []}', 400, "malformed_request"),
])
def test_bad_input_gets_a_clear_4xx(served, body, status, code) -> None:
    r = httpx.post(f"{served.url}/digits/predict", content=body,
                   headers={"content-type": "application/json"})
    assert r.status_code == status and r.json()["code"] == code and r.json()["error"]


def test_oversized_body_and_unknown_targets(served, client, digits_data) -> None:
    too_large = metric_value(client, "parityserve_bad_requests_total", code="payload_too_large")
    big = b'{"input": [' + b"0.0," * 40_000 + b"0.0]}"
    r = httpx.post(f"{served.url}/digits/predict", content=big)
    assert r.status_code == 413 and r.json()["code"] == "payload_too_large"
    with pytest.raises(UnknownApplication):
        client.predict("nope", [1.0])
    with pytest.raises(UnknownModel):
        client.infer("nope", np.zeros((1, 64), np.float32))
    with pytest.raises(InvalidInput):
        client.infer("digits", np.zeros((1, 3), np.float32))
    assert client.predict("digits", digits_data[2][0])["default"] is False  # still serving
    assert metric_value(client, "parityserve_bad_requests_total",
                        code="payload_too_large") == too_large + 1


def test_admin_api_round_trip(client, digits_model, digits_data) -> None:
    client.add_application("digits-b", ["digits"], slo_ms=1000, default_output=-2)
    assert client.predict("digits-b", digits_data[2][0])["default"] is False
    client.link_models("digits-b", ["digits"])
    client.set_replicas("digits", 3)
    wait_until(lambda: len(model_state(client, "digits")["replicas"]) == 3
          and all(r["state"] == "ready" for r in model_state(client, "digits")["replicas"]))
    client.set_replicas("digits", 2)
    wait_until(lambda: len(model_state(client, "digits")["replicas"]) == 2)
    client.deploy({"name": "digits", "source": f"sklearn:{digits_model}", "version": 2,
                   "replicas": 1})
    assert model_state(client, "digits")["version"] == 2
    assert client.predict("digits-b", digits_data[2][1])["version"] == 2
    client.remove_application("digits-b")
    with pytest.raises(UnknownApplication):
        client.predict("digits-b", digits_data[2][0])

