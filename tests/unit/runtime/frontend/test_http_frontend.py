"""The HTTP frontend against an in-memory fake ServingSystem, through Starlette's TestClient."""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any

import anyio
import numpy as np
import orjson
import pytest
import tritonclient.http as triton
from starlette.exceptions import StarletteDeprecationWarning

from parityserve.config import Application, Deployment, FaultConfig, Limits, TensorSpec
from parityserve.errors import Conflict, InvalidInput, UnknownApplication, UnknownModel
from parityserve.runtime.frontend import http as http_module
from parityserve.runtime.frontend import v2
from parityserve.runtime.frontend.auth import AuthPolicy
from parityserve.runtime.frontend.http import create_app
from parityserve.runtime.modelpath.edge_array import json_value
from parityserve.runtime.modelpath.metrics import Metrics
from parityserve.runtime.serving.api import Answer, InferenceRequest, ModelMetadata, Prediction
from parityserve.runtime.serving.face import serve

with warnings.catch_warnings():
    # Starlette 1.x nudges its TestClient towards httpx2; on plain httpx it works the same,
    # and stays an httpx.Client, which is what parityserve.client accepts.
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

BUILD = triton.InferenceServerClient.generate_request_body
PARSE = triton.InferenceServerClient.parse_response_body
TOKEN = "unit-test-token"
AUTH = AuthPolicy(token=TOKEN)  # admin behind a token, as served; the client sends it


class FakeSystem:
    """Model "double" (FP32 [3] -> 2x), model "words" (BYTES [-1] -> echo), app "calc"."""

    def __init__(self) -> None:
        self.ready = True
        self.limits = Limits()
        self.uids: list[str | None] = []
        self.apps = {"calc": Application(name="calc", models=("double",))}
        self.models = {
            "double": ModelMetadata("double", ("1", "2"), "python",
                                    (TensorSpec(name="x", datatype="FP32", shape=(3,)),),
                                    (TensorSpec(name="y", datatype="FP32", shape=(3,)),)),
            "words": ModelMetadata("words", ("1",), "python",
                                   (TensorSpec(name="text", datatype="BYTES", shape=(-1,)),),
                                   (TensorSpec(name="echo", datatype="BYTES", shape=(-1,)),)),
        }
        self.replicas: dict[str, int] = {}
        self.faults: list[tuple[str, str, FaultConfig]] = []
        self.updates: list[tuple[str, str, Any, Any]] = []
        self.deployed: list[Deployment] = []
        self.infer_calls: list[tuple[str, int | None]] = []

    def _meta(self, model: str) -> ModelMetadata:
        if model not in self.models:
            raise UnknownModel(f"no model named {model!r}")
        return self.models[model]

    def _app(self, app: str) -> Application:
        if app not in self.apps:
            raise UnknownApplication(f"no application named {app!r}")
        return self.apps[app]

    async def predict(self, app: str, items: Sequence[Any],
                      uid: str | None = None) -> list[Prediction]:
        self._app(app)
        self.uids.append(uid)
        return [self._answer(i, item) for i, item in enumerate(items)]

    def _answer(self, i: int, item: Any) -> Prediction:
        item = json_value(item)  # numbers the HTTP layer decoded straight to an array, or not
        if item == "boom":
            raise RuntimeError("the fake blew up")
        if item == "late":
            return Prediction(str(i), None, default=True, default_explanation="deadline")
        if not (isinstance(item, list) and len(item) == 3):
            raise InvalidInput(f"expected shape [3], got {item!r}")
        return Prediction(str(i), np.asarray(item, np.float32) * 2, model="double", version=1)

    async def update(self, app: str, uid: str, item: Any, label: Any,
                     query_id: str | None = None) -> dict[str, Any]:
        self._app(app)
        self.updates.append((app, uid, item, label))
        return {"uid": uid, "updated": True}

    async def infer(self, request: InferenceRequest) -> Answer:
        return await serve(self, request)  # the real face, over this fake's parts

    async def infer_detailed(self, model: str, version: int | None,
                             batch: np.ndarray, timeout_s: float | None = None
                             ) -> tuple[np.ndarray, dict[int, str]]:
        self._meta(model)
        self.infer_calls.append((model, version))
        return (batch * 2 if model == "double" else batch), {}

    def model_metadata(self, model: str, version: int | None) -> ModelMetadata:
        meta = self._meta(model)
        if version is not None and str(version) not in meta.versions:
            raise UnknownModel(f"model {model!r} has no version {version}")
        return meta

    def has_graph(self, name: str) -> bool:  # no stateful graphs here
        return False

    def graph_share(self, address: str, target: str) -> AbstractAsyncContextManager[None]:
        return nullcontext()

    def is_ready(self) -> bool:
        return self.ready

    def model_ready(self, model: str, version: int | None) -> bool:
        self.model_metadata(model, version)
        return self.ready

    async def add_application(self, app: Application) -> None:
        if app.name in self.apps:
            raise Conflict(f"application {app.name!r} exists")
        self.apps[app.name] = app

    async def remove_application(self, name: str) -> None:
        self._app(name)
        del self.apps[name]

    async def deploy(self, deployment: Deployment) -> None:
        self.deployed.append(deployment)

    async def set_replicas(self, model: str, replicas: int) -> None:
        self._meta(model)
        self.replicas[model] = replicas

    async def link_models(self, app: str, models: Sequence[str]) -> None:
        old = self._app(app)
        self.apps[app] = old.model_copy(update={"models": old.models + tuple(models)})

    async def set_faults(self, model: str, replica: str, faults: FaultConfig) -> None:
        self._meta(model)
        self.faults.append((model, replica, faults))

    def state(self) -> dict[str, Any]:
        return {"applications": sorted(self.apps), "models": sorted(self.models),
                "replicas": self.replicas, "tags": {"a"}, "load": np.float32(0.5)}


