"""Model sources through the admin API, load-failure give-up, and readiness, on real servers.

Each test walks through a door issue #15 names (code run through a deploy, a crafted pickle,
a policy import, a link out of the model root) and checks it stays shut: a 403 and nothing
runs. Readiness is checked against real workers that are killed, hung and still loading.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import joblib
import numpy as np
import pytest
from conftest import model_state, start_server, wait_until

from parityserve.client import Client
from parityserve.errors import Forbidden, InvalidInput

pytestmark = pytest.mark.integration

_MODELS = '''
import time
from pathlib import Path

import numpy as np


class Broken:
    """Fails to load, and counts how often it was tried."""

    def __init__(self, counter):
        self.counter = Path(counter)

    def setup(self):
        with self.counter.open("a") as f:
            f.write("x")
        raise RuntimeError(f"this model never loads; see {self.counter}")

    def predict(self, batch):
        return batch


class SlowLoad:
    def __init__(self, seconds=3.0):
        self.seconds = seconds

    def setup(self):
        time.sleep(self.seconds)

    def predict(self, batch):
        return np.asarray(batch, dtype=np.float32)


class Echo:
    def predict(self, batch):
        return np.asarray(batch, dtype=np.float32)
'''


class _Touch:
    """A crafted pickle: unpickling it creates ``marker`` (standing in for any command)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def _write_onnx(path: Path) -> None:
    from onnx import TensorProto, helper, numpy_helper

    w = np.eye(3, dtype=np.float32) * 2
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "double",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        initializer=[numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())


def _folder(tmp_path_factory: pytest.TempPathFactory, name: str) -> tuple[Path, Path]:
    """A config folder (the model root) with the test models, and a folder outside it."""
    root, outside = tmp_path_factory.mktemp(name), tmp_path_factory.mktemp(name + "-outside")
    (root / "secmodels.py").write_text(_MODELS)
    return root, outside


def _serve(config: dict, root: Path) -> Iterator:
    server = start_server(config, root)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def restricted(tmp_path_factory) -> Iterator:
    """The defaults: no code sources through the API, files only from the config folder."""
    root, outside = _folder(tmp_path_factory, "restricted")
    _write_onnx(root / "double.onnx")
    joblib.dump(_Touch(outside / "pickle-ran"), root / "evil.joblib")
    _write_onnx(outside / "secret.onnx")
    (root / "escape.onnx").symlink_to(outside / "secret.onnx")
    config = {"server": {"http_port": 0},
              "models": [{"name": "noop", "source": "zoo:noop", "replicas": 1}]}
    for server in _serve(config, root):
        server.root, server.outside = root, outside
        yield server


@pytest.fixture
def client(restricted) -> Iterator[Client]:
    with Client(restricted.url) as c:
        yield c


def test_the_issue_exploit_is_refused_and_runs_nothing(restricted, client) -> None:
    marker = restricted.outside / "exploit-ran"
    with pytest.raises(Forbidden, match=r"allow_code_sources: true"):
        client.deploy({"name": "x", "source": "python:subprocess:Popen",
                       "options": {"args": ["touch", str(marker)]}, "replicas": 1})
    assert "x" not in [m["name"] for m in client.state()["models"]]
    assert not marker.exists()


def test_a_crafted_pickle_is_refused_and_never_unpickled(restricted, client) -> None:
    with pytest.raises(Forbidden, match=r"pickle"):
        client.deploy({"name": "evil", "source": f"sklearn:{restricted.root}/evil.joblib"})
    with pytest.raises(Forbidden):
        client.deploy({"name": "evil", "source": "sklearn:evil.joblib"})
    assert "evil" not in [m["name"] for m in client.state()["models"]]
    assert not (restricted.outside / "pickle-ran").exists()


def test_a_code_policy_is_refused_and_runs_nothing(restricted, client) -> None:
    marker = restricted.outside / "policy-ran"
    with pytest.raises(Forbidden, match=r"allow_code_sources: true"):
        client._call("POST", "/admin/applications", {
            "name": "pwn", "models": ["noop"], "policy": "python:subprocess:Popen",
            "policy_options": {"args": ["touch", str(marker)]}})
    assert "pwn" not in [a["name"] for a in client.state()["applications"]]
    assert not marker.exists()


