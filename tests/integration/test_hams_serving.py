"""Stateful service graphs served for real (HAMS, issue 19): a real server, real operator
processes (primary, backup, spare), killed for real with SIGKILL or frozen with SIGSTOP.

The graph is ``feat`` (stateless, the ordinary model path) -> ``learner`` (an online MLP
fine-tuned on every labelled request, with injected non-determinism) -> ``agg`` (stateless).
Every test checks the rules that matter to a client: each request gets exactly one reply,
and no (operator, sequence number) is ever seen with two different values.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from parityserve.client import Client
from parityserve.config import parse_config
from parityserve.errors import ConfigError
from parityserve.runtime.server import RunningServer
from tests.integration.conftest import start_server, wait_until


def graph_config(mode: str = "hams", detection: str = "exit", noise: float = 1e-3,
                 state_link: str = "unix") -> dict:
    return {
        "server": {"http_port": 0, "require_admin_token": False},
        "models": [{"name": "features", "source": "zoo:echo", "replicas": 1},
                   {"name": "learner", "source": "zoo:online-mlp",
                    "options": {"noise": noise, "seed": 3}},
                   {"name": "aggregate", "source": "zoo:echo", "replicas": 1}],
        "graphs": [{"name": "online", "fault_tolerance": mode, "detection": detection,
                    "state_link": state_link,
                    "max_batch": 8, "heartbeat_timeout_ms": 300,
                    "operators": [
                        {"name": "feat", "model": "features", "inputs": ["frontend"]},
                        {"name": "learner", "model": "learner", "inputs": ["feat"],
                         "stateful": True},
                        {"name": "agg", "model": "aggregate", "inputs": ["learner"]}],
                    "output": "agg"}],
    }


class Recorder:
    """The global consistency checker's client side: every (operator, seq) -> value seen."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, int], Any] = {}
        self.conflicts: list[str] = []
        self.lock = threading.Lock()

    def record(self, reply: dict) -> None:
        with self.lock:
            key = ("learner", reply["seqs"]["learner"])
            value = reply["output"]
            if self.seen.setdefault(key, value) != value:
                self.conflicts.append(f"{key}: {self.seen[key]} then {value}")


def ask_many(url: str, count: int, recorder: Recorder, workers: int = 4,
             start: int = 0) -> list[dict]:
    rng = np.random.default_rng(start)
    images = rng.random((count, 784), dtype=np.float32)

    local = threading.local()
    clients: list[Client] = []

    def one(i: int) -> dict:
        if not hasattr(local, "client"):
            local.client = Client(url, timeout=60)
            clients.append(local.client)
        reply = local.client.predict_graph("online", images[i].tolist(), label=int(i % 10))
        recorder.record(reply)
        return reply

    try:
        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(one, range(count)))
    finally:
        for client in clients:
            client.close()


@pytest.fixture(scope="module")
def hams_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_server(graph_config(), tmp_path_factory.mktemp("hams"))
    yield server
    server.stop()


def graph_state(url: str) -> dict:
    with Client(url) as client:
        return client.state()["graphs"]["online"]


def test_every_request_gets_one_reply_carrying_its_lineage(hams_server: RunningServer) -> None:
    recorder = Recorder()
    replies = ask_many(hams_server.url, 40, recorder)
    seqs = sorted(r["seqs"]["learner"] for r in replies)
    assert seqs == sorted(set(seqs)) and len(seqs) == 40  # one number each, none shared
    assert all(r["durable"] and isinstance(r["output"], int) for r in replies)
    state = graph_state(hams_server.url)
    assert state["operators"]["learner"]["durable"] >= max(seqs)  # replies left once durable
    assert state["held_replies"] == 0 and state["waiting"] == 0


def test_killing_the_primary_under_load_loses_and_duplicates_nothing(
        hams_server: RunningServer) -> None:
    url = hams_server.url
    before = graph_state(url)["operators"]["learner"]
    recorder = Recorder()
    results: list[dict] = []
    worker = threading.Thread(target=lambda: results.extend(
        ask_many(url, 300, recorder, start=1)))
    worker.start()
    wait_until(lambda: graph_state(url)["operators"]["learner"]["last_seq"]
               > before["last_seq"] + 40, 30)
    os.kill(before["primary_pid"], signal.SIGKILL)
    worker.join(120)
    assert len(results) == 300 and not recorder.conflicts
    after = graph_state(url)
    failover = after["failovers"][-1]
    assert failover["op"] == "learner" and failover["detection"] == "exit"
    assert failover["lost_pid"] == before["primary_pid"]
    assert after["operators"]["learner"]["primary_pid"] == before["backup_pid"]  # promoted
    wait_until(lambda: graph_state(url)["operators"]["learner"]["backup_pid"] not in
               (None, before["backup_pid"]), 30)  # the spare became the backup
    assert failover["first_reply_at"] is not None


