"""server.frontends: 2 through `parityserve start`: two real shard processes on one port."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
from conftest import cli_server, wait_until
from pydantic import ValidationError

from parityserve.bench.ports import free_port
from parityserve.config import Server
from parityserve.runtime.cluster.shards import cores_warning

INFER = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
# Exp3 over two models that disagree on every input: noop answers class 0, echo answers its
# input, [1, 2], so class 1. With label 0 and feedback that names no query (so no selection
# to correct for), each feedback is one Hedge step of eta against echo alone.
BANDIT = {"name": "bandit", "models": ["noop", "echo"], "slo_ms": 3000, "default_output": -1,
          "policy": "exp3", "policy_options": {"eta": 0.1, "min_weight": 1e-12}}


@pytest.fixture(scope="module")
def grpc_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory, grpc_port: int
            ) -> Iterator[tuple[str, Path]]:
    config = {"server": {"http_port": 0, "grpc_port": grpc_port, "require_admin_token": False,
                         "frontends": 2},
              "models": [{"name": "noop", "source": "zoo:noop", "replicas": 1},
                         {"name": "echo", "source": "zoo:echo", "replicas": 1},
                         # gRPC's alone, so that its batch counts are the gRPC test's
                         {"name": "grpc-noop", "source": "zoo:noop", "replicas": 1}],
              "applications": [BANDIT]}
    with cli_server(tmp_path_factory.mktemp("shards"), config) as (url, err):
        yield url, err



@pytest.fixture(scope="module")
def sharded_admin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Two shards with the admin API on a listener of its own, behind a token."""
    admin_port = free_port()
    config = {"server": {"http_port": 0, "frontends": 2, "admin_host": "127.0.0.1",
                         "admin_port": admin_port},
              "models": [{"name": "noop", "source": "zoo:noop", "replicas": 1}]}
    env = {**os.environ, "PARITYSERVE_ADMIN_TOKEN": TOKEN}
    with cli_server(tmp_path_factory.mktemp("shards-admin"), config, env):
        yield f"http://127.0.0.1:{admin_port}"


TOKEN = "shards-test-token-0123456789abcdef"


def _shard(url: str, path: str = "/admin/state") -> tuple[str, str, httpx.Response]:
    resp = httpx.get(url + path, timeout=10)  # a new connection each time: any shard may take it
    index, pid = resp.headers["x-parityserve-shard"].split(":")
    return index, pid, resp


def _each_shard(url: str, path: str = "/admin/state") -> dict[str, httpx.Response]:
    seen: dict[str, httpx.Response] = {}
    for _ in range(200):
        index, _pid, resp = _shard(url, path)
        seen[index] = resp
        if len(seen) == 2:
            return seen
    raise AssertionError(f"only shards {sorted(seen)} answered")


def test_both_shards_answer_inference_on_one_port(sharded: tuple[str, Path]) -> None:
    url, _ = sharded
    pids = set()
    for _ in range(200):
        resp = httpx.post(url + "/v2/models/noop/infer", json=INFER, timeout=10)
        assert resp.status_code == 200
        pids.add(resp.headers["x-parityserve-shard"])
        if len(pids) == 2:
            break
    assert len(pids) == 2


def test_admin_change_on_one_shard_is_seen_by_the_other(sharded: tuple[str, Path]) -> None:
    url, _ = sharded
    resp = httpx.post(url + "/admin/models/noop/parallelism", json={"parallelism": 1}, timeout=60)
    assert resp.status_code == 200 and resp.headers["x-parityserve-fanout"] == "all"
    for index, state in _each_shard(url).items():
        assert state.json()["models"][0]["parallelism"] == 1, f"shard {index}"


def test_admin_state_reports_every_shard_in_one_answer(sharded: tuple[str, Path]) -> None:
    url, _ = sharded
    index, _pid, resp = _shard(url)
    state = resp.json()
    assert sorted(state["shards"]) == ["0", "1"]
    # the top level is the answering shard's, as from one server; each shard's is its own
    assert {k: v for k, v in state.items() if k != "shards"} == state["shards"][index]
    assert state["shards"]["0"]["rpc_address"] != state["shards"]["1"]["rpc_address"]
    for shard in state["shards"].values():
        assert [m["name"] for m in shard["models"]] == ["noop", "echo", "grpc-noop"]


