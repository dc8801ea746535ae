"""The run form served for real: ``zoo:stream-mean`` (``run(batch, state, event)``) as the
stateful operator of a graph, real operator processes, its primary killed with SIGKILL
in the middle of every stream.

Each reply is its stream's mean of every row sent so far, so the check is exact: a reply
after the kill that had lost the stream's sum or count would be another number. The
helpers (streams of 4-wide rows, one client thread per stream) are the sequence tests'.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from parityserve.client import Client
from parityserve.runtime.server import RunningServer
from tests.integration.conftest import start_server, wait_until
from tests.integration.test_hams_sequences import (
    STEPS,
    STREAMS,
    graph_state,
    kill,
    send_streams,
    series,
)


def config(mode: str = "hams") -> dict:
    return {
        "server": {"http_port": 0, "require_admin_token": False},
        "models": [{"name": "means", "source": "zoo:stream-mean", "options": {"features": 4}}],
        "graphs": [{"name": "stocks", "stream_key": "ticker", "max_batch": 8,
                    "fault_tolerance": mode, "checkpoint_every": 10,
                    "operators": [{"name": "mean", "model": "means", "inputs": ["frontend"],
                                   "stateful": True}],
                    "output": "mean"}],
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(config(), tmp_path_factory.mktemp("run-form"))
    yield running
    running.stop()


def check_running_means(replies: dict[str, list[dict]], data: dict[str, np.ndarray]) -> None:
    for stream in STREAMS:
        got = np.array([np.ravel(r["output"]) for r in replies[stream]])
        expected = np.cumsum(data[stream], 0, dtype=np.float64) \
            / np.arange(1, STEPS + 1)[:, None]
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6,
                                   err_msg=f"stream {stream} lost its running mean")
    seqs = [r["seqs"]["mean"] for rs in replies.values() for r in rs]
    assert len(seqs) == len(set(seqs)) == STEPS * len(STREAMS)  # one number per request


def test_killing_the_primary_keeps_every_streams_running_mean(server: RunningServer) -> None:
    url, data = server.url, series(5)
    before = graph_state(url)["operators"]["mean"]
    replies = send_streams(url, data, {STEPS // 2: lambda: kill(before["primary_pid"])})
    check_running_means(replies, data)
    state = graph_state(url)
    failover = state["failovers"][-1]
    assert failover["op"] == "mean" and failover["lost_pid"] == before["primary_pid"]
    assert state["operators"]["mean"]["primary_pid"] == before["backup_pid"]  # promoted
    wait_until(lambda: graph_state(url)["operators"]["mean"]["backup_pid"] not in
               (None, before["backup_pid"]), 60)  # a new backup, seeded with the state


def test_a_bad_row_fails_alone_and_its_stream_goes_on(tmp_path: Path) -> None:
    """The run form raises before its event.wait(): the batch fails, the primary lives. The
    graph declares no input_shape, so the row reaches the operator, before and after rows
    of 4 were answered (a door learned from them once let one client choose the shape)."""
    running = start_server(config(), tmp_path)
    try:
        url = running.url
        pid = graph_state(url)["operators"]["mean"]["primary_pid"]
        bad = {"input": [1.0, 2.0], "ticker": "bad"}  # width 2, not 4
        response = httpx.post(f"{url}/stocks/predict", timeout=30, json=bad)
        assert response.status_code == 400, response.text
        assert "mean" in response.json()["error"]
        with Client(url) as client:
            first = client.predict_graph("stocks", [2.0] * 4, stream="bad", stream_key="ticker")
            response = httpx.post(f"{url}/stocks/predict", timeout=30, json=bad)
            assert response.status_code == 400 and "mean" in response.json()["error"]
            second = client.predict_graph("stocks", [4.0] * 4, stream="bad", stream_key="ticker")
        assert np.ravel(first["output"]).tolist() == [2.0] * 4  # the bad rows were not counted
        assert np.ravel(second["output"]).tolist() == [3.0] * 4
        assert graph_state(url)["operators"]["mean"]["primary_pid"] == pid
    finally:
        running.stop()


@pytest.mark.parametrize("mode", ["remus", "bare", "checkpoint-replay"])
def test_the_other_modes_drive_the_run_form_too(tmp_path: Path, mode: str) -> None:
    running = start_server(config(mode), tmp_path)
    try:
        data = series(6)
        check_running_means(send_streams(running.url, data), data)
        assert graph_state(running.url)["mode"] == mode
    finally:
        running.stop()


def test_a_graph_described_in_python(tmp_path: Path) -> None:
    """The same kind of graph built from the public config objects instead of YAML, started
    with ``start_in_thread`` and asked through the Python client."""
    from parityserve import (
        Deployment,
        Graph,
        GraphOperator,
        Server,
        ServingConfig,
        start_in_thread,
    )

    config = ServingConfig(
        server=Server(http_port=0, require_admin_token=False),
        models=[Deployment(name="means", source="zoo:stream-mean", options={"features": 2})],
        graphs=[Graph(name="sensors", stream_key="sensor", output="mean", operators=[
            GraphOperator(name="mean", model="means", inputs=["frontend"], stateful=True)])])
    with start_in_thread(config, base_dir=tmp_path, log_dir=tmp_path / "logs") as server, \
            Client(server.url) as client:
        first = client.predict_graph("sensors", [1.0, 3.0], stream="a", stream_key="sensor")
        second = client.predict_graph("sensors", [3.0, 5.0], stream="a", stream_key="sensor")
        other = client.predict_graph("sensors", [9.0, 9.0], stream="b", stream_key="sensor")
    assert np.ravel(first["output"]).tolist() == [1.0, 3.0]
    assert np.ravel(second["output"]).tolist() == [2.0, 4.0]  # the running mean of stream a
    assert np.ravel(other["output"]).tolist() == [9.0, 9.0] and second["durable"]