def test_a_link_out_of_the_root_and_paths_outside_are_refused(restricted, client) -> None:
    sources = ["onnx:escape.onnx", f"onnx:{restricted.outside}/secret.onnx",
               f"onnx:{restricted.outside}/no-such.onnx", "onnx:../x/../../etc/passwd"]
    for source in sources:
        with pytest.raises(Forbidden, match=r"server\.model_roots") as caught:
            client.deploy({"name": "leak", "source": source})
        assert str(restricted.outside) not in str(caught.value).replace(source[5:], "")
    assert "leak" not in [m["name"] for m in client.state()["models"]]


def test_zoo_and_onnx_under_the_root_deploy(restricted, client) -> None:
    client.deploy({"name": "zoo-echo", "source": "zoo:echo", "replicas": 1})
    client.deploy({"name": "double", "source": "onnx:double.onnx", "replicas": 1})
    wait_until(lambda: httpx.get(f"{restricted.url}/v2/models/double/ready").status_code == 200)
    out = client.infer("double", np.ones((2, 3), np.float32))
    np.testing.assert_allclose(out, 2 * np.ones((2, 3)))
    wait_until(lambda: model_state(client, "zoo-echo")["replicas"][0]["state"] == "ready")


@pytest.mark.parametrize(("app", "names"), [
    ({"policy": "no-such-policy"}, ["no-such-policy", "choose one of"]),
    ({"policy": "exp3", "policy_options": {"typo": 1}}, ["typo", "valid options"]),
    ({"policy": "exp4", "policy_options": {"eta": "fast"}}, ["eta", "must be a number"]),
    ({"policy": "exp4", "policy_options": {"eta": -1}}, ["eta", "> 0"]),
])
def test_application_mistakes_are_400s_that_name_them(client, app, names) -> None:
    with pytest.raises(InvalidInput) as caught:
        client._call("POST", "/admin/applications", {"name": "oops", "models": ["noop"], **app})
    assert all(n in str(caught.value) for n in names), str(caught.value)
    assert "oops" not in [a["name"] for a in client.state()["applications"]]


@pytest.mark.parametrize(("deployment", "names"), [
    ({"source": "zoo:nope"}, ["unknown zoo model 'nope'", "noop", "resnet20"]),
    ({"source": "zoo:sleep", "options": {"slep_ms": 5}}, ["zoo:sleep", "'slep_ms'", "sleep_ms"]),
    ({"source": "zoo:sleep", "options": {"sleep_ms": -1}}, ["zoo:sleep", "sleep_ms must be >= 0"]),
    ({"source": "zoo:sleep", "options": {"sleep_ms": "slow"}}, ["zoo:sleep", "sleep_ms"]),
    ({"source": "zoo:noop", "options": {"any": 1}}, ["zoo:noop", "'any'", "takes none"]),
    ({"source": "zoo:parm-mlp", "options": {"dataset": "cifar10"}},
     ["zoo:parm-mlp", "dataset='cifar10'", "fashion-mnist"]),
    ({"source": "zoo:echo", "input": {"datatype": "FP99"}}, ["input.datatype", "'FP99'", "FP32"]),
    ({"source": "zoo:echo", "output": {"datatype": "float32"}}, ["output.datatype", "float32"]),
])
def test_deploy_mistakes_are_400s_that_name_them_before_any_201(restricted, deployment,
                                                                  names) -> None:
    name = f"oops-{uuid.uuid4().hex[:8]}"  # each case its own: a failed one deploys it
    response = httpx.post(restricted.url + "/admin/models", timeout=30,
                          json={"name": name, "replicas": 1, **deployment},
                          headers={"authorization": f"Bearer {restricted.token}"})
    assert response.status_code == 400, response.text
    assert all(n in response.json()["error"] for n in names), response.text
    with Client(restricted.url) as client:
        assert name not in [m["name"] for m in client.state()["models"]]


# ---------------------------------------------------------------- allow_code_sources: true


@pytest.fixture(scope="module")
def trusting(tmp_path_factory) -> Iterator:
    root, outside = _folder(tmp_path_factory, "trusting")
    config = {"server": {"http_port": 0, "allow_code_sources": True},
              "models": [{"name": "noop", "source": "zoo:noop", "replicas": 1},
                         {"name": "broken", "source": "python:secmodels:Broken",
                          "options": {"counter": str(outside / "tries")}, "replicas": 0}]}
    for server in _serve(config, root):
        server.root, server.outside = root, outside
        yield server


def test_with_allow_code_sources_a_python_source_deploys(trusting) -> None:
    with Client(trusting.url) as client:
        client.deploy({"name": "echo", "source": "python:secmodels:Echo", "replicas": 1})
        wait_until(lambda: httpx.get(f"{trusting.url}/v2/models/echo/ready").status_code == 200)
        np.testing.assert_allclose(client.infer("echo", np.ones((1, 2), np.float32)), 1.0)