@pytest.fixture
def system() -> FakeSystem:
    return FakeSystem()


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def client(system: FakeSystem, metrics: Metrics) -> TestClient:
    return TestClient(create_app(system, metrics=metrics, auth=AUTH, max_body_bytes=4096),
                      headers={"Authorization": f"Bearer {TOKEN}"})


def assert_error(response, status: int, code: str, message: str = "") -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["code"] == code
    assert re.search(message, body["error"]), body["error"]


def test_public_names_are_pinned():
    assert sorted(http_module.__all__) == ["DEFAULT_MAX_BODY_BYTES", "create_admin_app",
                                          "create_app"]


# ---------------------------------------------------------------- health and metadata


def test_server_metadata(client):
    body = client.get("/v2").json()
    assert body["name"] == "parityserve"
    assert body["extensions"] == ["binary_tensor_data"]
    assert re.match(r"\d+\.\d+", body["version"])


def test_health(client, system):
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/v2/health/ready").status_code == 200
    system.ready = False
    assert client.get("/v2/health/ready").status_code == 503
    assert client.get("/v2/health/live").status_code == 200


def test_model_metadata_includes_the_batch_axis(client):
    for path in ("/v2/models/double", "/v2/models/double/versions/2"):
        assert client.get(path).json() == {
            "name": "double", "versions": ["1", "2"], "platform": "python",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 3]}]}


def test_model_metadata_errors(client):
    assert_error(client.get("/v2/models/nope"), 404, "unknown_model", "'nope'")
    assert_error(client.get("/v2/models/double/versions/9"), 404, "unknown_model", "version 9")
    assert_error(client.get("/v2/models/double/versions/abc"), 404, "unknown_model", "'abc'")
    # Found by `make fuzz`: str.isdigit() accepts "²", which int() refuses (it was a 500).
    for digit in ("²", "٣"):
        for route in ("", "/ready", "/config"):
            assert_error(client.get(f"/v2/models/double/versions/{digit}{route}"), 404,
                         "unknown_model", "versions are positive integers")


def test_model_ready(client, system):
    assert client.get("/v2/models/double/ready").status_code == 200
    assert client.get("/v2/models/double/versions/1/ready").status_code == 200
    assert_error(client.get("/v2/models/nope/ready"), 404, "unknown_model")
    system.ready = False
    assert client.get("/v2/models/double/ready").status_code == 503


def test_model_config_is_triton_style(client):
    config = client.get("/v2/models/words/config").json()
    assert config["name"] == "words" and config["max_batch_size"] > 0
    assert config["input"] == [{"name": "text", "data_type": "TYPE_STRING", "dims": [-1]}]
    config = client.get("/v2/models/double/versions/1/config").json()
    assert config["output"] == [{"name": "y", "data_type": "TYPE_FP32", "dims": [3]}]


# ---------------------------------------------------------------- V2 inference


def post_triton(client, path: str, arrays: dict[str, np.ndarray], *, binary: bool,
                outputs: list | None = None):
    inputs = []
    for name, array in arrays.items():
        tensor = triton.InferInput(name, list(array.shape), v2.dtype_to_datatype(array.dtype))
        inputs.append(tensor.set_data_from_numpy(array, binary_data=binary))
    body, length = BUILD(inputs, outputs=outputs, request_id="rq")
    headers = {} if length is None else {v2.HEADER_LENGTH: str(length)}
    return client.post(path, content=body, headers=headers)


