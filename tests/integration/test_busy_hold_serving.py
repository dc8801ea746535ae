"""The scheduler's busy hold on a real server: gRPC hands the event loop one RPC per pass, so
no two gRPC queries share a pass and, without the hold, every one goes to the worker alone.
Here the loop is saturated on purpose (a spinner task that never lets it wait for I/O), and
the worker's batches must grow; once the spinner stops, a lone client's queries must not wait
for company: they are answered as fast as those of a model without the hold, asked in turn.
Nothing is timed against a fixed clock: the test waits for states, each with a generous
ceiling, and compares the two models within one run.
"""

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
from conftest import wait_until
from prometheus_client.parser import text_string_to_metric_families

from parityserve.runtime.modelpath.loop_pressure import LoopPressure

pytestmark = pytest.mark.integration

# Large enough that a held lone query stands out from any load's noise, in one run against a
# twin without the hold (the hold never exceeds a tenth of the SLO: 10 s here, the V2 default).
HOLD_MS = 200.0


def _echo(name: str, hold_ms: float) -> dict:
    return {"name": name, "source": "zoo:echo", "replicas": 1,
            "batching": {"max_batch_size": 16, "busy_delay_ms": hold_ms},
            "input": {"name": "x", "datatype": "FP32", "shape": [3]},
            "output": {"name": "y", "datatype": "FP32", "shape": [3]}}


@pytest.fixture(scope="module")
def served(server_factory):
    # The cache off: every query must reach the scheduler (a hit never pumps).
    return server_factory({"server": {"http_port": 0, "cache_bytes": 0},
                           "models": [_echo("echo", HOLD_MS), _echo("plain", 0.0)]})


def _samples(served, model: str | None = None) -> dict[str, float]:
    """Every sample on /metrics by name, summed over its label sets (``model``'s alone, if
    named)."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(served.url + "/metrics").text):
        for sample in family.samples:
            if model is None or sample.labels.get("model") == model:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def _batches(served, model: str) -> tuple[float, float]:
    """(queries, batches) ``model`` has run so far, from its batch-size histogram."""
    samples = _samples(served, model)  # none before the model's first batch
    return (samples.get("parityserve_batch_size_sum", 0.0),
            samples.get("parityserve_batch_size_count", 0.0))


def _state(served) -> dict:
    """What /admin/state serves, read on the server's loop."""
    async def read() -> dict:
        return served.system.state()
    return served.call(read)


# Clients in a process of their own: threads of the test's process would hold the GIL that the
# server's loop thread (in this process too) needs, and a thread waiting for the GIL is idle.
# It says "running" once its threads are connected and ask, and asks until its stdin closes.
_CLIENTS = """
import sys, threading
import numpy as np
import tritonclient.grpc as tg
url, model, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
stop = threading.Event()
ready = threading.Barrier(threads + 1)
answered, errors = [], []
def run():
    with tg.InferenceServerClient(url) as client:
        ready.wait()
        while not stop.is_set():
            x = np.full((1, 3), len(answered), np.float32)
            inp = tg.InferInput("x", [1, 3], "FP32")
            inp.set_data_from_numpy(x)
            try:
                out = client.infer(model, [inp]).as_numpy("y")
            except Exception as exc:
                errors.append(repr(exc))
                continue
            (answered if np.array_equal(out, x) else errors).append(f"wrong: {out} for {x}")
workers = [threading.Thread(target=run) for _ in range(threads)]
for w in workers: w.start()
ready.wait()
print("running", flush=True)
sys.stdin.read()
stop.set()
for w in workers: w.join()
print(len(answered), len(errors), errors[:3], flush=True)
"""


def _spin(served, stop: threading.Event) -> threading.Event:
    """Keep the server's loop busy until ``stop`` is set: 2 ms of spinning per pass, never
    idle. The returned event is set when the spinner has stopped."""
    stopped = threading.Event()

    async def spinner() -> None:
        while not stop.is_set():
            began = time.monotonic()
            while time.monotonic() - began < 0.002:
                pass
            await asyncio.sleep(0)
        stopped.set()

    async def start() -> None:
        asyncio.get_running_loop().create_task(spinner())

    served.call(start)
    return stopped


def _mean_batch(now: tuple[float, float], then: tuple[float, float]) -> float:
    queries, batches = now[0] - then[0], now[1] - then[1]
    return queries / batches if batches else 0.0


def _saturated_and_batching(served, since: tuple[float, float]) -> bool:
    """The loop reads saturated (its verdict and the gauge on /metrics, which shows what the
    hold reads), and echo's batches since ``since`` hold two queries on average over at
    least 40: one RPC per pass gives 1.0 without the hold."""
    now = _batches(served, "echo")
    return (_state(served)["event_loop"]["saturated"]
            and _samples(served)["parityserve_event_loop_busy"] >= 0.7
            and now[0] - since[0] >= 40 and _mean_batch(now, since) >= 2.0)


def _lone_latencies(served, pairs: int) -> dict[str, list[float]]:
    """One client asks echo and plain in turn (which goes first alternates), one query at a
    time: each model's latencies, pair by pair."""
    latencies: dict[str, list[float]] = {"echo": [], "plain": []}
    with tg.InferenceServerClient(served.grpc_url) as client:
        for i in range(pairs):
            for model in ("echo", "plain") if i % 2 else ("plain", "echo"):
                inp = tg.InferInput("x", [1, 3], "FP32")
                inp.set_data_from_numpy(np.full((1, 3), i, np.float32))
                began = time.perf_counter()
                client.infer(model, [inp])
                latencies[model].append(time.perf_counter() - began)
    return latencies


def test_a_saturated_loop_batches_grpc_queries_and_an_idle_one_does_not_hold(served) -> None:
    """Guards the busy hold both ways: while the loop is saturated and gRPC queries come
    faster than the hold, echo's batches grow (one RPC per loop pass: 1.0 without it); once
    the loop is idle, a lone client's query leaves at once, as plain's (no hold) does, instead
    of waiting 200 ms for company that never comes."""
    since = _batches(served, "echo")
    # In this process the server's loop shares the GIL with grpc's own threads (and the
    # test's), and a thread waiting for the GIL reads idle: the spinner holds the loop at
    # 0.85-0.99 busy here, where a server process of its own reads 0.98-0.99 under load.
    pressure = served.system.loop_pressure
    pressure.threshold = 0.8
    stop = threading.Event()
    stopped = _spin(served, stop)
    clients = subprocess.Popen([sys.executable, "-c", _CLIENTS, served.grpc_url, "echo", "6"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert clients.stdout is not None and clients.stdout.readline() == "running\n"
        wait_until(lambda: _saturated_and_batching(served, since))
    finally:
        out, _ = clients.communicate(timeout=60)  # closes its stdin: it stops asking
        stop.set()
    answered, errors, shown = out.split(" ", 2)
    assert int(errors) == 0 and int(answered) > 0, shown
    assert stopped.wait(30)
    pressure.threshold = LoopPressure().threshold

    # The loop is idle again: a lone query to echo is answered as soon as plain's. A held one
    # would take the whole hold (no company comes), 200 ms over its twin's, pair after pair.
    latencies = _lone_latencies(served, 40)
    gaps = [e - p for e, p in zip(latencies["echo"], latencies["plain"], strict=True)]
    assert statistics.median(gaps) * 1000 < HOLD_MS / 2, latencies
    state = _state(served)
    assert not state["event_loop"]["saturated"]
    echo = next(m for m in state["models"] if m["name"] == "echo")
    assert echo["busy_hold_ms"] == 0.0
