"""KServe V2 over gRPC, through ``tritonclient.grpc`` unmodified (and the generated stub for
what tritonclient never sends: typed ``contents``), against real servers and workers."""

from __future__ import annotations

import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from conftest import model_state, start_server, wait_until
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from parityserve.client import Client
from parityserve.errors import ConfigError
from parityserve.models.datasets import load_mnist
from parityserve.models.loader import load_model

pytestmark = pytest.mark.integration

ECHO = {"name": "echo", "source": "zoo:echo", "replicas": 1,
        "input": {"name": "x", "datatype": "FP32", "shape": [3]},
        "output": {"name": "y", "datatype": "FP32", "shape": [3]}}


@pytest.fixture(scope="module")
def served(server_factory):
    return server_factory({
        "server": {"http_port": 0, "limits": {"max_batch_items": 8}},
        "models": [ECHO, {"name": "idle", "source": "zoo:echo", "replicas": 0}],
    })


@pytest.fixture(scope="module")
def client(served):
    with tg.InferenceServerClient(served.grpc_url) as c:
        yield c


def _input(x: np.ndarray, name: str = "x", datatype: str = "FP32") -> tg.InferInput:
    inp = tg.InferInput(name, list(x.shape), datatype)
    inp.set_data_from_numpy(x)
    return inp


def _status(call) -> str:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value.status()  # tritonclient gives "StatusCode.NOT_FOUND"


def test_health_metadata_config_and_statistics(client) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("echo") and not client.is_model_ready("idle")
    assert not client.is_model_ready("nope")
    assert client.get_server_metadata().name == "parityserve"
    meta = client.get_model_metadata("echo")
    assert (meta.name, list(meta.versions)) == ("echo", ["1"])
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [("x", "FP32", [-1, 3])]
    config = client.get_model_config("echo").config
    assert config.name == "echo" and list(config.input[0].dims) == [3]
    client.infer("echo", [_input(np.ones((2, 3), np.float32))])
    stats = client.get_inference_statistics("echo").model_stats
    assert stats[0].name == "echo" and stats[0].execution_count >= 1


def test_both_protocols_advertise_the_rows_a_request_may_really_carry(served, client) -> None:
    """The Triton config's max_batch_size is the same over HTTP and gRPC, and true: a request
    of that many rows is served, one more is refused (it read 65536 over HTTP and 1024 over
    gRPC whatever the server's limits, here 8 rows)."""
    http = th.InferenceServerClient(served.url.removeprefix("http://"))
    try:
        over_http = http.get_model_config("echo")["max_batch_size"]
    finally:
        http.close()
    over_grpc = client.get_model_config("echo").config.max_batch_size
    assert over_http == over_grpc == 8
    most = np.ones((over_grpc, 3), np.float32)
    np.testing.assert_array_equal(client.infer("echo", [_input(most)]).as_numpy("y"), most)
    one_more = np.ones((over_grpc + 1, 3), np.float32)
    assert _status(lambda: client.infer("echo", [_input(one_more)])) == str(
        grpc.StatusCode.RESOURCE_EXHAUSTED)


def test_a_clients_deadline_drops_its_queued_rows_instead_of_computing_them(
        server_factory) -> None:
    """tritonclient's client_timeout is a gRPC deadline, and the server keeps it: six
    single-row calls given 300 ms, to a model whose every batch takes 400 ms one at a time,
    all fail, and the rows still queued at 300 ms are never computed (the
    server knew only the deployment's 5 s timeout, and computed all six for nobody)."""
    slow = server_factory({
        "server": {"http_port": 0},
        "models": [{**ECHO, "name": "slow", "timeout_ms": 5000,
                    "faults": {"all": {"delay_ms": 400}},
                    "batching": {"max_batch_size": 1, "max_delay_ms": 0}}]})
    x = np.arange(3, dtype=np.float32)[np.newaxis]
    with tg.InferenceServerClient(slow.grpc_url) as grpc_client, \
            Client(slow.url, token=slow.token, admin_url=slow.admin_url) as admin:
        grpc_client.infer("slow", [_input(x)])  # warm: the replica serves one batch

        def late(i: int) -> str:
            return _status(lambda: grpc_client.infer("slow", [_input(x + i)],
                                                     client_timeout=0.3))
        with ThreadPoolExecutor(6) as pool:
            statuses = list(pool.map(late, range(1, 7)))
        # past its deadline, or refused at once as unable to finish by it (the 400 ms a
        # batch takes is measured by then): never an answer, never another error
        assert set(statuses) <= {str(grpc.StatusCode.DEADLINE_EXCEEDED),
                                 str(grpc.StatusCode.RESOURCE_EXHAUSTED)}, statuses

        def settled() -> bool:
            state = model_state(admin, "slow")
            return state["queue"]["depth"] == 0 and all(
                r["inflight"] == 0 for r in state["replicas"])
        wait_until(settled, timeout_s=30)
        state = model_state(admin, "slow")
        computed = state["queue"]["dispatched"] - 1  # the warm-up row aside
        # the row that was sent at once may be computed, and one taken in the race with its
        # deadline; not the rest, which expire queued or are shed before queueing
        assert computed <= 2, f"{computed} of the 6 late rows were computed: {state['queue']}"
        np.testing.assert_array_equal(grpc_client.infer("slow", [_input(x)]).as_numpy("y"), x)