def parse(response):
    assert response.status_code == 200, response.text
    length = response.headers.get(v2.HEADER_LENGTH)
    return PARSE(response.content, header_length=None if length is None else int(length))


BATCH = np.arange(6, dtype=np.float32).reshape(2, 3)


def test_infer_json_mode(client):
    response = post_triton(client, "/v2/models/double/infer", {"x": BATCH}, binary=False,
                           outputs=[triton.InferRequestedOutput("y", binary_data=False)])
    assert response.headers["content-type"] == "application/json"
    result = parse(response)
    np.testing.assert_array_equal(result.as_numpy("y"), BATCH * 2)
    assert result.get_response()["id"] == "rq"
    assert result.get_response()["model_version"] == "2"  # the latest version answered


def test_infer_binary_mode(client, system):
    response = post_triton(client, "/v2/models/double/versions/1/infer", {"x": BATCH},
                           binary=True)
    assert response.headers["content-type"] == "application/octet-stream"
    result = parse(response)
    np.testing.assert_array_equal(result.as_numpy("y"), BATCH * 2)
    assert result.get_response()["model_version"] == "1"
    assert system.infer_calls == [("double", 1)]


def test_infer_binary_input_json_output(client):
    response = post_triton(client, "/v2/models/double/infer", {"x": BATCH}, binary=True,
                           outputs=[triton.InferRequestedOutput("y", binary_data=False)])
    assert v2.HEADER_LENGTH not in response.headers
    np.testing.assert_array_equal(parse(response).as_numpy("y"), BATCH * 2)


@pytest.mark.parametrize("binary", [False, True])
def test_infer_bytes_model(client, binary):
    words = np.array([[b"one", b"two"], [b"three", b"\xe2\x82\xac"]], dtype=object)
    response = post_triton(client, "/v2/models/words/infer", {"text": words}, binary=binary,
                           outputs=[triton.InferRequestedOutput("echo", binary_data=binary)])
    got = parse(response).as_numpy("echo")
    if not binary:
        got = np.vectorize(str.encode, otypes=[object])(got)
    np.testing.assert_array_equal(got, words)


def test_infer_wrong_shape(client):
    response = post_triton(client, "/v2/models/double/infer",
                           {"x": np.zeros((2, 4), np.float32)}, binary=True)
    assert_error(response, 400, "invalid_input",
                 r"input 'x': expected shape \[-1, 3\].*got \[2, 4\]")


def test_infer_wrong_dtype(client):
    response = post_triton(client, "/v2/models/double/infer",
                           {"x": np.zeros((2, 3), np.float64)}, binary=False)
    assert_error(response, 400, "invalid_input", "expected datatype FP32, got FP64")


def test_infer_needs_exactly_one_input(client):
    response = post_triton(client, "/v2/models/double/infer", {"a": BATCH, "b": BATCH},
                           binary=True)
    assert_error(response, 400, "invalid_input", r"exactly one input tensor, got 2")


def test_infer_unknown_model_and_output(client):
    response = post_triton(client, "/v2/models/nope/infer", {"x": BATCH}, binary=True)
    assert_error(response, 404, "unknown_model")
    response = post_triton(client, "/v2/models/double/infer", {"x": BATCH}, binary=True,
                           outputs=[triton.InferRequestedOutput("zzz")])
    assert_error(response, 400, "invalid_input", "no output 'zzz'")


def test_infer_malformed_bodies(client):
    path = "/v2/models/double/infer"
    assert_error(client.post(path, content=b"{oops"), 400, "malformed_request", "invalid JSON")
    assert_error(client.post(path, content=b"{}", headers={v2.HEADER_LENGTH: "x"}), 400,
                 "malformed_request", "Inference-Header-Content-Length")
    body = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3],
                                     "data": [1, 2]}]})
    assert_error(client.post(path, content=body), 400, "invalid_input",
                 r"tensor 'x'.*2 elements.*needs 3")


# ---------------------------------------------------------------- Clipper-style routes


def test_predict_one(client):
    body = client.post("/calc/predict", json={"input": [1, 2, 3]}).json()
    assert body == {"query_id": "0", "output": [2.0, 4.0, 6.0], "default": False,
                    "model": "double", "version": 1}


def test_predict_batch_with_a_default(client):
    answers = client.post("/calc/predict", json={"input_batch": [[1, 1, 1], "late"]}).json()
    assert [a["default"] for a in answers] == [False, True]
    assert answers[1]["default_explanation"] == "deadline"