def test_killing_the_backup_lets_the_primary_go_on(hams_server: RunningServer) -> None:
    url = hams_server.url
    before = graph_state(url)["operators"]["learner"]
    os.kill(before["backup_pid"], signal.SIGKILL)
    recorder = Recorder()
    replies = ask_many(url, 60, recorder, start=2)
    assert len(replies) == 60 and not recorder.conflicts
    after = graph_state(url)["operators"]["learner"]
    assert after["primary_pid"] == before["primary_pid"]
    assert after["backup_pid"] not in (None, before["backup_pid"])


def test_a_frozen_primary_is_found_by_heartbeat_timeout(tmp_path: Path) -> None:
    """Also the CURVE-over-TCP state link (operators on different hosts)."""
    server = start_server(graph_config(detection="timeout", state_link="tcp"), tmp_path)
    try:
        before = graph_state(server.url)["operators"]["learner"]
        os.kill(before["primary_pid"], signal.SIGSTOP)  # alive, silent: no exit to see
        recorder = Recorder()
        replies = ask_many(server.url, 30, recorder, start=3)
        assert len(replies) == 30 and not recorder.conflicts
        failover = graph_state(server.url)["failovers"][-1]
        assert failover["detection"] == "timeout"
        with pytest.raises(ProcessLookupError):  # fenced: a frozen primary never comes back
            os.kill(before["primary_pid"], signal.SIGCONT)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(before["primary_pid"], signal.SIGKILL)
        server.stop()


@pytest.mark.parametrize("mode", ["remus", "bare"])
def test_the_baselines_serve_the_same_graph(tmp_path: Path, mode: str) -> None:
    server = start_server(graph_config(mode=mode), tmp_path)
    try:
        recorder = Recorder()
        replies = ask_many(server.url, 30, recorder, start=4)
        assert len(replies) == 30
        assert all(r["durable"] == (mode != "bare") for r in replies)
        assert graph_state(server.url)["mode"] == mode
    finally:
        server.stop()


def test_a_bare_graph_restarts_a_lost_primary_and_answers_everything(tmp_path: Path) -> None:
    server = start_server(graph_config(mode="bare"), tmp_path)
    try:
        url = server.url
        pid = graph_state(url)["operators"]["learner"]["primary_pid"]
        recorder = Recorder()
        results: list[dict] = []
        worker = threading.Thread(target=lambda: results.extend(
            ask_many(url, 300, recorder, start=5)))
        worker.start()
        # under load (a state, not a sleep), then killed while requests are still to come
        wait_until(lambda: len(recorder.seen) >= 20, 60)
        os.kill(pid, signal.SIGKILL)
        with recorder.lock:
            answered_at_kill = len(recorder.seen)
        worker.join(120)
        assert len(results) == 300  # answered, though the state the learner had is gone
        assert answered_at_kill < 300  # the kill landed mid-load: requests were still to come
        assert graph_state(url)["operators"]["learner"]["primary_pid"] != pid
    finally:
        server.stop()


def test_bad_graph_requests_get_clear_errors(hams_server: RunningServer) -> None:
    import httpx

    url = f"{hams_server.url}/online/predict"
    cases = [({"input": "words"}, 400), ({"input_batch": []}, 400),
             ({"input_batch": [[1.0] * 784], "labels": [1, 2]}, 400),
             ({"input": [1.0] * 784, "stream": 7}, 400),
             ({"input": [1.0] * 784, "input_batch": [[1.0] * 784]}, 400)]
    for body, status in cases:
        response = httpx.post(url, json=body, timeout=30)
        assert response.status_code == status, (body, response.text)
        assert response.json()["error"]
    # the graph still serves after the bad requests
    with Client(hams_server.url) as client:
        assert client.predict_graph("online", [0.5] * 784)["durable"]


def test_a_model_that_is_both_stateful_and_stateless_is_refused() -> None:
    config = graph_config()
    config["applications"] = [{"name": "app", "models": ["learner"]}]
    with pytest.raises(ConfigError, match="stateful graph operators and also serve"):
        RunningServer(parse_config(config))


def test_an_operator_that_cannot_load_fails_the_start_with_the_reason(tmp_path: Path) -> None:
    config = graph_config()
    config["models"][1]["source"] = "zoo:no-such-operator"
    with pytest.raises(Exception, match="no-such-operator"):
        start_server(config, tmp_path)



def test_a_batch_request_gets_one_reply_per_row_in_order(hams_server: RunningServer) -> None:
    rows = np.random.default_rng(8).random((3, 784), dtype=np.float32).tolist()
    with Client(hams_server.url) as client:
        replies = client.predict_graph_batch("online", rows, streams=["a", "b", "c"],
                                             labels=[1, 2, -1])
    assert len(replies) == 3
    seqs = [r["seqs"]["learner"] for r in replies]
    assert len(set(seqs)) == 3 and all(r["durable"] for r in replies)
