"""parityserve.client.Client against the real frontend, through Starlette's TestClient."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any

import httpx
import numpy as np
import pytest
from starlette.exceptions import StarletteDeprecationWarning

from parityserve import errors
from parityserve.client import Client
from parityserve.config import Application, Deployment, FaultConfig, Limits, TensorSpec
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


def _spec(name: str, datatype: str = "FP32", shape: tuple[int, ...] = (3,)) -> TensorSpec:
    return TensorSpec(name=name, datatype=datatype, shape=shape)


class FakeSystem:
    """Model "double" (FP32 [3] -> 2x) in versions 1 and 2, model "words" (BYTES echo)."""

    def __init__(self) -> None:
        self.ready = True
        self.limits = Limits()
        self.uids: list[str | None] = []
        self.apps: dict[str, Application] = {"calc": Application(name="calc", models=("double",))}
        self.models = {
            "double": ModelMetadata("double", ("1", "2"), "python", (_spec("x"),), (_spec("y"),)),
            "words": ModelMetadata("words", ("1",), "python", (_spec("t", "BYTES", (-1,)),),
                                   (_spec("e", "BYTES", (-1,)),)),
        }
        self.calls: list[tuple[Any, ...]] = []

    def _app(self, app: str) -> Application:
        if app not in self.apps:
            raise errors.UnknownApplication(f"no application named {app!r}")
        return self.apps[app]

    async def predict(self, app: str, items: Sequence[Any],
                      uid: str | None = None) -> list[Prediction]:
        self._app(app)
        self.uids.append(uid)
        items = [json_value(item) for item in items]  # the HTTP layer may decode to arrays
        for item in items:
            if not (isinstance(item, list) and len(item) == 3):
                raise errors.InvalidInput(f"expected shape [3], got {item!r}")
        return [Prediction(str(i), [2 * v for v in x]) for i, x in enumerate(items)]

    async def update(self, app: str, uid: str, item: Any, label: Any,
                     query_id: str | None = None) -> dict[str, Any]:
        self._app(app)
        self.calls.append(("update", app, uid, item, label))
        return {"uid": uid}

    async def infer(self, request: InferenceRequest) -> Answer:
        return await serve(self, request)  # the real face, over this fake's parts

    async def infer_detailed(self, model: str, version: int | None,
                             batch: np.ndarray, timeout_s: float | None = None
                             ) -> tuple[np.ndarray, dict[int, str]]:
        self.calls.append(("infer", model, version))
        return (batch * 2 if model == "double" else batch), {}

    def model_metadata(self, model: str, version: int | None) -> ModelMetadata:
        if model not in self.models or (version and str(version) not in self.models[model]
                                        .versions):
            raise errors.UnknownModel(f"no model {model!r} version {version}")
        return self.models[model]

    def has_graph(self, name: str) -> bool:  # no stateful graphs here
        return False

    def graph_share(self, address: str, target: str) -> AbstractAsyncContextManager[None]:
        return nullcontext()

    def is_ready(self) -> bool:
        return self.ready

    def model_ready(self, model: str, version: int | None) -> bool:
        return self.ready

    async def add_application(self, app: Application) -> None:
        if app.name in self.apps:
            raise errors.Conflict(f"application {app.name!r} exists")
        self.apps[app.name] = app

    async def remove_application(self, name: str) -> None:
        del self.apps[self._app(name).name]

    async def deploy(self, deployment: Deployment) -> None:
        self.calls.append(("deploy", deployment))

    async def set_replicas(self, model: str, replicas: int) -> None:
        self.calls.append(("replicas", model, replicas))

    async def link_models(self, app: str, models: Sequence[str]) -> None:
        self.calls.append(("link", self._app(app).name, tuple(models)))

    async def set_faults(self, model: str, replica: str, faults: FaultConfig) -> None:
        self.calls.append(("faults", model, replica, faults))

    def state(self) -> dict[str, Any]:
        return {"applications": sorted(self.apps)}


@pytest.fixture
def system() -> FakeSystem:
    return FakeSystem()


@pytest.fixture
def client(system: FakeSystem) -> Client:
    app = create_app(system, metrics=Metrics(), auth=AuthPolicy(token="t0ken"),
                     max_body_bytes=4096)
    return Client(http=TestClient(app), token="t0ken")


def test_predict(client):
    assert client.predict("calc", [1, 2, 3])["output"] == [2, 4, 6]
    assert client.predict("calc", np.array([1, 2, 3], np.float32))["output"] == [2, 4, 6]


def test_predict_batch_accepts_arrays_and_lists_of_arrays(client):
    batch = np.arange(6).reshape(2, 3)
    for xs in (batch, list(batch), batch.tolist(), batch[:, ::-1][:, ::-1]):
        answers = client.predict_batch("calc", xs)
        assert [a["output"] for a in answers] == [[0, 2, 4], [6, 8, 10]]


def test_update(client, system):
    assert client.update("calc", "u1", np.ones(3), np.int64(1)) == {"uid": "u1"}
    assert system.calls == [("update", "calc", "u1", [1.0, 1.0, 1.0], 1)]


@pytest.mark.parametrize("binary", [True, False])
def test_infer(client, system, binary):
    batch = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = client.infer("double", batch, binary=binary)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, batch * 2)
    np.testing.assert_array_equal(client.infer("double", batch, version=1, binary=binary,
                                               input_name="x"), batch * 2)
    assert system.calls == [("infer", "double", None), ("infer", "double", 1)]


@pytest.mark.parametrize("binary", [True, False])
def test_infer_bytes(client, binary):
    words = np.array([[b"a", b"bc"]], dtype=object)
    out = client.infer("words", words, binary=binary)
    assert out.dtype == object and all(isinstance(b, bytes) for b in out.flat)  # both modes
    np.testing.assert_array_equal(out, words)


def test_health(client, system):
    assert client.live() and client.ready()
    system.ready = False
    assert client.live() and not client.ready()


def test_model_metadata(client):
    assert client.model_metadata("double")["inputs"][0]["shape"] == [-1, 3]
    assert client.model_metadata("double", version=2)["versions"] == ["1", "2"]


def test_admin(client, system):
    assert client.state() == {"applications": ["calc"]}
    assert client.add_application("shop", ["double"], slo_ms=20.0)["slo_ms"] == 20.0
    assert system.apps["shop"].slo_ms == 20.0
    client.link_models("shop", ["words"])
    assert client.remove_application("shop") == {"removed": "shop"}
    assert "shop" not in system.apps
    client.deploy(Deployment(name="lenet", source="zoo:lenet5"))
    client.deploy({"name": "mlp", "source": "zoo:mlp", "version": 3})
    client.set_replicas("double", 2)
    client.set_faults("double", replica=0, delay_ms=5.0)
    client.set_faults("double", wrong_probability=0.5)
    deployed = [c[1] for c in system.calls if c[0] == "deploy"]
    assert [(d.name, d.version) for d in deployed] == [("lenet", 1), ("mlp", 3)]
    assert ("link", "shop", ("words",)) in system.calls
    assert ("replicas", "double", 2) in system.calls
    assert ("faults", "double", "0", FaultConfig(delay_ms=5.0)) in system.calls
    assert ("faults", "double", "all", FaultConfig(wrong_probability=0.5)) in system.calls


def test_metrics_text(client):
    client.predict("calc", [1, 2, 3])
    text = client.metrics_text()
    assert 'parityserve_requests_total{outcome="ok",route="predict",target="calc"} 1.0' in text


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda c: c.predict("nope", [1, 2, 3]), errors.UnknownApplication, "'nope'"),
    (lambda c: c.predict("calc", [1]), errors.InvalidInput, "expected shape"),
    (lambda c: c.predict("calc", [0.0] * 2000), errors.PayloadTooLarge, "4096"),
    (lambda c: c.infer("nope", np.zeros((1, 3), np.float32)), errors.UnknownModel, "'nope'"),
    (lambda c: c.infer("double", np.zeros((1, 4), np.float32)), errors.InvalidInput,
     "expected shape"),
    (lambda c: c.infer("double", np.zeros((1, 3))), errors.InvalidInput, "FP64"),
    (lambda c: c.model_metadata("double", version=7), errors.UnknownModel, "version 7"),
    (lambda c: c.add_application("calc", ["double"]), errors.Conflict, "exists"),
    (lambda c: c.add_application("x", []), errors.InvalidInput, "models"),
    (lambda c: c.set_faults("double", typo=1), errors.InvalidInput, "typo"),
    (lambda c: c.set_replicas("double", -1), errors.InvalidInput, "replicas"),
    (lambda c: c._call("GET", "/no/such/route"), errors.RequestError, "Not Found"),
])
def test_server_errors_become_parityserve_errors(client, call, error, message):
    with pytest.raises(error, match=message) as info:
        call(client)
    assert type(info.value) is error


def failing(exc: Exception) -> Client:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    return Client("http://10.9.8.7:8123", http=httpx.Client(transport=httpx.MockTransport(
        handler)))


def test_connection_failure_is_unavailable_with_the_url():
    client = failing(httpx.ConnectError("connection refused"))
    with pytest.raises(errors.Unavailable, match="http://10.9.8.7:8123"):
        client.predict("calc", [1, 2, 3])
    assert client.live() is False


def test_timeout_is_deadline_exceeded():
    with pytest.raises(errors.DeadlineExceeded, match="timed out"):
        failing(httpx.ReadTimeout("slow")).state()


def test_context_manager_closes_only_its_own_http_client():
    borrowed = httpx.Client()
    with Client(http=borrowed):
        pass
    assert not borrowed.is_closed
    borrowed.close()
    with Client("http://127.0.0.1:9/") as own:
        assert own.url == "http://127.0.0.1:9"
    assert own._http.is_closed