@pytest.mark.parametrize(("body", "message"), [
    ({"input": [1, 2, 3], "input_batch": [[1, 2, 3]]}, "exactly one of"),
    ({"inputs": [1, 2, 3]}, "exactly one of"),
    ({"input_batch": []}, "non-empty list"),
    ({"input_batch": {"a": 1}}, "non-empty list"),
    ([1, 2, 3], "must be a JSON object"),
])
def test_predict_bad_bodies(client, body, message):
    assert_error(client.post("/calc/predict", json=body), 400, "malformed_request", message)


def test_predict_malformed_json(client):
    assert_error(client.post("/calc/predict", content=b'{"input": [1,'), 400,
                 "malformed_request", "invalid JSON")
    assert_error(client.post("/calc/predict", content=b""), 400, "malformed_request")


def test_predict_wrong_shape_and_unknown_app(client):
    assert_error(client.post("/calc/predict", json={"input": [1, 2]}), 400, "invalid_input",
                 r"expected shape \[3\]")
    assert_error(client.post("/nope/predict", json={"input": [1, 2, 3]}), 404,
                 "unknown_application", "'nope'")


def test_update(client, system):
    body = {"uid": "u1", "input": [1, 2, 3], "label": 4}
    assert client.post("/calc/update", json=body).json() == {"uid": "u1", "updated": True}
    assert system.updates == [("calc", "u1", [1, 2, 3], 4)]
    assert_error(client.post("/calc/update", json={"uid": "u1"}), 400, "malformed_request",
                 "missing")
    assert_error(client.post("/calc/update", json={**body, "uid": 3}), 400,
                 "malformed_request", "'uid'")
    assert_error(client.post("/nope/update", json=body), 404, "unknown_application")


# ---------------------------------------------------------------- body limit


def test_oversized_body_with_content_length(client, system):
    big = {"input": [1.0] * 2000}
    assert_error(client.post("/calc/predict", json=big), 413, "payload_too_large", "4096")
    assert_error(client.post("/v2/models/double/infer", content=b"x" * 5000), 413,
                 "payload_too_large")
    assert_error(client.post("/admin/models", content=b"x" * 5000,
                             headers={"content-type": "application/json"}), 413,
                 "payload_too_large")


def test_oversized_chunked_body(client):
    def chunks():
        for _ in range(5):
            yield b"x" * 1000

    response = client.post("/calc/predict", content=chunks())
    assert_error(response, 413, "payload_too_large", "exceeds")


def asgi_post(app, path: str, chunks: list[bytes], headers: list[tuple[bytes, bytes]]):
    """Drive the ASGI app by hand, so the body can contradict its Content-Length."""
    status, body = asgi_post_raw(app, path, chunks, headers)
    return status, orjson.loads(body)


