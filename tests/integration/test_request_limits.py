"""The largest request each route takes at the shipped limits, and one value more (issue 38:
no request holds the event loop for long).

Every route is sent the most its defaults accept (``max_request_elements`` values decoded one
by one, ``max_json_bytes`` of JSON, ``max_body_bytes`` of binary numbers) while the health
route is polled on the same server: each is answered, and so is every health check. One value
more is refused with a 4xx naming the setting. How long each takes is not asserted here (a
loaded 2-core box says nothing reliable about that): ``benchmarks/diagnostics/loop_block.py``
measures it into ``benchmarks/results/loop-block/``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import orjson
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from parityserve.config import Limits, Server
from parityserve.runtime.frontend import v2
from parityserve.runtime.server import RunningServer
from tests.integration.conftest import start_server

pytestmark = pytest.mark.integration

LIMITS, MAX_BODY = Limits(), Server().max_body_bytes
CAP = LIMITS.max_request_elements
GRAPH_ROWS = 255

CONFIG = {
    "server": {"http_port": 0, "require_admin_token": False},
    # The Clipper app's queue bound is what its SLO leaves time for at the measured time per
    # query, which its one-query request of 262,142 numbers makes long: a long SLO admits
    # the 1,024-query batch whatever the order. So for noop: the V2 routes' one-row requests
    # of 262,142 values make its time per query long too, and under load (a quiet fresh-clone
    # run with three xdist workers) its default 10 s deadline left a bound of 55 queries,
    # which shed the graph route's 255-row request with nothing queued.
    "models": [{"name": "noop", "source": "zoo:noop", "replicas": 1, "timeout_ms": 600_000},
               {"name": "rows", "source": "zoo:noop", "replicas": 1, "timeout_ms": 600_000,
                "batching": {"max_batch_size": 1024}}],
    "applications": [{"name": "app", "models": ["rows"], "slo_ms": 600_000,
                      "default_output": -1}],
    "graphs": [{"name": "g", "fault_tolerance": "bare",
                "operators": [{"name": "op", "model": "noop", "inputs": ["frontend"]}],
                "output": "op"}],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(CONFIG, tmp_path_factory.mktemp("limits"))
    yield running
    running.stop()


# ---- requests of n values on each route --------------------------------------------------------
Send = Callable[[httpx.Client, Any], tuple[str, str]]  # -> (status, error message)


def _http(path: str, body: bytes, headers: dict[str, str] | None = None) -> Send:
    def send(client: httpx.Client, stub: Any) -> tuple[str, str]:
        response = client.post(path, content=body, headers=headers or {})
        error = response.json().get("error", "") if response.status_code != 200 else ""
        return str(response.status_code), error
    return send


def _grpc(request: Any) -> Send:
    def send(client: httpx.Client, stub: Any) -> tuple[str, str]:
        try:
            stub.ModelInfer(request, timeout=60)
        except grpc.RpcError as exc:
            return exc.code().name, exc.details()
        return "OK", ""
    return send


def _v2(datatype: str, n: int, *, binary: bool) -> Send:
    if binary:
        array = (np.zeros((1, n), np.float32) if datatype == "FP32"
                 else np.full((1, n), b"", dtype=object))
        body, headers = v2.encode_infer_request([("x", array)], binary=True)
        return _http("/v2/models/noop/infer", body, headers)
    data = [0] * n if datatype == "FP32" else [""] * n  # the fewest bytes per value
    return _http("/v2/models/noop/infer", orjson.dumps(
        {"inputs": [{"name": "x", "datatype": datatype, "shape": [1, n], "data": data}]}))


def _grpc_v2(datatype: str, n: int, *, raw: bool) -> Send:
    tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype=datatype, shape=[1, n])
    request = pb.ModelInferRequest(model_name="noop", inputs=[tensor])
    if raw:
        request.raw_input_contents.append(bytes(4 * n))  # n floats, or n empty strings
    elif datatype == "BYTES":
        request.inputs[0].contents.bytes_contents.extend([b""] * n)
    else:
        request.inputs[0].contents.fp32_contents.extend([0.0] * n)
    return _grpc(request)


def _graph(n: int) -> Send:
    """A body of ``n`` JSON values: itself, the input_batch list, GRAPH_ROWS rows of numbers,
    the streams list and a name per row; what that leaves over goes in a list of its own."""
    width, over = divmod(n - 3, GRAPH_ROWS)  # a row: its list, its numbers and its stream
    rows = [[0] * (width - 2) for _ in range(GRAPH_ROWS)]
    body: dict[str, Any] = {"input_batch": rows, "streams": [str(i) for i in range(GRAPH_ROWS)]}
    if over:
        body["pad"] = [0] * (over - 1)
    return _http("/g/predict", orjson.dumps(body))


def _batch(n: int) -> Send:
    """A Clipper batch of 1,024 queries, ``n`` JSON values in all (its lists included)."""
    numbers = n - 2 - 1024  # the body, the input_batch list, a list per query
    rows = [[0] * (numbers // 1024) for _ in range(1024)]
    rows[0] += [0] * (numbers % 1024)
    return _http("/app/predict", orjson.dumps({"input_batch": rows}))


def _clipper(n: int) -> Send:
    return _http("/app/predict", orjson.dumps({"input": [0] * (n - 2)}))  # a body, a list


def _v2_json(datatype: str, n: int) -> Send:
    return _v2(datatype, n - 1, binary=False)  # n - 1 elements, and the list of them


def _binary_floats(size: Callable[[int], int]) -> int:
    """The most float32 values a body of ``size(n)`` bytes holds within max_body_bytes: they
    are read in place and not counted, so the body's size is their only bound."""
    n = (MAX_BODY - 1024) // 4
    while size(n + 1) <= MAX_BODY:
        n += 1
    return n


