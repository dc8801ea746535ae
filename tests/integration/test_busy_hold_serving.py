"""The scheduler's busy hold on a real server: gRPC hands the event loop one RPC per pass, so
no two gRPC queries share a pass and, without the hold, every one goes to the worker alone.
Here the loop is saturated on purpose (a spinner task that never lets it wait for I/O), and
the worker's batches must grow; once the spinner stops, a lone client's queries must not wait
for company."""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
from prometheus_client.parser import text_string_to_metric_families

from parityserve.runtime.loop_pressure import LoopPressure

pytestmark = pytest.mark.integration

HOLD_MS = 20.0
ECHO = {"name": "echo", "source": "zoo:echo", "replicas": 1,
        "batching": {"max_batch_size": 16, "busy_delay_ms": HOLD_MS},
        "input": {"name": "x", "datatype": "FP32", "shape": [3]},
        "output": {"name": "y", "datatype": "FP32", "shape": [3]}}


@pytest.fixture(scope="module")
def served(server_factory):
    # The cache off: every query must reach the scheduler (a hit never pumps).
    return server_factory({"server": {"http_port": 0, "cache_bytes": 0}, "models": [ECHO]})


def _samples(served) -> dict[str, float]:
    """Every sample on /metrics by name, summed over its label sets."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(served.url + "/metrics").text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def _batches(served) -> tuple[float, float]:
    """(queries, batches) the model has run so far, from its batch-size histogram."""
    samples = _samples(served)  # none before the model's first batch
    return (samples.get("parityserve_batch_size_sum", 0.0),
            samples.get("parityserve_batch_size_count", 0.0))


def _state(served) -> dict:
    """What /admin/state serves, read on the server's loop."""
    async def read() -> dict:
        return served.system.state()
    return served.call(read)


# Clients in a process of their own: threads of the test's process would hold the GIL that the
# server's loop thread (in this process too) needs, and a thread waiting for the GIL is idle.
_CLIENTS = """
import sys, threading, time
import numpy as np
import tritonclient.grpc as tg
url, threads, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
answered, errors = [], []
def run():
    with tg.InferenceServerClient(url) as client:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            x = np.full((1, 3), len(answered), np.float32)
            inp = tg.InferInput("x", [1, 3], "FP32")
            inp.set_data_from_numpy(x)
            try:
                out = client.infer("echo", [inp]).as_numpy("y")
            except Exception as exc:
                errors.append(repr(exc))
                continue
            (answered if np.array_equal(out, x) else errors).append(f"wrong: {out} for {x}")
workers = [threading.Thread(target=run) for _ in range(threads)]
for w in workers: w.start()
for w in workers: w.join()
print(len([a for a in answered]), len(errors), errors[:3])
"""


def _spin(served, seconds: float) -> threading.Event:
    """Keep the server's loop busy for ``seconds``: 2 ms of spinning per pass, never idle.
    The returned event is set when the spinner has stopped."""
    stopped = threading.Event()

    async def spinner() -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            began = time.monotonic()
            while time.monotonic() - began < 0.002:
                pass
            await asyncio.sleep(0)
        stopped.set()

    async def start() -> None:
        asyncio.get_running_loop().create_task(spinner())

    served.call(start)
    return stopped


def test_a_saturated_loop_batches_grpc_queries_and_an_idle_one_does_not_hold(served) -> None:
    queries0, batches0 = _batches(served)
    # In this process the server's loop shares the GIL with grpc's own threads (and the
    # test's), and a thread waiting for the GIL reads idle: the spinner holds the loop at
    # 0.85-0.99 busy here, where a server process of its own reads 0.98-0.99 under load.
    pressure = served.system.loop_pressure
    pressure.threshold = 0.8
    stopped = _spin(served, 4.0)
    clients = subprocess.Popen([sys.executable, "-c", _CLIENTS, served.grpc_url, "6", "2.5"],
                               stdout=subprocess.PIPE, text=True)
    time.sleep(2.0)
    state = _state(served)
    gauge = _samples(served)["parityserve_event_loop_busy"]
    out, _ = clients.communicate(timeout=60)
    answered, errors, shown = out.split(" ", 2)
    assert stopped.wait(30)
    assert int(errors) == 0 and int(answered) > 0, shown
    queries, batches = _batches(served)
    mean_batch = (queries - queries0) / (batches - batches0)
    assert state["event_loop"]["saturated"], state["event_loop"]
    assert gauge >= 0.7, gauge  # /metrics shows what the hold reads (read a moment later)
    assert mean_batch > 1.5, mean_batch  # one RPC per pass: 1.0 without the hold

    pressure.threshold = LoopPressure().threshold

    # The loop is idle again: the first windows after the spinner read it so.
    latencies = []
    with tg.InferenceServerClient(served.grpc_url) as client:
        for i in range(40):
            inp = tg.InferInput("x", [1, 3], "FP32")
            inp.set_data_from_numpy(np.full((1, 3), i, np.float32))
            began = time.perf_counter()
            client.infer("echo", [inp])
            latencies.append(time.perf_counter() - began)
    assert statistics.median(latencies[20:]) * 1000 < HOLD_MS / 2, latencies
    state = _state(served)
    assert not state["event_loop"]["saturated"]
    echo = next(m for m in state["models"] if m["name"] == "echo")
    assert echo["busy_hold_ms"] == 0.0
