"""Issue 40, item 2: V2 REST and gRPC ask the same serving face and get the same answers and
the same errors, for a model and for a stateful graph served as one.

Before, each edge decided graph-or-model itself, and they differed on a graph: V2 REST served
a request for version 2, or for an output the graph does not have, that gRPC refused
(NOT_FOUND, INVALID_ARGUMENT), and a tensor of shape [] was a 500 over HTTP. Each case here
is sent over both edges, in-process, against one fake system with a graph.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import numpy as np
import orjson
import pytest
from test_http_frontend import (
    AUTH,
    TOKEN,
    FakeSystem,
    TestClient,  # Starlette's, its deprecation warning silenced
)
from tritonclient.grpc import service_pb2 as pb

from parityserve.config import Limits
from parityserve.runtime.frontend import grpc_v2
from parityserve.runtime.frontend.auth import AuthPolicy
from parityserve.runtime.frontend.http import create_app
from parityserve.runtime.modelpath.metrics import Metrics
from parityserve.runtime.serving.api import ModelMetadata


class GraphSystem(FakeSystem):
    """FakeSystem's models, and a graph "stocks": each row's answer is its sum."""

    def __init__(self) -> None:
        super().__init__()
        self.graph_bodies: list[dict[str, Any]] = []

    def has_graph(self, name: str) -> bool:
        return name == "stocks"

    def graph_deadline_s(self, name: str) -> float:
        return 30.0

    async def predict_graph(self, name: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        self.graph_bodies.append(body)
        rows = body["input_batch"] if "input_batch" in body else [body["input"]]
        return [{"query_id": str(i), "graph": name, "output": [float(np.sum(r))],
                 "seqs": {"seq1": i + 1}, "durable": True} for i, r in enumerate(rows)]

    def model_metadata(self, model: str, version: int | None) -> ModelMetadata:
        if model == "stocks" and version in (None, 1):  # as the real system advertises it
            return ModelMetadata("stocks", ("1",), "parityserve-graph", (), ())
        return super().model_metadata(model, version)


class Aborted(Exception):
    pass


class Context:
    def __init__(self) -> None:
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def invocation_metadata(self) -> tuple[Any, ...]:
        return ()

    def set_trailing_metadata(self, metadata: tuple[Any, ...]) -> None:
        pass

    def time_remaining(self) -> float | None:
        return None  # the call set no deadline

    def peer(self) -> str:
        return "ipv4:127.0.0.1:50000"

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise Aborted(details)


def over_http(system: GraphSystem, target: str, version: str, tensors: dict[str, np.ndarray],
              outputs: tuple[str, ...], params: dict[str, Any]) -> tuple[int, Any]:
    client = TestClient(create_app(system, metrics=Metrics(), auth=AUTH),
                        headers={"Authorization": f"Bearer {TOKEN}"})
    body: dict[str, Any] = {
        "inputs": [{"name": n, "datatype": "FP32", "shape": list(a.shape),
                    "data": a.reshape(-1).tolist()} for n, a in tensors.items()],
        "outputs": [{"name": o} for o in outputs]}
    if params:
        body["parameters"] = params
    path = f"/v2/models/{target}" + (f"/versions/{version}" if version else "") + "/infer"
    response = client.post(path, content=orjson.dumps(body))
    return response.status_code, response.json()


def over_grpc(system: GraphSystem, target: str, version: str, tensors: dict[str, np.ndarray],
              outputs: tuple[str, ...], params: dict[str, Any]
              ) -> tuple[grpc.StatusCode, Any]:
    request = pb.ModelInferRequest(
        model_name=target, model_version=version,
        inputs=[pb.ModelInferRequest.InferInputTensor(name=n, datatype="FP32",
                                                      shape=list(a.shape))
                for n, a in tensors.items()],
        outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name=o) for o in outputs],
        raw_input_contents=[a.astype("<f4").tobytes() for a in tensors.values()])
    for key, value in params.items():  # gRPC's parameters carry no lists: JSON in a string
        request.parameters[key].string_param = orjson.dumps(value).decode()
    frontend = grpc_v2.GrpcFrontend(system, auth=AuthPolicy.open(), limits=Limits(),
                                    version="test")
    context = Context()
    try:
        response = asyncio.run(frontend.ModelInfer(request, context))
    except Aborted:
        assert context.aborted is not None
        return context.aborted
    return grpc.StatusCode.OK, response


ROWS = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)

# (case, target, version, tensors, outputs, HTTP status, gRPC code, words in the error)
REFUSED = [
    ("graph version 2", "stocks", "2", {"x": ROWS}, (), 404, grpc.StatusCode.NOT_FOUND,
     "graph 'stocks' has no version 2; serving version 1"),
    ("graph output y", "stocks", "", {"x": ROWS}, ("y",), 400,
     grpc.StatusCode.INVALID_ARGUMENT, "graph 'stocks' has no output 'y'"),
    ("graph scalar", "stocks", "", {"x": np.array(5.0, np.float32)}, (), 400,
     grpc.StatusCode.INVALID_ARGUMENT, r"send shape [1, 1] for one row"),
    ("graph flat row", "stocks", "", {"x": ROWS[0]}, (), 400,
     grpc.StatusCode.INVALID_ARGUMENT, r"send shape [1, 2] for one row"),
    ("graph two inputs", "stocks", "", {"x": ROWS, "z": ROWS}, (), 400,
     grpc.StatusCode.INVALID_ARGUMENT, "graph 'stocks' takes exactly one input tensor, got 2"),
    ("model output z", "double", "", {"x": np.ones((1, 3), np.float32)}, ("z",), 400,
     grpc.StatusCode.INVALID_ARGUMENT, "model 'double' has no output 'z'; its output is 'y'"),
    ("model version 9", "double", "9", {"x": np.ones((1, 3), np.float32)}, (), 404,
     grpc.StatusCode.NOT_FOUND, "has no version 9"),
    ("model shape", "double", "", {"x": np.ones((1, 4), np.float32)}, (), 400,
     grpc.StatusCode.INVALID_ARGUMENT, r"expected shape [-1, 3]"),
]


@pytest.mark.parametrize(("target", "version", "tensors", "outputs", "status", "code",
                          "words"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_both_edges_refuse_alike(target: str, version: str, tensors: dict[str, np.ndarray],
                                 outputs: tuple[str, ...], status: int,
                                 code: grpc.StatusCode, words: str) -> None:
    system = GraphSystem()
    got_status, body = over_http(system, target, version, tensors, outputs, {})
    assert got_status == status, body
    assert words in body["error"]
    got_code, details = over_grpc(system, target, version, tensors, outputs, {})
    assert got_code == code, details
    assert words in details
    assert system.graph_bodies == [] and system.infer_calls == []


def test_both_edges_serve_a_graphs_rows_alike() -> None:
    system = GraphSystem()
    params = {"streams": ["a", "b"], "labels": [1, 2]}
    status, body = over_http(system, "stocks", "1", {"x": ROWS}, ("output",), params)
    assert status == 200, body
    assert body["model_name"] == "stocks" and body["model_version"] == "1"
    assert body["outputs"][0]["data"] == [3.0, 7.0]
    assert body["parameters"] == {"seqs": [{"seq1": 1}, {"seq1": 2}], "durable": True}
    code, response = over_grpc(system, "stocks", "", {"x": ROWS}, ("output",), params)
    assert code == grpc.StatusCode.OK, response
    assert (response.model_name, response.model_version) == ("stocks", "1")
    np.testing.assert_array_equal(
        np.frombuffer(response.raw_output_contents[0], "<f4"), [3.0, 7.0])
    assert orjson.loads(response.parameters["seqs"].string_param) == body["parameters"]["seqs"]
    assert response.parameters["durable"].bool_param is True
    http_body, grpc_body = system.graph_bodies
    for sent in (http_body, grpc_body):
        assert [r.tolist() for r in sent["input_batch"]] == ROWS.tolist()
        assert sent["streams"] == ["a", "b"] and sent["labels"] == [1, 2]


def test_the_clipper_route_reaches_the_graph_with_its_body() -> None:
    system = GraphSystem()
    client = TestClient(create_app(system, metrics=Metrics(), auth=AUTH))
    reply = client.post("/stocks/predict", json={"input": [1.0, 2.0], "ticker": "IBM"})
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"query_id": "0", "graph": "stocks", "output": [3.0],
                            "seqs": {"seq1": 1}, "durable": True}
    assert system.graph_bodies == [{"input": [1.0, 2.0], "ticker": "IBM"}]
    batch = client.post("/stocks/predict", json={"input_batch": [[1.0], [2.0]]})
    assert [a["output"] for a in batch.json()] == [[1.0], [2.0]]