def _v2_size(n: int) -> int:
    head = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, n],
                                     "parameters": {"binary_data_size": 4 * n}}]})
    return len(head) + 4 * n


def _grpc_size(n: int) -> int:
    tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, n])
    empty = pb.ModelInferRequest(model_name="noop", inputs=[tensor], raw_input_contents=[b""])
    varint = max(1, ((4 * n).bit_length() + 6) // 7)  # the raw field's length, in place of 0
    return empty.ByteSize() - 1 + varint + 4 * n



def _typed_floats() -> int:
    """The most typed FP32 contents within max_json_bytes: a gRPC message less its raw
    contents is parsed value by value, and packed floats take 4 bytes each."""
    n = LIMITS.max_json_bytes // 4
    while True:
        tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, n])
        tensor.contents.fp32_contents.extend([0.0] * n)
        if pb.ModelInferRequest(model_name="noop", inputs=[tensor]).ByteSize() \
                <= LIMITS.max_json_bytes:
            return n
        n -= 1


TYPED_FLOATS = _typed_floats()

# route -> (the request of n values, n at the defaults, the words of the refusal of n + 1).
# JSON values include the lists that hold them: each is a Python object to make, too.
ROUTES: dict[str, tuple[Callable[[int], Send], int, str]] = {
    "v2 json FP32": (lambda n: _v2_json("FP32", n), CAP, "max_request_elements"),
    "v2 json BYTES": (lambda n: _v2_json("BYTES", n), CAP, "max_request_elements"),
    "v2 binary BYTES": (lambda n: _v2("BYTES", n, binary=True), CAP, "max_request_elements"),
    "v2 binary FP32": (lambda n: _v2("FP32", n, binary=True), _binary_floats(_v2_size),
                       "server.max_body_bytes"),
    "clipper json": (_clipper, CAP, "max_request_elements"),
    "clipper batch": (_batch, CAP, "max_request_elements"),
    "graph json": (_graph, CAP, "max_request_elements"),
    "grpc raw BYTES": (lambda n: _grpc_v2("BYTES", n, raw=True), CAP, "max_request_elements"),
    "grpc typed FP32": (lambda n: _grpc_v2("FP32", n, raw=False), min(CAP, TYPED_FLOATS),
                        "max_request_elements" if CAP < TYPED_FLOATS else "max_json_bytes"),
    "grpc typed BYTES": (lambda n: _grpc_v2("BYTES", n, raw=False), CAP,
                         "max_request_elements"),
    "grpc raw FP32": (lambda n: _grpc_v2("FP32", n, raw=True), _binary_floats(_grpc_size),
                      "larger than max"),  # grpc's own message-size refusal
}


