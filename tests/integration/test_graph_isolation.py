"""One client never hurts another on the stateful-graph route (issue 38, items 1, 2 and 4),
against the README's ``stocks`` graph served for real: real operator processes, a real
server, concurrent clients.

A row of the wrong width once shared an operator batch with well-formed rows: ``np.stack``
raised in the stateless operator (its batch-mates failed with it) and again in the stateful
send path, after the batch was put in flight, which wedged ``seq1`` for good (every later
request 504, while readiness said 200). Now a bad row fails its own request with a 400
that names it, its batch-mates are answered, and the graph answers afterwards.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from parityserve.runtime.server import RunningServer
from tests.integration.conftest import start_server, wait_until

pytestmark = pytest.mark.integration

GOOD = [0.1, 0.2, 0.3, 0.4]
BAD = [0.1, 0.2]  # two values where the graph takes four


def stocks_config(timeout_ms: float = 20_000) -> dict[str, Any]:
    """The README's sequence service (its YAML, with a shorter client wait), without its
    ``input_shape``: no door, so every row reaches the operators."""
    return {
        "server": {"http_port": 0, "require_admin_token": False},
        "models": [
            {"name": "features", "source": "zoo:echo"},
            {"name": "lstm1", "source": "zoo:stream-lstm",
             "options": {"input_size": 4, "outputs": 4, "seed": 1}},
            {"name": "lstm2", "source": "zoo:stream-lstm",
             "options": {"input_size": 4, "outputs": 1, "seed": 2}},
            {"name": "scorer", "source": "zoo:echo"}],
        "graphs": [{"name": "stocks", "stream_key": "ticker", "fault_tolerance": "hams",
                    "timeout_ms": timeout_ms,
                    "operators": [
                        {"name": "feat", "model": "features", "inputs": ["frontend"]},
                        {"name": "seq1", "model": "lstm1", "inputs": ["feat"],
                         "stateful": True},
                        {"name": "seq2", "model": "lstm2", "inputs": ["seq1"],
                         "stateful": True},
                        {"name": "score", "model": "scorer", "inputs": ["seq2"]}],
                    "output": "score"}],
    }


def burst(url: str, rows: list[list[float]], tag: str) -> list[httpx.Response]:
    """Every row as its own request, all sent at once (a barrier releases them together),
    so that good and bad rows share operator batches."""
    gate = threading.Barrier(len(rows))

    def one(i: int) -> httpx.Response:
        body = {"input": rows[i], "ticker": f"{tag}-{i % 7}"}
        with httpx.Client(timeout=60) as client:
            gate.wait()
            return client.post(f"{url}/stocks/predict", json=body)

    with ThreadPoolExecutor(len(rows)) as pool:
        return list(pool.map(one, range(len(rows))))


def mixed(n: int = 25, every: int = 5) -> list[list[float]]:
    return [BAD if i % every == 2 else GOOD for i in range(n)]


def check_answers(rows: list[list[float]], replies: list[httpx.Response]) -> None:
    for row, reply in zip(rows, replies, strict=True):
        if row is GOOD:
            assert reply.status_code == 200, reply.text
            assert np.isfinite(reply.json()["output"]).all()
        else:  # refused alone, by the operator or at the door, saying the row's shape
            assert reply.status_code == 400, reply.text
            assert re.search(r"got shape \[1, 2\]|has shape \[2\]", reply.json()["error"]), \
                reply.text


def graph_state(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/admin/state", timeout=30).json()["graphs"]["stocks"]


def idle(url: str) -> bool:
    state = graph_state(url)
    return state["waiting"] == 0 and state["records"] == 0 and all(
        op["queued"] == 0 and op["inflight"] == 0 for op in state["operators"].values())


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[RunningServer]:
    server = start_server(stocks_config(), tmp_path)
    yield server
    server.stop()


def test_rows_of_the_wrong_width_fail_alone_and_the_graph_keeps_answering(
        fresh: RunningServer) -> None:
    url = fresh.url
    # no input_shape declared: the bad rows reach the operators' batches, round after round
    for round_ in range(4):
        rows = mixed()
        check_answers(rows, burst(url, rows, f"round{round_}"))
    # nothing stuck: every operator idle, every per-request record freed, and still serving
    wait_until(lambda: idle(url), 30)
    assert httpx.get(f"{url}/v2/models/stocks/ready").status_code == 200
    reply = httpx.post(f"{url}/stocks/predict", json={"input": GOOD, "ticker": "IBM"},
                       timeout=30)
    assert reply.status_code == 200 and reply.json()["durable"]


def expired_batches(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples
               if sample.name == "parityserve_graph_batches_expired_total"
               and sample.labels == {"graph": "stocks", "operator": "seq1"})


def test_a_mute_operator_makes_the_graph_not_ready_until_the_watchdog_heals_it(
        tmp_path: Path) -> None:
    """seq1's primary stays alive (it beats, so no failover) but its answers are lost: its
    batches would stay in flight for good. The watchdog fails them after timeout_ms and
    counts them; while work keeps coming and nothing finishes, the graph says not ready;
    once answers arrive again it is ready and answers."""
    server = start_server(stocks_config(timeout_ms=3000), tmp_path)
    url, runtime = server.url, server.system.graphs.get("stocks")  # type: ignore[union-attr]
    mute = threading.Event()
    handle = runtime.link._handler  # what the graph's link hands each operator message

    def lossy(worker_id: str, header: dict[str, Any], buffers: list[Any]) -> None:
        if mute.is_set() and worker_id.startswith("stocks/seq1/") and header["t"] == "h.out":
            return  # lost on the way: the batch is never answered
        handle(worker_id, header, buffers)

    stop = threading.Event()
    askers: list[threading.Thread] = []

    def keep_asking() -> None:
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                client.post(f"{url}/stocks/predict", json={"input": GOOD, "ticker": "IBM"})

    try:
        assert burst(url, [GOOD] * 3, "warm")[0].status_code == 200
        runtime.link._handler = lossy
        mute.set()
        askers += [threading.Thread(target=keep_asking) for _ in range(2)]
        for asker in askers:
            asker.start()
        wait_until(lambda: httpx.get(f"{url}/v2/models/stocks/ready").status_code == 503, 60)
        wait_until(lambda: graph_state(url)["stalled"] == ["seq1"], 60)
        wait_until(lambda: expired_batches(url) >= 1, 60)
        mute.clear()
        wait_until(lambda: httpx.get(f"{url}/v2/models/stocks/ready").status_code == 200, 60)
        reply = httpx.post(f"{url}/stocks/predict", json={"input": GOOD, "ticker": "IBM"},
                           timeout=30)
        assert reply.status_code == 200, reply.text
    finally:
        stop.set()
        for asker in askers:
            asker.join(60)
        server.stop()


# --- nobody chooses the graph's input shape (issue 38, attacker review) ---------------------
# The graph once learned the shape it takes from the first row it answered, and refused every
# other shape at the door from then on. The LSTM takes a [2, 2] row (4 values), so one such
# request on a fresh server made every later [4] row a 400, on every route, until a restart.
# Now the door refuses only what a graph declares (``input_shape``); without a declaration
# each row stands or falls alone.

SQUARE = [[0.1, 0.2], [0.3, 0.4]]  # four values in another shape: the LSTM answers it


def ask(url: str, row: Any, ticker: str = "x") -> httpx.Response:
    return httpx.post(f"{url}/stocks/predict", json={"input": row, "ticker": ticker},
                      timeout=60)


def ask_v2(url: str, row: Any, ticker: str = "x") -> httpx.Response:
    array = np.asarray(row, dtype=np.float32)[None]  # one row: the first axis counts rows
    tensor = {"name": "x", "datatype": "FP32", "shape": list(array.shape),
              "data": array.ravel().tolist()}
    return httpx.post(f"{url}/v2/models/stocks/infer", timeout=60,
                      json={"inputs": [tensor], "parameters": {"streams": [ticker]}})


def all_answered(replies: list[httpx.Response]) -> None:
    for reply in replies:
        assert reply.status_code == 200, reply.text


def test_one_request_cannot_choose_the_shape_of_everyone_elses_rows(
        fresh: RunningServer) -> None:
    url = fresh.url
    first = ask(url, SQUARE)  # the exact attack: the first row a fresh server answers
    assert first.status_code == 200, first.text  # the model takes it: its own business
    all_answered([ask(url, GOOD), ask_v2(url, GOOD), ask(url, GOOD, "IBM")])
    assert graph_state(url)["input_shape"] is None  # nothing declared, nothing learned


def test_a_race_of_two_shapes_locks_the_graph_to_neither(fresh: RunningServer) -> None:
    url = fresh.url
    rows = [SQUARE if i % 4 == 1 and i < 24 else GOOD for i in range(26)]  # 6 squares
    all_answered(burst(url, rows, "race"))
    # whichever shape won the race once locked out the other: both are served now
    all_answered(burst(url, [GOOD] * 5 + [SQUARE] * 3, "after"))
    # no declaration: good rows, too-short rows and other-shaped rows at once, each alone
    rows = [(GOOD, BAD, SQUARE)[i % 3] for i in range(24)]
    replies = burst(url, rows, "mixed")
    for row, reply in zip(rows, replies, strict=True):
        if row is BAD:  # refused by seq1, alone, naming its shape
            assert reply.status_code == 400, reply.text
            assert "got shape [1, 2]" in reply.json()["error"], reply.text
        else:
            assert reply.status_code == 200, reply.text
            assert np.isfinite(reply.json()["output"]).all()
    all_answered(burst(url, [GOOD] * 5, "later"))
    wait_until(lambda: idle(url), 30)


def test_a_declared_input_shape_is_the_doors_rule(tmp_path: Path) -> None:
    config = stocks_config()
    config["graphs"][0]["input_shape"] = [4]
    server = start_server(config, tmp_path)
    try:
        url = server.url
        assert graph_state(url)["input_shape"] == [4]
        for reply in (ask(url, SQUARE), ask(url, BAD), ask_v2(url, SQUARE)):
            assert reply.status_code == 400, reply.text
            error = reply.json()["error"]
            assert "graph 'stocks' takes rows of shape [4]" in error, error
            assert "seq1" not in error  # refused at the door: no operator saw it
        all_answered([ask(url, GOOD), ask_v2(url, GOOD)])
        # a 1-D V2 tensor is not one row: its first axis counts rows; a clear 400 says so
        flat = {"name": "x", "datatype": "FP32", "shape": [4], "data": GOOD}
        reply = httpx.post(f"{url}/v2/models/stocks/infer", json={"inputs": [flat]},
                           timeout=60)
        assert reply.status_code == 400, reply.text
        assert "shape [1, 4]" in reply.json()["error"], reply.text
    finally:
        server.stop()