def asgi_post_raw(app, path: str, chunks: list[bytes], headers: list[tuple[bytes, bytes]]
                  ) -> tuple[int, bytes]:
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                for i, c in enumerate(chunks)]
    sent: list[dict] = []

    async def receive():
        return messages.pop(0)

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "headers": headers,
             "client": ("127.0.0.1", 1), "server": ("testserver", 80)}
    anyio.run(app, scope, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def test_body_that_lies_about_its_length(system, metrics):
    app = create_app(system, metrics=metrics, auth=AUTH, max_body_bytes=2048)
    status, body = asgi_post(app, "/calc/predict", [b"x" * 1500] * 3,
                             [(b"content-length", b"10")])
    assert (status, body["code"]) == (413, "payload_too_large")
    status, body = asgi_post(app, "/calc/predict", [b'{"input": [1, 2, 3]}'],
                             [(b"content-length", b"nine")])
    assert (status, body["code"]) == (400, "malformed_request")


# ---------------------------------------------------------------- admin


def test_admin_state(client):
    state = client.get("/admin/state").json()
    assert state == {"applications": ["calc"], "models": ["double", "words"], "replicas": {},
                     "tags": ["a"], "load": 0.5}


def test_admin_applications(client, system):
    response = client.post("/admin/applications",
                           json={"name": "shop", "models": ["double"], "slo_ms": 20})
    assert response.status_code == 201
    assert response.json()["slo_ms"] == 20
    assert system.apps["shop"].models == ("double",)
    assert_error(client.post("/admin/applications", json={"name": "shop", "models": ["x"]}),
                 409, "conflict")
    response = client.post("/admin/applications/shop/models", json={"models": ["words"]})
    assert response.json() == {"application": "shop", "linked": ["words"]}
    assert system.apps["shop"].models == ("double", "words")
    assert client.delete("/admin/applications/shop").json() == {"removed": "shop"}
    assert_error(client.delete("/admin/applications/shop"), 404, "unknown_application")


@pytest.mark.parametrize(("path", "body", "fields"), [
    ("/admin/applications", {"name": "a b", "models": []}, ["name", "models"]),
    ("/admin/applications", {"name": "ok", "models": ["m"], "slo": 5}, ["slo"]),
    ("/admin/applications", {"name": "v2", "models": ["m"]}, ["reserved"]),
    ("/admin/applications/calc/models", {"models": []}, ["models"]),
    ("/admin/models", {"name": "m"}, ["source"]),
    ("/admin/models", {"name": "m", "source": "zoo:x", "replicas": -1}, ["replicas"]),
    ("/admin/models/double/replicas", {"replicas": "many"}, ["replicas"]),
    ("/admin/models/double/faults", {"replica": "first"}, ["replica"]),
    ("/admin/models/double/faults", {"faults": {"delay_ms": -5}}, ["faults.delay_ms"]),
    ("/admin/models/double/faults", {"faults": {"typo": 1}}, ["faults.typo"]),
])
def test_admin_bad_bodies_list_the_fields(client, system, path, body, fields):
    response = client.post(path, json=body)
    assert_error(response, 400, "invalid_input", "invalid")
    for field in fields:
        assert field in response.json()["error"]
    assert not system.deployed and not system.faults and not system.replicas


def test_admin_malformed_json(client):
    assert_error(client.post("/admin/models", content=b"nope",
                             headers={"content-type": "application/json"}), 400,
                 "malformed_request")
    assert_error(client.post("/admin/models", json=[1]), 400, "malformed_request")


def test_admin_models(client, system):
    response = client.post("/admin/models",
                           json={"name": "lenet", "source": "zoo:lenet5", "version": 2})
    assert response.status_code == 201
    assert response.json()["version"] == 2
    assert system.deployed[0].source == "zoo:lenet5"
    assert client.post("/admin/models/double/replicas", json={"replicas": 3}).json() == {
        "model": "double", "replicas": 3}
    assert system.replicas == {"double": 3}
    assert_error(client.post("/admin/models/nope/replicas", json={"replicas": 1}), 404,
                 "unknown_model")


def test_admin_faults(client, system):
    response = client.post("/admin/models/double/faults",
                           json={"replica": "0", "faults": {"delay_ms": 50}})
    assert response.json()["faults"]["delay_ms"] == 50
    assert system.faults == [("double", "0", FaultConfig(delay_ms=50))]
    client.post("/admin/models/double/faults", json={})
    assert system.faults[-1] == ("double", "all", FaultConfig())


# ---------------------------------------------------------------- errors and metrics


def test_unknown_route_and_method_are_json(client):
    assert_error(client.get("/nowhere/at/all"), 404, "not_found", "/nowhere/at/all")
    response = client.get("/calc/predict")
    assert_error(response, 405, "method_not_allowed")
    assert "POST" in response.headers["allow"]


def test_unexpected_error_is_a_logged_500_and_serving_goes_on(client, caplog):
    with caplog.at_level(logging.ERROR, logger="parityserve.runtime.frontend.http"):
        response = client.post("/calc/predict", json={"input": "boom"})
    assert_error(response, 500, "internal_error", "internal server error")
    assert "the fake blew up" not in response.text
    assert any(r.exc_info for r in caplog.records)
    assert client.post("/calc/predict", json={"input": [1, 2, 3]}).status_code == 200


def sample(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if found == labels:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_endpoint_shows_counters_moving(client):
    client.post("/calc/predict", json={"input": [1, 2, 3]})
    client.post("/calc/predict", json={"input_batch": [[1, 2, 3], "late"]})
    client.post("/calc/predict", json={"input": [1]})
    client.post("/nope/predict", json={"input": [1, 2, 3]})
    post_triton(client, "/v2/models/double/infer", {"x": BATCH}, binary=True)
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    total = "parityserve_requests_total"
    assert sample(text, total, route="predict", target="calc", outcome="ok") == 1
    assert sample(text, total, route="predict", target="calc", outcome="default") == 1
    # a client's mistake is not the server's error (the SLO rules count only the latter)
    assert sample(text, total, route="predict", target="calc", outcome="bad_request") == 1
    assert sample(text, total, route="predict", target="<unknown>", outcome="bad_request") == 1
    assert sample(text, total, route="predict", target="calc", outcome="error") == 0
    assert sample(text, total, route="infer", target="double", outcome="ok") == 1
    assert sample(text, "parityserve_bad_requests_total", code="invalid_input") == 1
    assert sample(text, "parityserve_bad_requests_total", code="unknown_application") == 1
    assert sample(text, "parityserve_request_latency_seconds_count",
                  route="predict", target="calc") == 3
    client.post("/calc/predict", json={"input": [1, 2, 3]})
    again = client.get("/metrics").text
    assert sample(again, total, route="predict", target="calc", outcome="ok") == 2
    assert sample(again, total, route="metrics", target="", outcome="ok") == 1


def test_predict_passes_the_uid_and_rejects_a_bad_one(client, system) -> None:
    r = client.post("/calc/predict", json={"input": [1, 2, 3], "uid": "alice"})
    assert r.status_code == 200
    assert system.uids[-1] == "alice"
    r = client.post("/calc/predict", json={"input": [1, 2, 3], "uid": 7})
    assert r.status_code == 400 and r.json()["code"] == "malformed_request"


# ---------------------------------------------------------------- the hot-path front door

_V2_BODY = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3],
                                     "data": [1, 2, 3]}]})