def _while_health_is_polled(server: RunningServer, work: Callable[[], None]) -> list[int]:
    """Run ``work`` in a thread while this one asks /v2/health/live; the health answers."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - re-raised below, in the test's thread
            failure.append(exc)

    worker = threading.Thread(target=run)
    health: list[int] = []
    with httpx.Client(base_url=server.url, timeout=60) as client:
        worker.start()
        while True:  # at least one check, then as many as the requests leave room for
            health.append(client.get("/v2/health/live").status_code)
            if not worker.is_alive():
                break
        worker.join()
    if failure:
        raise failure[0]
    return health


@pytest.fixture(scope="module")
def clients(server: RunningServer) -> Iterator[tuple[httpx.Client, Any]]:
    assert server.grpc_url is not None
    options = [("grpc.max_send_message_length", 2 * MAX_BODY),
               ("grpc.max_receive_message_length", 2 * MAX_BODY)]
    with httpx.Client(base_url=server.url, timeout=60) as client, \
            grpc.insecure_channel(server.grpc_url, options=options) as channel:
        yield client, pb_grpc.GRPCInferenceServiceStub(channel)


def test_the_largest_request_of_each_route_is_served_while_health_is_answered(
        server: RunningServer, clients: tuple[httpx.Client, Any]) -> None:
    answers: dict[str, tuple[str, str]] = {}

    def send_all() -> None:
        for route, (make, n, _) in ROUTES.items():
            answers[route] = make(n)(*clients)

    health = _while_health_is_polled(server, send_all)
    assert health and set(health) == {200}
    assert answers == {route: ("OK" if route.startswith("grpc") else "200", "")
                       for route in ROUTES}


def test_one_value_more_is_refused_naming_the_limit(
        server: RunningServer, clients: tuple[httpx.Client, Any]) -> None:
    answers: dict[str, tuple[str, str]] = {}

    def send_all() -> None:
        for route, (make, n, _) in ROUTES.items():
            answers[route] = make(n + 1)(*clients)

    health = _while_health_is_polled(server, send_all)
    assert health and set(health) == {200}
    for route, (status, message) in answers.items():
        assert status in ("400", "413", "RESOURCE_EXHAUSTED"), (route, status, message)
        assert ROUTES[route][2] in message, (route, message)


def test_json_past_max_json_bytes_is_refused_before_it_is_read(
        clients: tuple[httpx.Client, Any]) -> None:
    client, _ = clients
    padded = b'{"input": [0]}' + b" " * LIMITS.max_json_bytes  # one value, too much JSON
    head = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1],
                                     "data": [0]}]}) + b" " * LIMITS.max_json_bytes
    for path, body in (("/app/predict", padded), ("/g/predict", padded),
                       ("/v2/models/noop/infer", head)):
        response = client.post(path, content=body)
        assert response.status_code == 413, (path, response.text)
        assert "server.limits.max_json_bytes" in response.json()["error"], response.text
    # gRPC: a message whose protobuf (less raw contents) is past it is not even parsed.
    status, message = _grpc_v2("BYTES", LIMITS.max_json_bytes // 2, raw=False)(*clients)
    assert status == "RESOURCE_EXHAUSTED" and "max_json_bytes" in message, message
