"""Fixtures that start real servers with real worker processes."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from parityserve.client import Client
from parityserve.config import parse_config
from parityserve.models.digits import train_digits_classifier
from parityserve.runtime.server import RunningServer


@pytest.fixture(scope="session")
def digits_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_digits_classifier(tmp_path_factory.mktemp("digits"))


@pytest.fixture(scope="session")
def digits_data() -> tuple:
    from parityserve.models.datasets import load_digits_split

    return load_digits_split(seed=0)


def start_server(config: dict, tmp_path: Path) -> RunningServer:
    """A RunningServer for a config mapping; worker logs go to tmp_path/logs."""
    data = os.environ.get("PARITYSERVE_DATA")
    return RunningServer(parse_config(config), base_dir=tmp_path,
                         data_dir=Path(data) if data else None,
                         log_dir=tmp_path / "logs").start()


@pytest.fixture(scope="module")
def server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    started: list[RunningServer] = []

    def make(config: dict) -> RunningServer:
        server = start_server(config, tmp_path_factory.mktemp("server"))
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


def model_state(client: Client, name: str) -> dict:
    """One model's entry in the admin state."""
    return next(m for m in client.state()["models"] if m["name"] == name)


def wait_until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Poll ``condition`` (a real server changes state asynchronously) or fail."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def predict_all(url: str, app: str, xs: np.ndarray, workers: int) -> list[dict]:
    """Ask ``app`` for every row of ``xs`` from ``workers`` threads at once (each thread has its
    own client, closed at the end); the answers come back in the order of ``xs``."""
    local = threading.local()
    clients: list[Client] = []

    def one(x: np.ndarray) -> dict:
        if not hasattr(local, "client"):
            local.client = Client(url)
            clients.append(local.client)
        return local.client.predict(app, x.tolist())

    try:
        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(one, xs))
    finally:
        for c in clients:
            c.close()