_PREDICT_BODY = orjson.dumps({"input": [1, 2, 3]})


@pytest.mark.parametrize("path, expected", [
    ("/calc/predict", ("predict", {"app": "calc"})),
    ("/v2/models/double/infer", ("infer", {"model": "double"})),
    ("/v2/models/double/versions/2/infer", ("infer", {"model": "double", "version": "2"})),
    ("/v2/models/double/versions/x/infer", ("infer", {"model": "double", "version": "x"})),
    ("/v2/predict", ("predict", {"app": "v2"})),  # as Starlette: the first route wins
    ("//predict", None), ("/calc/predict/", None), ("/a/b/predict", None),
    ("/v2/models//infer", None), ("/v2/models/double/versions//infer", None),
    ("/v2/models/double/ready", None), ("/v2/models/double/x/2/infer", None),
    ("/calc/update", None), ("/metrics", None),
])
def test_hot_paths_match_what_starlette_would(system, metrics, path, expected):
    app = create_app(system, metrics=metrics, auth=AUTH)
    found = app.match(path)
    if expected is None:
        assert found is None
    else:
        endpoint, params = found
        assert (endpoint, params) == (app.endpoints[expected[0]], expected[1])


@pytest.mark.parametrize(("method", "root_path", "hot"), [
    ("POST", "", True), ("GET", "", False), ("PUT", "", False), ("POST", "/mounted", False),
])
def test_hot_paths_route_only_posts_without_a_root_path(system, metrics, method, root_path,
                                                        hot):
    """The one rule of what is hot, for the ASGI path and the protocol's own cycle alike;
    a hot scope gains its path parameters and app, as Starlette's router sets them."""
    app = create_app(system, metrics=metrics, auth=AUTH)
    scope = {"type": "http", "method": method, "root_path": root_path,
             "path": "/v2/models/double/versions/2/infer"}
    endpoint = app.route(scope)
    if not hot:
        assert endpoint is None and "path_params" not in scope and "app" not in scope
    else:
        assert endpoint is app.endpoints["infer"]
        assert scope["path_params"] == {"model": "double", "version": "2"}
        assert scope["app"] is app.app


@pytest.mark.parametrize("path", [
    "/calc/predict", "/nope/predict", "//predict", "/calc/predict/",
    "/v2/models/double/infer", "/v2/models/double/versions/1/infer",
    "/v2/models/double/versions/x/infer", "/v2/models/ghost/infer", "/v2/models//infer",
])
def test_hot_paths_answer_exactly_as_the_starlette_routes(system, metrics, path):
    """The same request through the front door and through Starlette alone: same answer."""
    body = _PREDICT_BODY if path.endswith("predict") else _V2_BODY
    headers = [(b"content-type", b"application/json")]
    app = create_app(system, metrics=metrics, auth=AUTH)
    through_front_door = asgi_post_raw(app, path, [body], headers)
    starlette_only = asgi_post_raw(app.app, path, [body], headers)
    assert through_front_door == starlette_only


def test_hot_paths_leave_other_methods_to_starlette(client):
    response = client.put("/v2/models/double/infer", content=_V2_BODY)
    assert_error(response, 405, "method_not_allowed")


# ---------------------------------------------------------------- overload and limits