def test_a_client_header_cannot_keep_an_admin_change_on_one_shard(
        sharded: tuple[str, Path]) -> None:
    """Only the loopback control port answers for one shard alone; on the public port a
    request that claims to come from a peer is fanned out like any other."""
    url, _ = sharded
    resp = httpx.post(url + "/admin/models/noop/parallelism", json={"parallelism": 1},
                      headers={"x-parityserve-local": "1"}, timeout=60)
    assert resp.status_code == 200 and resp.headers["x-parityserve-fanout"] == "all"


def test_admin_on_its_own_listener_fans_out_behind_the_token(sharded_admin: str) -> None:
    url = sharded_admin
    change = {"parallelism": 1}
    stranger = httpx.post(url + "/admin/models/noop/parallelism", json=change, timeout=60)
    assert stranger.status_code == 401 and "x-parityserve-fanout" not in stranger.headers
    assert httpx.get(url + "/admin/state", timeout=10).status_code == 401
    auth = {"authorization": f"Bearer {TOKEN}"}
    resp = httpx.post(url + "/admin/models/noop/parallelism", json=change, headers=auth,
                      timeout=60)
    assert resp.status_code == 200 and resp.headers["x-parityserve-fanout"] == "all"
    seen: dict[str, int] = {}
    for _ in range(200):  # a new connection each time: either shard may take it
        state = httpx.get(url + "/admin/state", headers=auth, timeout=10)
        seen[state.headers["x-parityserve-shard"].split(":")[0]] = (
            state.json()["models"][0]["parallelism"])
        if len(seen) == 2:
            break
    assert seen == {"0": 1, "1": 1}
    shards = state.json()["shards"]  # and in one answer, gathered behind the token
    assert {i: shards[i]["models"][0]["parallelism"] for i in shards} == {"0": 1, "1": 1}


def test_bad_admin_change_is_not_fanned_out(sharded: tuple[str, Path]) -> None:
    url, _ = sharded
    resp = httpx.post(url + "/admin/models/noop/parallelism", json={"parallelism": 0})
    assert resp.status_code == 400 and "x-parityserve-fanout" not in resp.headers


def test_metrics_aggregate_every_shard_with_a_label(sharded: tuple[str, Path]) -> None:
    url, _ = sharded
    text = httpx.get(url + "/metrics", timeout=10).text
    for shard in ("0", "1"):
        assert re.search(rf'parityserve_requests_total{{[^}}]*shard="{shard}"', text)
        assert f'parityserve_frontend_shard_up{{shard="{shard}"}} 1.0' in text


def test_selection_state_is_one_for_all_shards(sharded: tuple[str, Path]) -> None:
    """Feedback over fresh connections lands on both shards, and every answer's weights
    count all the feedback so far, whichever shard took it: one state, not one per shard."""
    url, _ = sharded
    by_shard: Counter[str] = Counter()
    for n in range(1, 201):
        resp = httpx.post(url + "/bandit/update", timeout=30,
                          json={"uid": "shared", "input": [1.0, 2.0], "label": 0})
        assert resp.status_code == 200, resp.text
        by_shard[resp.headers["x-parityserve-shard"].split(":")[0]] += 1
        echo_share = 1 / (1 + np.exp(0.1 * n))  # log-weights 0 (noop) and -0.1 n (echo)
        assert resp.json()["weights"]["echo"] == pytest.approx(echo_share), (n, by_shard)
        if n >= 20 and len(by_shard) == 2:
            break
    assert len(by_shard) == 2, by_shard


def test_grpc_on_the_shared_port_answers_from_both_shards(sharded: tuple[str, Path],
                                                          grpc_port: int) -> None:
    url, _ = sharded
    calls = 40
    for i in range(calls):  # a fresh client, so a fresh connection, each time
        with tg.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
            inp = tg.InferInput("x", [1, 2], "FP32")
            inp.set_data_from_numpy(np.full((1, 2), i, np.float32))  # no two alike: no cache hit
            assert client.infer("grpc-noop", [inp]).as_numpy("output").shape == (1,)
    served: dict[str, int] = {}

    def counted() -> bool:  # the workers' heartbeats report their batches every 0.2 s
        served.update(_served(url, "grpc-noop"))
        return sum(served.values()) == calls
    wait_until(counted, timeout_s=30)
    assert len(served) == 2 and all(served.values()), served


def _served(url: str, model: str) -> dict[str, int]:
    """Batches ``model``'s workers served, per shard."""
    served = {}
    for index, state in httpx.get(url + "/admin/state", timeout=10).json()["shards"].items():
        entry = next(m for m in state["models"] if m["name"] == model)
        served[index] = sum(r["served"] for r in entry["replicas"])
    return served


