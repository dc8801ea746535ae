"""``parityserve top`` as a user runs it: the console script in a subprocess, against a real
``parityserve start`` serving a model with two replicas and a stateful graph under traffic.

What is on screen is checked against ``/metrics`` read around top's run: a rate top shows can
be no more than the queries the server counted while top ran, divided by top's interval (its
window is at least that long), and the replicas it shows are those ``/metrics`` says are up.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from parityserve.bench.ports import free_port
from parityserve.client import Client
from parityserve.errors import ParityServeError
from tests.integration.conftest import cli_server, metric_value, wait_until

pytestmark = pytest.mark.e2e

PARITYSERVE = str(Path(sys.executable).with_name("parityserve"))
TOKEN = "top-test-admin-token-0123456789abcdef"
VECTOR = {"name": "x", "datatype": "FP32", "shape": [4]}
CONFIG = {
    "server": {"http_port": 0, "grpc_port": 0, "admin_token": TOKEN},
    "models": [{"name": "echo", "source": "zoo:echo", "input": VECTOR, "replicas": 2},
               {"name": "means", "source": "zoo:stream-mean", "options": {"features": 4}}],
    "applications": [{"name": "echo-app", "models": ["echo"], "slo_ms": 5000,
                      "default_output": "D"}],
    "graphs": [{"name": "stocks", "stream_key": "ticker", "max_batch": 8,
                "fault_tolerance": "hams",
                "operators": [{"name": "mean", "model": "means", "inputs": ["frontend"],
                               "stateful": True}],
                "output": "mean"}],
}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty $PARITYSERVE_HOME, so no token file of the developer's is ever read."""
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, home: Path) -> Iterator[str]:
    env = {**os.environ, "PARITYSERVE_HOME": str(home)}
    env.pop("PARITYSERVE_ADMIN_TOKEN", None)
    with cli_server(tmp_path_factory.mktemp("top"), CONFIG, env) as (url, _):
        with Client(url, token=TOKEN) as client:
            wait_until(lambda: client.state()["graphs"]["stocks"]["operators"]["mean"]
                       ["backup_synced"], 60)
        yield url


def _top(home: Path, *args: str, token: str | None = TOKEN) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PARITYSERVE_HOME": str(home)}
    env.pop("PARITYSERVE_ADMIN_TOKEN", None)
    env.pop("COLUMNS", None)
    if token is not None:
        env["PARITYSERVE_ADMIN_TOKEN"] = token
    return subprocess.run([PARITYSERVE, "top", *args], capture_output=True, text=True,
                          timeout=60, env=env, stdin=subprocess.DEVNULL)


@contextlib.contextmanager
def _traffic(url: str) -> Iterator[None]:
    """One client asking the application and the graph in turn until the block ends."""
    stop = threading.Event()

    def loop() -> None:
        rng = np.random.default_rng(0)
        with Client(url, timeout=30) as client:
            while not stop.is_set():
                x = rng.random(4).tolist()
                with contextlib.suppress(ParityServeError):
                    client.predict("echo-app", x)
                    client.predict_graph("stocks", x, stream="s1", stream_key="ticker")

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(60)


def _row(frame: str, name: str) -> list[str]:
    line = next((ln for ln in frame.splitlines() if ln.split()[:1] == [name]), None)
    assert line is not None, f"no row for {name}:\n{frame}"
    return line.split()


def _counts(url: str) -> tuple[float, float]:
    """Queries the model's replicas took and graph requests answered, from /metrics."""
    with Client(url, token=TOKEN) as client:
        return (metric_value(client, "parityserve_queue_time_seconds_count", model="echo"),
                metric_value(client, "parityserve_requests_total", route="predict",
                             target="stocks"))


def test_once_shows_the_model_and_the_graph_as_metrics_count_them(server: str,
                                                                   home: Path) -> None:
    interval = 2.0
    with _traffic(server):
        with Client(server) as c:  # traffic has reached both before top starts
            wait_until(lambda: c.predict("echo-app", [0, 0, 0, 0]) is not None, 30)
        model_before, graph_before = _counts(server)
        result = _top(home, "--once", "--interval", str(interval), "--url", server)
        model_after, graph_after = _counts(server)
    assert result.returncode == 0, result.stderr + result.stdout
    frame = result.stdout
    # model: req/s, p50, p99, SLO, replicas, defaults/s, rebuilt/s, parallelism
    model = _row(frame, "echo")
    rate, slo, replicas = float(model[1]), float(model[4]), model[5]
    # shown with one decimal, hence the 0.05
    assert 0 < rate <= (model_after - model_before) / interval + 0.05, (frame, model_before,
                                                                       model_after)
    assert slo == 5000.0
    with Client(server, token=TOKEN) as client:
        up = metric_value(client, "parityserve_replica_up", model="echo")
    assert replicas == f"{int(up)}/2" == "2/2"
    # graph: req/s, p50, p99, durable lag, backups synced, failovers 1m
    graph = _row(frame, "stocks")
    assert 0 < float(graph[1]) <= (graph_after - graph_before) / interval + 0.05, frame
    assert graph[5:] == ["1/1", "0"], frame
    assert "Traceback" not in result.stderr


