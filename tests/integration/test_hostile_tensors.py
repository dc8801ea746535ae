"""Hostile tensors against a real server (issue 38, items 2 and 8): tritonclient over HTTP
(JSON and the binary extension) and gRPC, and the README's ``stocks`` graph.

A shape is the client's word, not the data: a request whose shape claims 2**32 elements
and carries 4 bytes is refused with a 4xx that names the bound, and the health route is
answered while such requests arrive. The graph route takes numbers only, as the model routes
do: BYTES and BOOL tensors, numeric strings, booleans and nulls get a 400.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import httpx
import numpy as np
import orjson
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from parityserve.client import Client
from parityserve.config import Limits
from parityserve.runtime.server import RunningServer
from tests.integration.conftest import start_server

pytestmark = pytest.mark.integration

HUGE = [1024, 4194304]  # 2**32 elements: within max_batch_items and max_input_elements
MANY_DIMS = [0] + [2**62] * 20_000


def config() -> dict:
    """The README's sequence service, beside a model with a signature and one without."""
    return {
        "server": {"http_port": 0, "require_admin_token": False},
        "models": [
            {"name": "vec", "source": "zoo:echo", "replicas": 1,
             "input": {"name": "x", "datatype": "FP32", "shape": [4]},
             "output": {"name": "y", "datatype": "FP32", "shape": [4]}},
            {"name": "free", "source": "zoo:echo", "replicas": 1},
            {"name": "features", "source": "zoo:echo"},
            {"name": "lstm1", "source": "zoo:stream-lstm",
             "options": {"input_size": 4, "outputs": 4, "seed": 1}},
            {"name": "lstm2", "source": "zoo:stream-lstm",
             "options": {"input_size": 4, "outputs": 1, "seed": 2}},
            {"name": "scorer", "source": "zoo:echo"}],
        "graphs": [{"name": "stocks", "stream_key": "ticker", "fault_tolerance": "hams",
                    "operators": [
                        {"name": "feat", "model": "features", "inputs": ["frontend"]},
                        {"name": "seq1", "model": "lstm1", "inputs": ["feat"],
                         "stateful": True},
                        {"name": "seq2", "model": "lstm2", "inputs": ["seq1"],
                         "stateful": True},
                        {"name": "score", "model": "scorer", "inputs": ["seq2"]}],
                    "output": "score"}],
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(config(), tmp_path_factory.mktemp("hostile"))
    yield running
    running.stop()


def _shaped(module, datatype: str, data: np.ndarray, shape: list[int], binary: bool | None):
    """A tritonclient input that carries ``data`` but says ``shape``."""
    tensor = module.InferInput("x", list(data.shape), datatype)
    if binary is None:  # gRPC
        tensor.set_data_from_numpy(data)
    else:
        tensor.set_data_from_numpy(data, binary_data=binary)
    return tensor.set_shape(shape)


def _sample(datatype: str) -> np.ndarray:
    return np.array([b"abcd"], dtype=object) if datatype == "BYTES" else np.ones(1, np.float32)


def _refusal(call: Callable[[], object]) -> tuple[str, str]:
    """(status, message) of a call that must fail: tritonclient says '400' or
    'StatusCode.INVALID_ARGUMENT'."""
    try:
        call()
    except InferenceServerException as exc:
        return str(exc.status()), exc.message()
    raise AssertionError("the request was answered")


def hostile_calls(http: th.InferenceServerClient, grpc: tg.InferenceServerClient
                  ) -> dict[str, tuple[Callable[[], object], str]]:
    """Each hostile request, as a call, and the words its refusal's message must hold."""
    calls: dict[str, tuple[Callable[[], object], str]] = {}
    # Values decoded one by one (JSON data, BYTES) are counted from the shape first.
    capped = f"more than max_request_elements = {Limits().max_request_elements}"
    for datatype in ("BYTES", "FP32"):
        data = _sample(datatype)
        need = capped if datatype == "BYTES" else "needs 17179869184"
        for binary in (False, True):
            route = "binary" if binary else "json"
            words = capped if not binary else need
            for model, shape, said in (("free", HUGE, words),
                                       ("free", MANY_DIMS, "20001 dimensions, more than 32"),
                                       ("stocks", HUGE, words)):
                tensor = _shaped(th, datatype, data, shape, binary)
                calls[f"http {route} {datatype} {model} {len(shape)} dims"] = (
                    lambda m=model, t=tensor: http.infer(m, [t]), said)
        for shape, said in ((HUGE, need), (MANY_DIMS, "20001 dimensions, more than 32"),
                            ([-1, 4194304], "negative size"),
                            ([0, 2**62, 2**62], "more than max_input_elements = 4194304")):
            tensor = _shaped(tg, datatype, data, shape, None)
            calls[f"grpc {datatype} {shape[:3]}"] = (lambda t=tensor: grpc.infer("free", [t]),
                                                     said)
    return calls


@pytest.fixture
def clients(server: RunningServer) -> Iterator[tuple[th.InferenceServerClient,
                                                    tg.InferenceServerClient]]:
    http = th.InferenceServerClient(server.url.removeprefix("http://"))
    try:
        with tg.InferenceServerClient(server.grpc_url) as grpc:
            yield http, grpc
    finally:
        http.close()


def test_huge_shapes_are_refused_while_health_is_answered(server: RunningServer,
                                                          clients) -> None:
    calls = hostile_calls(*clients)
    results: dict[str, tuple[str, str]] = {}

    def attack() -> None:
        for name, (call, _) in calls.items():
            results[name] = _refusal(call)

    attacker = threading.Thread(target=attack)
    health: list[int] = []
    with httpx.Client(base_url=server.url, timeout=60) as client:
        attacker.start()
        while True:  # at least one check, then as many as the attack leaves room for
            health.append(client.get("/v2/health/ready").status_code)
            if not attacker.is_alive():
                break
        attacker.join()
    assert health and set(health) == {200}
    assert set(results) == set(calls)
    for name, (status, message) in results.items():
        assert status in ("400", "413", "StatusCode.INVALID_ARGUMENT",
                          "StatusCode.RESOURCE_EXHAUSTED"), (name, status, message)
        assert calls[name][1] in message, (name, message)


def test_a_long_string_among_numbers_is_refused_before_numpy_pads_them(
        server: RunningServer) -> None:
    # numpy makes one fixed-width string array of them: 60,001 x 400 KB from a 0.34 MB body
    # (within max_json_bytes and max_request_elements).
    data = ["x" * 100_000] + ["y"] * 60_000
    body = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32",
                                     "shape": [1, len(data)], "data": data}]})
    response = httpx.post(f"{server.url}/v2/models/free/infer", content=body, timeout=60)
    assert response.status_code == 400, response.text
    assert "FP32 data takes only numbers, got strings" in response.json()["error"]