def test_killed_shard_is_restarted_and_nothing_is_answered_twice(
        sharded: tuple[str, Path]) -> None:
    url, err = sharded
    index, pid, _ = _shard(url)
    restarts = _restarts(url, index)
    outcomes: list[str] = []
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(timeout=10) as client:
            while not stop.is_set():
                try:
                    resp = client.post(url + "/v2/models/noop/infer", json=INFER)
                    outcomes.append(str(resp.status_code))
                except httpx.TransportError:
                    outcomes.append("connection error")

    loader = threading.Thread(target=load)
    loader.start()
    time.sleep(0.5)
    os.kill(int(pid), signal.SIGKILL)
    try:
        ready = _survivor(url, "/v2/health/ready")
        assert ready.status_code == 503 and ready.json()["code"] == "shards_not_ready"
        state = _survivor(url, "/admin/state")
        assert state.status_code == 200  # the dead shard is an entry, not a 500
        assert "did not answer" in state.json()["shards"][index]["error"]
        _wait_for_new_pid(url, index, pid)
    finally:
        stop.set()
        loader.join(30)
    # one outcome per request sent: an answer (200) or a connection error, nothing else
    assert set(outcomes) <= {"200", "connection error"}, set(outcomes)
    assert outcomes[-1] == "200" and outcomes.count("200") > 10
    assert _restarts(url, index) == restarts + 1
    _until_ready(url)
    assert f"frontend shard {index} (pid {pid}) died (signal SIGKILL)" in err.read_text()


def _restarts(url: str, index: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    match = re.search(rf'parityserve_frontend_restarts_total{{shard="{index}"}} (\S+)', text)
    assert match, text
    return float(match.group(1))


def test_a_restarted_shard_replays_admin_changes_before_it_takes_queries(
        sharded: tuple[str, Path]) -> None:
    """The first request the restarted shard answers already sees a model deployed before
    the kill: the journal is replayed before the shard listens on the public port."""
    url, _ = sharded
    deployed = httpx.post(url + "/admin/models", timeout=120,
                          json={"name": "late", "source": "zoo:noop", "replicas": 1})
    assert deployed.status_code == 201 and deployed.headers["x-parityserve-fanout"] == "all"
    index, pid, _ = _shard(url)
    os.kill(int(pid), signal.SIGKILL)
    first = _first_from_restarted(url, "/v2/models/late/infer", index, pid)
    assert first.status_code == 200, first.text
    _until_ready(url)


def _survivor(url: str, path: str) -> httpx.Response:
    """GET ``path`` as the survivor answers it: connections still queued on the killed shard's
    socket are reset by the kernel, so those tries are made again."""
    for _ in range(50):
        try:
            return httpx.get(url + path, timeout=10)
        except httpx.TransportError:
            continue
    raise AssertionError(f"no shard answered {path} after the kill")


def _wait_for_new_pid(url: str, index: str, old_pid: str) -> None:
    _first_from_restarted(url, "/admin/state", index, old_pid)


def _first_from_restarted(url: str, path: str, index: str, old_pid: str) -> httpx.Response:
    """The first answer from shard ``index``'s new process to ``path`` (POST ``INFER`` to an
    infer route, else GET), over fresh connections; the survivor's answers must be 200."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            resp = (httpx.post(url + path, json=INFER, timeout=10) if path.endswith("/infer")
                    else httpx.get(url + path, timeout=10))
        except httpx.TransportError:  # queued on the killed shard's socket: reset
            continue
        seen_index, seen_pid = resp.headers["x-parityserve-shard"].split(":")
        if seen_index == index and seen_pid != old_pid:
            return resp
        assert resp.status_code == 200, resp.text
        time.sleep(0.05)
    raise AssertionError(f"shard {index} did not come back")


def _until_ready(url: str) -> None:
    deadline = time.monotonic() + 120
    while httpx.get(url + "/v2/health/ready", timeout=10).status_code != 200:
        assert time.monotonic() < deadline, "not ready again after the restart"
        time.sleep(0.05)


def test_zero_frontends_is_refused_with_a_clear_error() -> None:
    with pytest.raises(ValidationError, match="frontends"):
        Server(frontends=0)


def test_shards_need_their_own_worker_ports() -> None:
    with pytest.raises(ValidationError, match="needs rpc_port: 0"):
        Server(frontends=2, rpc_port=5555)


def test_more_frontends_than_cores_warns() -> None:
    assert cores_warning(4, 2) is not None and "more than this host's 2 cores" in str(
        cores_warning(4, 2))
    assert cores_warning(2, 2) is None