def test_infer_with_raw_contents_echoes_and_names_the_output(client) -> None:
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    result = client.infer("echo", [_input(x)], outputs=[tg.InferRequestedOutput("y")],
                          request_id="r-1", model_version="1")
    np.testing.assert_array_equal(result.as_numpy("y"), x)
    response = result.get_response()
    assert (response.id, response.model_version) == ("r-1", "1")


def test_async_infer_from_many_threads_loses_nothing(client) -> None:
    done, errors = [], []
    lock = threading.Lock()

    def callback(result, error) -> None:
        with lock:
            (errors if error else done).append(error or result.as_numpy("y")[0, 0])

    for i in range(40):
        client.async_infer("echo", [_input(np.full((1, 3), i, np.float32))], callback)
    deadline = threading.Event()
    for _ in range(200):
        if len(done) + len(errors) == 40:
            break
        deadline.wait(0.05)
    assert errors == [] and sorted(done) == list(range(40))


def test_typed_contents_are_accepted_and_checked(served) -> None:
    with grpc.insecure_channel(served.grpc_url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 3])
        tensor.contents.fp32_contents.extend([1.0, 2.0, 3.0])
        reply = stub.ModelInfer(pb.ModelInferRequest(model_name="echo", inputs=[tensor]))
        y = np.frombuffer(reply.raw_output_contents[0], dtype=np.float32)
        np.testing.assert_array_equal(y, [1.0, 2.0, 3.0])
        short = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 3])
        short.contents.fp32_contents.extend([1.0])
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(pb.ModelInferRequest(model_name="echo", inputs=[short]))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "needs 3 values, contents.fp32_contents has 1" in info.value.details()


@pytest.mark.parametrize(("case", "code"), [
    ("unknown model", grpc.StatusCode.NOT_FOUND),
    ("unknown version", grpc.StatusCode.NOT_FOUND),
    ("unicode digit version", grpc.StatusCode.NOT_FOUND),
    ("wrong datatype", grpc.StatusCode.INVALID_ARGUMENT),
    ("wrong shape", grpc.StatusCode.INVALID_ARGUMENT),
    ("zero rows", grpc.StatusCode.INVALID_ARGUMENT),
    ("nan", grpc.StatusCode.INVALID_ARGUMENT),
    ("two inputs", grpc.StatusCode.INVALID_ARGUMENT),
    ("unknown output", grpc.StatusCode.INVALID_ARGUMENT),
    ("too many rows", grpc.StatusCode.RESOURCE_EXHAUSTED),
    ("no replica", grpc.StatusCode.UNAVAILABLE),
])
def test_bad_inputs_get_the_right_status_code(client, case, code) -> None:
    x = np.ones((2, 3), np.float32)
    calls = {
        "unknown model": lambda: client.infer("nope", [_input(x)]),
        "unknown version": lambda: client.infer("echo", [_input(x)], model_version="9"),
        "unicode digit version": lambda: client.infer("echo", [_input(x)], model_version="²"),
        "wrong datatype": lambda: client.infer("echo", [_input(x.astype(np.float64), "x",
                                                                "FP64")]),
        "wrong shape": lambda: client.infer("echo", [_input(np.ones((2, 4), np.float32))]),
        "zero rows": lambda: client.infer("echo", [_input(np.ones((0, 3), np.float32))]),
        "nan": lambda: client.infer("echo", [_input(np.full((1, 3), np.nan, np.float32))]),
        "two inputs": lambda: client.infer("echo", [_input(x), _input(x, "z")]),
        "unknown output": lambda: client.infer("echo", [_input(x)],
                                               outputs=[tg.InferRequestedOutput("nope")]),
        "too many rows": lambda: client.infer("echo", [_input(np.ones((9, 3), np.float32))]),
        "no replica": lambda: client.infer("idle", [_input(x)]),
    }
    assert _status(calls[case]) == str(code)
    np.testing.assert_array_equal(client.infer("echo", [_input(x)]).as_numpy("y"), x)