def test_once_names_an_unreachable_frontend_and_still_shows_the_others(server: str,
                                                                       home: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    result = _top(home, "--once", "--interval", "0.5", "--url", server, "--url", dead)
    assert result.returncode == 1, result.stdout + result.stderr
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith(dead))
    assert "unreachable" in line and "Connection refused" in line, result.stdout
    assert _row(result.stdout, "echo")[5] == "2/2"
    assert "Traceback" not in result.stdout + result.stderr


def test_once_says_the_admin_token_was_refused(server: str, home: Path) -> None:
    for token in ("wrong-token-0123456789abcdef-wrong", None):
        result = _top(home, "--once", "--interval", "0.5", "--url", server, token=token)
        assert result.returncode == 1, result.stdout + result.stderr
        (line,) = [ln for ln in result.stdout.splitlines() if ln.strip()]
        assert line.startswith(server) and "admin token refused" in line, result.stdout
        assert ("sent a token" if token else "sent no token") in line, result.stdout
        assert "Traceback" not in result.stdout + result.stderr


def test_help_teaches_with_examples_and_a_bad_interval_is_a_usage_error(home: Path) -> None:
    result = _top(home, "--help")
    assert result.returncode == 0, result.stderr
    for words in ("examples:", "parityserve top --url", "--once", "--interval", "q quits",
                  "PARITYSERVE_ADMIN_TOKEN"):
        assert words in result.stdout, (words, result.stdout)
    for bad in ("0", "-1", "soon"):
        result = _top(home, "--once", "--interval", bad)
        assert result.returncode == 2 and "--interval" in result.stderr, result.stderr


def _read_until(fd: int, text: bytes, timeout_s: float = 30.0) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout_s
    while text not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"{text!r} never came: {seen[-2000:]!r}"
        if select.select([fd], [], [], left)[0]:
            with contextlib.suppress(OSError):  # EIO: the child closed the terminal
                chunk = os.read(fd, 4096)
                seen += chunk
                if not chunk:
                    break
    return seen


def test_q_quits_the_live_view_and_gives_the_terminal_back(home: Path) -> None:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    before = termios.tcgetattr(slave)
    dead = f"http://127.0.0.1:{free_port()}"
    env = {**os.environ, "PARITYSERVE_HOME": str(home), "TERM": "xterm"}
    with subprocess.Popen([PARITYSERVE, "top", "--interval", "0.5", "--url", dead],
                          stdin=slave, stdout=slave, stderr=slave, env=env) as proc:
        try:
            _read_until(master, b"q quits")
            # while it runs, the terminal is in cbreak mode: no line buffering, no echo
            assert not termios.tcgetattr(slave)[3] & (termios.ICANON | termios.ECHO)
            os.write(master, b"q")
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    assert termios.tcgetattr(slave) == before
    os.close(master)
    os.close(slave)


def _inherit_sigint_ignored() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_ctrl_c_quits_when_stdin_is_not_a_terminal(home: Path) -> None:
    """Started as a non-interactive shell starts a background job (``top &`` in a script, a
    CI job): SIGINT ignored on entry. top ran on through Ctrl-C then, and this test timed
    out in a clean-clone run started that way."""
    dead = f"http://127.0.0.1:{free_port()}"
    env = {**os.environ, "PARITYSERVE_HOME": str(home)}
    with subprocess.Popen([PARITYSERVE, "top", "--interval", "0.5", "--url", dead],
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=env,
                          preexec_fn=_inherit_sigint_ignored) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        _read_until(proc.stdout.fileno(), b"Ctrl-C quits")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        assert b"Traceback" not in proc.stderr.read()


def _graph_rows(fd: int, seen: list[list[str]], until: str, timeout_s: float = 60.0) -> None:
    """Read top's frames (a pipe: one after another) until a ``stocks`` row whose failovers
    column is ``until``; every stocks row read goes to ``seen``."""
    buffer = b""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"no stocks row with failovers {until}: {seen[-5:]}"
        if not select.select([fd], [], [], left)[0]:
            continue
        chunk = os.read(fd, 65536)
        assert chunk, f"top exited; rows: {seen[-5:]}"
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.split()[:1] == [b"stocks"]:
                seen.append(line.decode().split())
                if seen[-1][-1] == until:
                    return


def test_a_killed_primary_shows_as_one_failover_in_the_last_minute(server: str,
                                                                   home: Path) -> None:
    """Last in this file: it kills the graph's primary (the graph recovers on its backup)."""
    env = {**os.environ, "PARITYSERVE_HOME": str(home), "PARITYSERVE_ADMIN_TOKEN": TOKEN}
    with subprocess.Popen([PARITYSERVE, "top", "--interval", "0.5", "--url", server],
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, env=env) as proc:
        assert proc.stdout is not None
        try:
            rows: list[list[str]] = []
            _graph_rows(proc.stdout.fileno(), rows, until="0")  # counted from a base now
            with Client(server, token=TOKEN) as client:
                pid = client.state()["graphs"]["stocks"]["operators"]["mean"]["primary_pid"]
                os.kill(pid, signal.SIGKILL)
                wait_until(lambda: len(client.state()["graphs"]["stocks"]["failovers"]) == 1)
            _graph_rows(proc.stdout.fileno(), rows, until="1")
            assert {row[-1] for row in rows} <= {"n/a", "0", "1"}, rows
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
