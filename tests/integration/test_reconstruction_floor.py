"""Reconstructions worth serving (issue 21), on real workers: every rebuilt answer carries its
method and the expected accuracy of that method, with the numbers' source; an application's
``min_expected_accuracy`` turns a rebuilt answer below it (or never measured) into the
default output, still flagged.

``zoo:echo`` under ParM decodes exactly, so the rebuilt output is checkable; the expected
accuracies are the deployment's stated table (in a real deployment: a measured one, e.g.
``benchmarks/results/accuracy.md``, or the parity model's ``train-parity`` sidecar).
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as triton

from parityserve.client import Client
from tests.integration.conftest import metric_value

pytestmark = pytest.mark.integration

VECTOR = {"name": "input", "datatype": "FP32", "shape": [4]}
SLOW = {"delay_ms": 3000}  # replica 0 takes the first batch: ParM rebuilds it


def _model(name: str, **extra: object) -> dict:
    return {"name": name, "source": "zoo:echo", "replicas": 2, "input": VECTOR,
            "batching": {"max_batch_size": 4}, "parity": {"k": 2}, "faults": {"0": SLOW},
            **extra}


def _table(accuracy: float) -> dict:
    return {"expected_accuracy": {"parm-subtraction": accuracy},
            "source": "stated for this test"}


MODELS = [_model("low", reconstruction=_table(0.6)), _model("high", reconstruction=_table(0.95)),
          _model("unmeasured"), _model("plain", reconstruction=_table(0.6)),
          _model("viahttp", reconstruction=_table(0.95)), _model("viagrpc")]
FLOORS = {"low": 0.9, "high": 0.9, "unmeasured": 0.5, "plain": None, "viahttp": None,
          "viagrpc": None}


@pytest.fixture(scope="module")
def served(server_factory):
    config = {
        "server": {"http_port": 0, "cache_bytes": 0, "heartbeat_timeout_ms": 5000},
        "models": MODELS,
        "applications": [{"name": m["name"], "models": [m["name"]], "slo_ms": 10_000,
                          "default_output": "DEFAULT",
                          "min_expected_accuracy": FLOORS[m["name"]]} for m in MODELS],
    }
    return server_factory(config)


@pytest.fixture(scope="module")
def client(served):
    with Client(served.url) as c:
        yield c


def _slow_served(client: Client, model: str) -> int:
    """Batches the slow replica (data replica 0) has answered so far."""
    replicas = next(m for m in client.state()["models"] if m["name"] == model)["replicas"]
    return next(r["served"] for r in replicas if r["pool"] == "data" and r["index"] == 0)


def _rebuilt(client: Client, app: str, seed: int) -> tuple[dict, np.ndarray, bool]:
    """(answer, input, whether the slow replica had answered its batch when the answer was
    in): an ordering of states that says "rebuilt, not waited for" without a clock bound."""
    x = np.random.default_rng(seed).uniform(-1, 1, 4).astype(np.float32)
    served = _slow_served(client, app)
    answer = client.predict(app, x.tolist())  # the first idle replica is the slow one
    return answer, x, _slow_served(client, app) > served


def test_a_rebuilt_answer_above_the_floor_is_served_with_its_expected_accuracy(client) -> None:
    answer, x, waited = _rebuilt(client, "high", 0)
    assert answer["default"] is False, answer
    assert answer["reconstructed"] == "parm-subtraction"
    assert answer["expected_accuracy"] == pytest.approx(0.95)
    assert "stated for this test" in answer["expected_accuracy_source"]
    np.testing.assert_allclose(answer["output"], x, rtol=1e-5, atol=1e-5)
    assert not waited  # rebuilt, not waited for


def test_a_rebuilt_answer_below_the_floor_gives_the_default_still_flagged(client) -> None:
    counted = metric_value(client, "parityserve_default_outputs_total", app="low",
                           reason="low expected accuracy")
    answer, _, waited = _rebuilt(client, "low", 1)
    assert answer["default"] is True and answer["output"] == "DEFAULT", answer
    assert answer["reconstructed"] == "parm-subtraction"
    assert answer["expected_accuracy"] == pytest.approx(0.6)
    assert "low expected accuracy" in answer["default_explanation"]
    assert "below the application's floor 0.9" in answer["default_explanation"]
    assert not waited  # the default comes at once, not after the slow replica
    assert metric_value(client, "parityserve_default_outputs_total", app="low",
                        reason="low expected accuracy") == counted + 1


def test_an_unmeasured_reconstruction_fails_any_floor(client) -> None:
    answer, _, _ = _rebuilt(client, "unmeasured", 2)
    assert answer["default"] is True and answer["output"] == "DEFAULT", answer
    assert answer["reconstructed"] == "parm-subtraction"
    assert answer["expected_accuracy"] is None and "expected_accuracy_source" not in answer
    assert "not measured" in answer["default_explanation"]


def test_without_a_floor_a_low_accuracy_reconstruction_is_served_flagged(client) -> None:
    answer, x, _ = _rebuilt(client, "plain", 3)
    assert answer["default"] is False and answer["reconstructed"] == "parm-subtraction"
    assert answer["expected_accuracy"] == pytest.approx(0.6)
    np.testing.assert_allclose(answer["output"], x, rtol=1e-5, atol=1e-5)



def test_v2_http_reports_the_expected_accuracy_per_method(served) -> None:
    x = np.random.default_rng(5).uniform(-1, 1, (1, 4)).astype(np.float32)
    tc = triton.InferenceServerClient(served.url.removeprefix("http://"))
    inp = triton.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=False)
    result = tc.infer("viahttp", [inp])
    params = result.get_response()["parameters"]
    assert params["reconstruction"] == ["parm-subtraction"], params
    assert params["reconstruction_expected_accuracy"] == [0.95]
    tc.close()


def test_v2_grpc_says_unmeasured_where_nobody_measured(served) -> None:
    x = np.random.default_rng(6).uniform(-1, 1, (1, 4)).astype(np.float32)
    with tg.InferenceServerClient(served.grpc_url) as tc:
        inp = tg.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        params = tc.infer("viagrpc", [inp]).get_response().parameters
    assert params["reconstruction"].string_param == "parm-subtraction"
    assert params["reconstruction_expected_accuracy"].string_param == "unmeasured"