class OverloadedSystem(FakeSystem):
    """Every query is shed, as by core/admission.py."""

    def _shed(self, model: str) -> None:
        from parityserve.errors import Overloaded

        raise Overloaded(f"model {model!r} is overloaded", model=model, depth=42,
                         retry_after_s=2.2)

    async def predict(self, app: str, items: Sequence[Any],
                      uid: str | None = None) -> list[Prediction]:
        self._shed("double")
        return []

    async def infer_detailed(self, model: str, version: int | None,
                             batch: np.ndarray, timeout_s: float | None = None
                             ) -> tuple[np.ndarray, dict[int, str]]:
        self._shed(model)
        return batch, {}


def _infer_body(data: Any, shape: list[int]) -> dict[str, Any]:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": shape, "data": data}]}


@pytest.mark.parametrize("status", [503, 429])
def test_a_shed_query_gets_the_overload_status_retry_after_and_its_queue(status, metrics):
    client = TestClient(create_app(OverloadedSystem(), metrics=metrics, auth=AUTH,
                                   overload_status=status))
    for response in (client.post("/calc/predict", json={"input": [1, 2, 3]}),
                     client.post("/v2/models/double/infer", json=_infer_body([1, 2, 3], [1, 3]))):
        assert_error(response, status, "overloaded", "'double' is overloaded")
        assert response.headers["retry-after"] == "3"  # whole seconds, rounded up
        body = response.json()
        assert (body["model"], body["queue_depth"], body["retry_after_s"]) == ("double", 42, 3)


def test_an_explicit_max_queue_when_full_answers_like_an_overload(metrics):
    from parityserve.errors import QueueFull

    class Full(FakeSystem):
        async def predict(self, app, items, uid=None):
            raise QueueFull("queue is at its capacity of 2 entries")

    client = TestClient(create_app(Full(), metrics=metrics, auth=AUTH, overload_status=429))
    response = client.post("/calc/predict", json={"input": [1, 2, 3]})
    assert_error(response, 429, "overloaded", "capacity of 2")
    assert response.headers["retry-after"] == "1"


def _limited(system: FakeSystem, metrics: Metrics, **limits: int) -> TestClient:
    system.limits = Limits(**limits)  # one server's limits, at its edge and in its system
    return TestClient(create_app(system, metrics=metrics, auth=AUTH, max_body_bytes=1 << 20,
                                 limits=system.limits))


def _nest(depth: int) -> Any:
    value: Any = 1.0
    for _ in range(depth):
        value = [value]
    return value


# Inputs themselves are scanned by the system, in the same pass as the signature check
# (tests/unit/runtime/serving/test_system_overload.py); the frontend scans every other value.
@pytest.mark.parametrize(("route", "body"), [
    ("/calc/predict", {"input": [1, 2, 3], "extra": _nest(6)}),  # body 1, lists 2..7
    ("/calc/update", {"uid": "u", "input": [1, 2, 3], "label": _nest(6)}),
    ("/v2/models/double/infer", _infer_body(_nest(4), [1, 1, 1, 1])),  # data lists 4..7
])
def test_json_deeper_than_the_limit_is_refused_naming_it(system, metrics, route, body):
    client = _limited(system, metrics, max_json_depth=6)
    assert_error(client.post(route, json=body), 400, "limit_exceeded", "max_json_depth = 6")
    assert not system.updates and not system.infer_calls


def test_json_within_the_depth_limit_is_served(system, metrics):
    client = _limited(system, metrics, max_json_depth=6)
    response = client.post("/calc/predict", json={"input": _nest(5), "extra": _nest(5)})
    assert_error(response, 400, "invalid_input", "expected shape")  # the fake's check, not ours


def test_orjsons_own_depth_limit_is_reported_as_ours(system, metrics):
    client = _limited(system, metrics)
    deep = b'{"input": ' + b"[" * 1100 + b"]" * 1100 + b"}"
    for route in ("/calc/predict", "/v2/models/double/infer"):
        response = client.post(route, content=deep)
        assert_error(response, 400, "limit_exceeded", "max_json_depth = 32")


def test_input_batch_longer_than_the_limit_is_refused(system, metrics):
    client = _limited(system, metrics, max_batch_items=2)
    response = client.post("/calc/predict", json={"input_batch": [[1, 2, 3]] * 3})
    assert_error(response, 400, "limit_exceeded", "3 queries, more than max_batch_items = 2")
    ok = client.post("/calc/predict", json={"input_batch": [[1, 2, 3]] * 2})
    assert ok.status_code == 200


def test_v2_rows_past_the_batch_limit_are_refused(system, metrics):
    client = _limited(system, metrics, max_batch_items=2)
    response = client.post("/v2/models/double/infer", json=_infer_body([1.0] * 9, [3, 3]))
    assert_error(response, 400, "limit_exceeded", "3 rows, more than max_batch_items = 2")
    binary, headers = v2.encode_infer_request([("x", np.ones((3, 3), np.float32))], binary=True)
    response = client.post("/v2/models/double/infer", content=binary, headers=headers)
    assert_error(response, 400, "limit_exceeded", "max_batch_items = 2")
    assert not system.infer_calls