def _v2_graph(server: RunningServer, data: np.ndarray, datatype: str,
              binary: bool) -> httpx.Response:
    tensor = th.InferInput("x", list(data.shape), datatype)
    tensor.set_data_from_numpy(data, binary_data=binary)
    body, length = th.InferenceServerClient.generate_request_body([tensor])
    headers = {} if length is None else {"Inference-Header-Content-Length": str(length)}
    return httpx.post(f"{server.url}/v2/models/stocks/infer", content=body, headers=headers,
                      timeout=60)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize(("datatype", "data"), [
    ("BYTES", np.array([[b"0.1", b"0.2", b"0.3", b"0.4"]], dtype=object)),
    ("BOOL", np.array([[True, False, True, False]])),
])
def test_the_graph_refuses_tensors_that_are_not_numbers(server: RunningServer, datatype: str,
                                                        data: np.ndarray, binary: bool) -> None:
    response = _v2_graph(server, data, datatype, binary)
    assert response.status_code == 400, response.text
    assert f"got a {datatype} tensor" in response.json()["error"]


@pytest.mark.parametrize(("row", "words"), [
    (["0.1", "0.2", "0.3", "0.4"], "strings"),
    ([True, False, 0.3, 0.4], "booleans"),
    ([None, 0.2, 0.3, 0.4], "null"),
])
def test_the_graph_route_refuses_what_the_model_routes_refuse(
        server: RunningServer, row: list, words: str) -> None:
    graph = httpx.post(f"{server.url}/stocks/predict", json={"input": row, "ticker": "IBM"},
                       timeout=60)
    batch = httpx.post(f"{server.url}/stocks/predict", timeout=60,
                       json={"input_batch": [[0.1, 0.2, 0.3, 0.4], row],
                             "streams": ["IBM", "IBM"]})
    model = httpx.post(f"{server.url}/v2/models/vec/infer", timeout=60, json={
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": row}]})
    for response in (graph, batch, model):
        assert response.status_code == 400, response.text
        assert words in response.json()["error"], response.text


def test_the_graph_still_answers_numbers_after_the_refusals(server: RunningServer) -> None:
    with Client(server.url, timeout=60) as client:
        reply = client.predict_graph("stocks", [0.1, 0.2, 0.3, 0.4], stream="IBM",
                                     stream_key="ticker")
    assert reply["durable"] and len(reply["output"]) == 1
    ints = _v2_graph(server, np.array([[1, 2, 3, 4]], dtype=np.int32), "INT32", True)
    assert ints.status_code == 200, ints.text
