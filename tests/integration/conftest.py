"""Fixtures that start real servers with real worker processes."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import yaml

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


@contextlib.contextmanager
def cli_server(folder: Path, config: dict, env: dict[str, str] | None = None
               ) -> Iterator[tuple[str, Path]]:
    """``parityserve start`` on ``config``, as a user runs it: (its URL, its stderr file).
    It must stop cleanly on SIGTERM."""
    (folder / "s.yaml").write_text(yaml.safe_dump(config))
    err = folder / "stderr.txt"
    with err.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; from parityserve.cli import main; "
             "sys.exit(main())", "start", "-c", str(folder / "s.yaml")],
            stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
        with proc:  # closes its stdout on every path, so no unclosed pipe is left to GC
            try:
                yield _serving_url(proc, err), err
            finally:
                proc.send_signal(signal.SIGTERM)
                code = proc.wait(60)
                assert code == 0, f"server exited {code} on SIGTERM: {_tail(err)}"


def _serving_url(proc: subprocess.Popen[str], err: Path) -> str:
    assert proc.stdout is not None
    for line in proc.stdout:
        if match := re.search(r"serving on (http://\S+)", line):
            return match.group(1)
    raise AssertionError(f"server exited ({proc.wait()}) without serving: {_tail(err)}")


def _tail(path: Path, lines: int = 20) -> str:
    """The last lines a server wrote to ``path``, for a failure's message."""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


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


def metric_value(client: Client, sample: str, **labels: str) -> float:
    """One sample's value in the server's /metrics, read with prometheus_client's parser (0 if
    absent: a labelled counter has no sample before its first count). Checking that a name
    appears proves nothing, since HELP and TYPE lines name every metric on a fresh server."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for family in text_string_to_metric_families(client.metrics_text())
               for s in family.samples
               if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))