@pytest.mark.parametrize(("route", "body"), [
    ("/calc/update", {"uid": "u", "input": [1, 2, 3], "label": [1.0] * 5}),
    ("/v2/models/double/infer", _infer_body([1.0] * 10, [2, 5])),
])
def test_inputs_with_more_elements_than_the_limit_are_refused(system, metrics, route, body):
    client = _limited(system, metrics, max_input_elements=4)
    assert_error(client.post(route, json=body), 400, "limit_exceeded",
                 "max_input_elements = 4")


def test_v2_binary_rows_are_limited_by_shape_not_by_reading(system, metrics):
    client = _limited(system, metrics, max_input_elements=4)
    binary, headers = v2.encode_infer_request([("x", np.ones((1, 5), np.float32))], binary=True)
    response = client.post("/v2/models/double/infer", content=binary, headers=headers)
    assert_error(response, 400, "limit_exceeded", "5 values per row")


def test_v2_deadline_exceeded_is_a_504_json_error(metrics):
    from parityserve.errors import DeadlineExceeded

    class Late(FakeSystem):
        async def infer_detailed(self, model, version, batch, timeout_s=None):
            raise DeadlineExceeded(f"model {model!r} did not answer within 100 ms")

    client = TestClient(create_app(Late(), metrics=metrics, auth=AUTH))
    response = client.post("/v2/models/double/infer", json=_infer_body([1, 2, 3], [1, 3]))
    assert_error(response, 504, "deadline_exceeded", "within 100 ms")


@pytest.mark.parametrize(("route", "body", "code"), [
    ("/calc/predict", {"input": [1, 2, 3], "uid": 7}, "malformed_request"),
    ("/calc/predict", {"input_batch": {"a": 1}}, "malformed_request"),
    ("/calc/update", {"uid": "", "input": [1, 2, 3], "label": 1}, "malformed_request"),
    ("/calc/update", {"uid": "u", "input": [1, 2, 3]}, "malformed_request"),
    ("/calc/update", [1, 2], "malformed_request"),
    ("/v2/models/double/infer", {"inputs": [{"name": "x", "datatype": "FP32",
                                             "shape": [1, -3], "data": [1]}]},
     "malformed_request"),
    ("/v2/models/double/infer", {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3],
                                             "data": [[1, 2], [3]]}]}, "invalid_input"),
    ("/v2/models/double/infer", {"inputs": "x"}, "malformed_request"),
])
def test_bad_bodies_on_the_query_routes_are_4xx_not_500(client, route, body, code):
    response = client.post(route, json=body)
    assert 400 <= response.status_code < 500, response.text
    assert response.json()["code"] == code


def test_shed_and_rebuilt_answers_have_their_own_outcome(metrics):
    """The dashboard splits traffic by outcome: a shed query is not an error, a rebuilt
    answer not a plain prediction."""
    shed = TestClient(create_app(OverloadedSystem(), metrics=metrics, auth=AUTH))
    shed.post("/calc/predict", json={"input": [1, 2, 3]})
    shed.post("/v2/models/double/infer", json=_infer_body([1, 2, 3], [1, 3]))

    class Rebuilt(FakeSystem):
        def _answer(self, i: int, item: Any) -> Prediction:
            answer = super()._answer(i, item)
            answer.extra["reconstructed"] = "berrut"
            return answer

        async def infer_detailed(self, model, version, batch, timeout_s=None):
            return (await super().infer_detailed(model, version, batch))[0], {0: "berrut"}

        def expected_accuracy(self, model, version, method):
            return None

    rebuilt = TestClient(create_app(Rebuilt(), metrics=metrics, auth=AUTH))
    rebuilt.post("/calc/predict", json={"input": [1, 2, 3]})
    post_triton(rebuilt, "/v2/models/double/infer", {"x": BATCH}, binary=True)
    text, total = rebuilt.get("/metrics").text, "parityserve_requests_total"
    assert sample(text, total, route="predict", target="calc", outcome="shed") == 1
    assert sample(text, total, route="infer", target="double", outcome="shed") == 1
    assert sample(text, total, route="predict", target="calc", outcome="reconstructed") == 1
    assert sample(text, total, route="infer", target="double", outcome="reconstructed") == 1
    assert sample(text, total, route="predict", target="calc", outcome="error") == 0