def test_a_lying_raw_buffer_is_invalid_argument(served) -> None:
    with grpc.insecure_channel(served.grpc_url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 3])
        for raws in ([b"\0" * 8], [b"\0" * 12, b"\0" * 12]):
            with pytest.raises(grpc.RpcError) as info:
                stub.ModelInfer(pb.ModelInferRequest(model_name="echo", inputs=[tensor],
                                                     raw_input_contents=raws))
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_an_overloaded_model_answers_resource_exhausted_with_retry_after(server_factory) -> None:
    slow = {**ECHO, "batching": {"max_batch_size": 1}, "faults": {"all": {"delay_ms": 300}}}
    server = server_factory({"server": {"http_port": 0, "max_queue": 1, "cache_bytes": 0},
                             "models": [slow]})
    codes, lock = [], threading.Lock()

    def callback(result, error) -> None:
        with lock:
            codes.append(error.status() if error else "ok")

    with tg.InferenceServerClient(server.grpc_url) as c:
        for i in range(8):  # distinct inputs: equal ones would share one computation
            c.async_infer("echo", [_input(np.full((1, 3), i, np.float32))], callback)
        for _ in range(200):
            if len(codes) == 8:
                break
            threading.Event().wait(0.05)
    assert len(codes) == 8 and "ok" in codes
    assert "StatusCode.RESOURCE_EXHAUSTED" in codes, codes


def test_protected_inference_needs_the_token(server_factory) -> None:
    server = server_factory({"server": {"http_port": 0, "protect_inference": True},
                             "models": [ECHO]})
    x = np.ones((1, 3), np.float32)
    with tg.InferenceServerClient(server.grpc_url) as c:
        assert c.is_server_ready()  # health stays open
        with pytest.raises(InferenceServerException) as info:
            c.infer("echo", [_input(x)])
        assert info.value.status() == "StatusCode.UNAUTHENTICATED"
        good = c.infer("echo", [_input(x)], headers={"authorization": f"Bearer {server.token}"})
        np.testing.assert_array_equal(good.as_numpy("y"), x)


def test_grpc_port_zero_turns_it_off(server_factory) -> None:
    server = server_factory({"server": {"http_port": 0, "grpc_port": 0}})
    assert server.grpc_url is None


def test_a_taken_grpc_port_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot serve gRPC on 127.0.0.1:{port}"):
            start_server({"server": {"http_port": 0, "grpc_port": port}}, tmp_path)


def test_real_mnist_images_match_the_in_process_model(server_factory, data_dir) -> None:
    weights = str(data_dir / "weights" / "parm-mnist-base-mlp.npz")
    server = server_factory({"server": {"http_port": 0},
                             "models": [{"name": "mlp", "source": "zoo:parm-mlp",
                                         "weights": weights, "replicas": 1}]})
    images, _ = load_mnist("test", data_dir=data_dir)
    x = np.ascontiguousarray(images[:64], dtype=np.float32)
    expected = load_model("zoo:parm-mlp", weights=weights).predict(x)
    with tg.InferenceServerClient(server.grpc_url) as c:
        meta = c.get_model_metadata("mlp")
        got = c.infer("mlp", [_input(x, meta.inputs[0].name)]).as_numpy(meta.outputs[0].name)
    np.testing.assert_allclose(got, np.asarray(expected), rtol=1e-5, atol=1e-5)
