"""The baseline app: in-process route checks, then a real server driven by the load generator."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import numpy as np
import pytest

from parityserve.bench.baseline_app import create_baseline_app
from parityserve.bench.loadgen import (
    HttpSender,
    encode_bodies,
    json_sender,
    poisson_schedule,
    run_event_loop,
    run_open_loop,
)
from parityserve.bench.ports import free_port

pytestmark = pytest.mark.integration


# --- in-process ---------------------------------------------------------------------------


async def _requests(app, calls):
    # httpx's ASGI transport, not starlette.testclient: that one now warns without httpx2.
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return [await client.request(method, url, **kw) for method, url, kw in calls]


def test_routes_answer_and_reject_bad_input() -> None:
    app = create_baseline_app(lambda batch: batch.sum(axis=1))
    ok, not_json, no_input, bad, health = asyncio.run(_requests(app, [
        ("POST", "/anyapp/predict", {"content": b'{"input": [1, 2, 3.5]}'}),
        ("POST", "/a/predict", {"content": b"{nope"}),
        ("POST", "/a/predict", {"json": {"x": 1}}),
        ("POST", "/a/predict", {"json": {"input": ["a", "b"]}}),
        ("GET", "/healthz", {}),
    ]))
    assert ok.status_code == 200
    assert ok.json() == {"query_id": "0", "output": 6.5, "default": False}
    assert not_json.status_code == 400
    assert (no_input.status_code, no_input.json()["error"]) == (400, "malformed_request")
    assert (bad.status_code, bad.json()["error"]) == (400, "invalid_input")
    assert health.text == "ok"


def test_a_failing_model_is_a_500() -> None:
    def broken(batch: np.ndarray) -> np.ndarray:
        raise RuntimeError("boom")

    [resp] = asyncio.run(_requests(create_baseline_app(broken),
                                   [("POST", "/a/predict", {"json": {"input": [1.0]}})]))
    assert resp.status_code == 500 and "boom" in resp.json()["message"]


# --- real server --------------------------------------------------------------------------



def _wait_for_ready(proc: subprocess.Popen[str], timeout_s: float) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if sel.select(timeout=0.2):
                line = proc.stdout.readline()
                if line.strip() == "ready":
                    return
                if not line:  # stdout closed: the server exited
                    break
    raise AssertionError(f"baseline_app not ready (exit code {proc.poll()})")


@contextmanager
def _baseline_server(*args: str) -> Iterator[int]:
    port = free_port()
    cmd = [sys.executable, "-m", "parityserve.bench.baseline_app", *args, "--port", str(port)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env) as proc:
        try:
            _wait_for_ready(proc, timeout_s=30.0)
            yield port
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def _drive(port: int, inputs: list[np.ndarray], rate: float):
    schedule = poisson_schedule(rate, len(inputs), np.random.default_rng(0))
    async with HttpSender(f"http://127.0.0.1:{port}", limit=64) as http:
        send = json_sender(http, "/bench/predict", encode_bodies(inputs))
        return await run_open_loop(send, schedule, rate_qps=rate, timeout_s=20.0)


def _check_run(port: int, echo: bool) -> None:
    inputs = [np.random.default_rng(i).random(8, dtype=np.float32) for i in range(300)]
    result = run_event_loop(_drive(port, inputs, rate=200.0))
    summary = result.summary()
    assert result.ok.all(), summary["errors"]
    assert all(r["default"] is False for r in result.results)
    assert len({r["query_id"] for r in result.results}) == 300
    if echo:
        for r, x in zip(result.results, inputs, strict=True):
            np.testing.assert_allclose(r["output"], x)
    # Every query answered once, right: what this test proves. How fast is the benchmarks'
    # question (benchmarks/frontend_*.py), not a bound a loaded machine could break.
    assert 0 < summary["p50_ms"] <= summary["p99_ms"], summary


def test_builtin_noop_under_open_loop_load() -> None:
    with _baseline_server("--source", "builtin:noop") as port:
        _check_run(port, echo=True)


@pytest.mark.skipif(importlib.util.find_spec("parityserve.models.loader") is None,
                    reason="parityserve.models.loader not written yet")
def test_zoo_noop_through_the_model_loader() -> None:
    with _baseline_server("--source", "zoo:noop") as port:
        _check_run(port, echo=False)


def test_an_unknown_source_exits_with_an_error() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "parityserve.bench.baseline_app", "--source", "nosuch:thing",
         "--port", str(free_port())],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2 and "cannot load" in proc.stderr


# --- the low-load probe against a real server ---------------------------------------------


def test_low_load_probe_measures_answers_and_counts_refusals() -> None:
    from parityserve.bench.probe import probe

    bodies = encode_bodies([np.random.default_rng(i).random(8, dtype=np.float32)
                            for i in range(10)])
    with _baseline_server("--source", "builtin:noop") as port:
        url = f"http://127.0.0.1:{port}"
        good = probe(url, "/bench/predict", bodies, rate_qps=200.0, n=200, warm_up=10)
        bad = probe(url, "/bench/nowhere", bodies, rate_qps=200.0, n=20, warm_up=0)
    assert (good["n"], good["ok"], good["errors"]) == (200, 200, {})
    # Milliseconds, ordered. No bound: on a shared 2-core machine one stall of the whole
    # machine (469 ms seen once) says nothing about the probe.
    assert 0 < good["p50_ms"] <= good["p99_ms"], good
    assert (bad["ok"], bad["errors"]) == (0, {"HTTP 404": 20})


def test_probe_refuses_bad_arguments() -> None:
    from parityserve.bench.probe import probe
    from parityserve.errors import ConfigError

    with pytest.raises(ConfigError, match="at least one request body"):
        probe("http://127.0.0.1:1", "/x", [], rate_qps=10, n=1)
    with pytest.raises(ConfigError, match="http://host:port"):
        probe("ftp://somewhere", "/x", [b"{}"], rate_qps=10, n=1)
    with pytest.raises(ConfigError, match="rate_qps"):
        probe("http://127.0.0.1:1", "/x", [b"{}"], rate_qps=0, n=1, warm_up=0)