@pytest.mark.parametrize(("policy", "names"), [
    ("python:no_such_module_xyz:Policy", ["no_such_module_xyz", "cannot import"]),
    ("python:parityserve.core.selection:NoSuchPolicy", ["NoSuchPolicy", "has no"]),
])
def test_unknown_policy_module_or_attribute_is_a_400(trusting, policy, names) -> None:
    with Client(trusting.url) as client, pytest.raises(InvalidInput) as caught:
        client._call("POST", "/admin/applications",
                     {"name": "oops", "models": ["noop"], "policy": policy})
    assert all(n in str(caught.value) for n in names), str(caught.value)


def test_a_model_that_never_loads_is_given_up_on_until_asked_again(trusting) -> None:
    tries = trusting.outside / "tries"
    with Client(trusting.url) as client:
        client.set_replicas("broken", 1)
        wait_until(lambda: model_state(client, "broken")["failed"], timeout_s=90)
        state = model_state(client, "broken")
        assert "never loads" in state["load_error"] and state["replicas"] == []
        assert "tries" in state["load_error"]  # the path's folders are scrubbed away
        assert str(trusting.outside) not in state["load_error"]
        first = len(tries.read_text())
        assert first == 5
        time.sleep(3)  # longer than the longest backoff: a relaunch would have happened
        assert len(tries.read_text()) == first
        assert client.ready()  # only the model that cannot load is not ready
        assert httpx.get(f"{trusting.url}/v2/models/broken/ready").status_code == 503
        client.set_replicas("broken", 1)  # asking again gets the full number of tries
        wait_until(lambda: len(tries.read_text()) == 2 * first, timeout_s=90)
        wait_until(lambda: model_state(client, "broken")["failed"], timeout_s=30)
        client.set_replicas("broken", 0)
        assert client.ready()


# ---------------------------------------------------------------- readiness tells the truth


@pytest.fixture(scope="module")
def beating(tmp_path_factory) -> Iterator:
    """One slow-loading model: each relaunch leaves a window of seconds with no live replica."""
    root, _ = _folder(tmp_path_factory, "beating")
    config = {"server": {"http_port": 0, "heartbeat_interval_ms": 100,
                         "heartbeat_timeout_ms": 600},
              "models": [{"name": "slow", "source": "python:secmodels:SlowLoad",
                          "options": {"seconds": 2.0}, "replicas": 1}]}
    yield from _serve(config, root)


def _ready(url: str) -> tuple[bool, bool]:
    """(/v2/health/ready, /v2/models/slow/ready), each True on 200."""
    return (httpx.get(f"{url}/v2/health/ready").status_code == 200,
            httpx.get(f"{url}/v2/models/slow/ready").status_code == 200)


def _until(url: str, wanted: tuple[bool, bool], timeout_s: float = 60) -> None:
    wait_until(lambda: _ready(url) == wanted, timeout_s)


def _pid(client: Client) -> int:
    return int(model_state(client, "slow")["replicas"][0]["pid"])


def test_not_ready_while_the_only_worker_is_killed(beating) -> None:
    with Client(beating.url) as client:
        _until(beating.url, (True, True))
        killed = _pid(client)
        os.kill(killed, signal.SIGKILL)
        _until(beating.url, (False, False), timeout_s=5)
        _until(beating.url, (True, True))  # relaunched
        assert _pid(client) != killed


def test_not_ready_while_the_only_worker_is_hung(beating) -> None:
    with Client(beating.url) as client, ThreadPoolExecutor(1) as pool:
        _until(beating.url, (True, True))
        hung = _pid(client)
        client.set_faults("slow", "0", hang_after_batches=0)
        answer = pool.submit(client.infer, "slow", np.ones((1, 2), np.float32))
        _until(beating.url, (False, False), timeout_s=5)  # heartbeats stop: not ready
        _until(beating.url, (True, True))
        assert _pid(client) != hung
        np.testing.assert_allclose(answer.result(timeout=30), 1.0)  # re-dispatched


def test_not_ready_while_still_loading(beating) -> None:
    with Client(beating.url) as client:
        client.set_replicas("slow", 0)
        _until(beating.url, (True, False))  # asked for none: the server is ready, slow is not
        client.set_replicas("slow", 1)
        assert _ready(beating.url) == (False, False)
        assert model_state(client, "slow")["replicas"][0]["state"] == "starting"
        _until(beating.url, (True, True))
