"""The architecture's floor app: the bare route, one real worker process, and clean exits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest

from parityserve.bench.ports import free_port
from parityserve.bench.probe import probe

pytestmark = pytest.mark.integration



def _start(*args: str) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    cmd = [sys.executable, "-m", "parityserve.bench.floor_app", *args, "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return proc, port


@contextmanager
def _floor(source: str = "zoo:noop") -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc, port = _start("--source", source)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()  # blocks until ready, or EOF if it died
        assert line == "ready", "floor_app did not start"
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.communicate(timeout=10)  # reaps it and closes both pipes


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def test_answers_come_back_through_the_worker_and_bad_input_is_a_4xx() -> None:
    with _floor("zoo:echo") as (_, url):
        x = np.random.default_rng(0).random(8, dtype=np.float32)
        ok = httpx.post(f"{url}/any/predict", json={"input": x.tolist()})
        assert ok.status_code == 200
        np.testing.assert_allclose(ok.json()["output"], x, rtol=1e-6)  # the worker's echo
        bad = httpx.post(f"{url}/any/predict", content=b"{nope")
        assert bad.status_code == 400
        result = probe(url, "/bench/predict", [b'{"input": [1.0, 2.0]}'], rate_qps=200, n=200,
                       warm_up=10)
        assert result["errors"] == {} and result["ok"] == 200


def test_a_model_that_cannot_load_ends_the_app_with_the_reason() -> None:
    proc, _ = _start("--source", "zoo:no-such-model")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "ready" not in out
    assert "floor_app: cannot serve 'zoo:no-such-model'" in err


def test_sigterm_stops_the_app_and_its_worker() -> None:
    with _floor() as (proc, _):
        workers = _children(proc.pid)
        assert len(workers) == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) is not None
        deadline = time.monotonic() + 10
        while Path(f"/proc/{workers[0]}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        stat = Path(f"/proc/{workers[0]}/stat")
        # gone, or a zombie its (dead) parent left for init to reap
        assert not stat.exists() or stat.read_text().split(")")[1].split()[0] == "Z"
