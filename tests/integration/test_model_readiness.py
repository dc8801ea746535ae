"""One model that fails to load is not ready itself; the server and its other models are.

A real server serves ``echo`` and is asked to run ``broken``, a python: class whose
constructor raises. Once the load error shows in /admin/state, the V2 routes over HTTP and
gRPC (tritonclient, as a load balancer or a client would ask) must say: the server is ready,
``echo`` is ready and answers, ``broken`` is not ready.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
from conftest import model_state, start_server, wait_until

from parityserve.client import Client
from parityserve.runtime.server import RunningServer

pytestmark = pytest.mark.integration

MODELS = '''
class Broken:
    def __init__(self):
        raise RuntimeError("no weights in this container")

    def predict(self, batch):
        return batch
'''


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    folder = tmp_path_factory.mktemp("readiness")
    (folder / "broken_models.py").write_text(MODELS)
    # ``broken`` asks for no replica at start: a model that cannot load at start stops the
    # start (tests/e2e/test_cli.py); it is scaled up once the server serves.
    config = {"server": {"http_port": 0},
              "models": [{"name": "echo", "source": "zoo:echo", "replicas": 1},
                         {"name": "broken", "source": "python:broken_models:Broken",
                          "replicas": 0}]}
    server = start_server(config, folder)
    try:
        yield server
    finally:
        server.stop()


def test_a_model_that_fails_to_load_makes_only_itself_not_ready(served) -> None:
    url = served.url
    with Client(url) as client:
        assert client.ready()
        client.set_replicas("broken", 1)
        wait_until(lambda: model_state(client, "broken")["load_error"] is not None)
        assert "RuntimeError: no weights in this container" in model_state(
            client, "broken")["load_error"]
        assert client.ready()
    assert httpx.get(f"{url}/v2/health/ready").status_code == 200
    assert httpx.get(f"{url}/v2/models/echo/ready").status_code == 200
    assert httpx.get(f"{url}/v2/models/broken/ready").status_code == 503
    assert served.grpc_url is not None
    with tg.InferenceServerClient(served.grpc_url) as grpc:
        assert grpc.is_server_ready()
        assert grpc.is_model_ready("echo") and not grpc.is_model_ready("broken")
        x = tg.InferInput("x", [1, 3], "FP32")
        x.set_data_from_numpy(np.ones((1, 3), np.float32))
        answer = grpc.infer("echo", [x]).as_numpy("output")
    np.testing.assert_array_equal(answer, np.ones((1, 3), np.float32))
