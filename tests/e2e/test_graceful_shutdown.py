"""SIGTERM under load: every accepted query is answered, then ``parityserve start`` exits 0.

A real ``parityserve start`` serves one model whose replica blocks on a gate file (then takes
a little longer): the test knows which queries the server has accepted (its scheduler counted
them), sends SIGTERM while they wait, sees both listeners (HTTP and V2 gRPC) refuse new
connections and calls, opens the gate, and counts exactly one answer per accepted query.
Nothing here is timed: the test waits for states, each with a generous ceiling.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
from tritonclient.utils import InferenceServerException

from parityserve.bench.ports import free_port
from parityserve.bench.serverproc import ServerProcess, write_config
from parityserve.client import Client

pytestmark = pytest.mark.e2e

SHUTDOWN_LINE = "parityserve stopped; all workers shut down."

# The replica holds every batch until the gate file exists, then keeps it delay_s longer: an
# answer can only come after the test opened the gate, which it does after SIGTERM.
_GATED = """\
import os
import time


class Gated:
    def __init__(self, gate, delay_s):
        self.gate, self.delay_s = gate, delay_s

    def predict(self, batch):
        while not os.path.exists(self.gate):
            time.sleep(0.01)
        time.sleep(self.delay_s)
        return [[float(v) * 2 for v in row] for row in batch]
"""


def wait_for(condition: Callable[[], Any], what: str, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout_s:g} s")


@dataclass
class Outcomes:
    """What each client thread saw: (sent after SIGTERM?, answer or error) per request."""

    sigterm: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    seen: list[tuple[bool, str, object]] = field(default_factory=list)

    def add(self, after: bool, kind: str, value: object) -> None:
        with self.lock:
            self.seen.append((after, kind, value))


def _http_client(url: str, index: int, out: Outcomes) -> None:
    """One request before SIGTERM (the test holds SIGTERM until the server counted it), then
    new ones until the server refuses one: those were sent after SIGTERM."""
    first = True
    with httpx.Client(base_url=url, timeout=120) as http:
        for attempt in range(4):
            after = not first
            first = False
            x = [float(index), float(attempt)]
            try:
                reply = http.post("/gated/predict", json={"input": x})
            except httpx.TransportError as exc:  # refused or closed: allowed only after SIGTERM
                out.add(after, "refused", repr(exc))
                return
            body = reply.json() if reply.status_code == 200 else reply.text
            ok = reply.status_code == 200 and body["output"] == [2 * v for v in x]
            out.add(after, "answered" if ok else "wrong", (reply.status_code, body))
            out.sigterm.wait()


def _grpc_client(address: str, index: int, out: Outcomes) -> None:
    """The same over V2 gRPC, on one channel for the thread's whole life."""
    first = True
    with tg.InferenceServerClient(address) as client:
        for attempt in range(4):
            after = not first
            first = False
            x = np.array([[100.0 + index, float(attempt)]], dtype=np.float32)
            inp = tg.InferInput("input", [1, 2], "FP32")
            inp.set_data_from_numpy(x)
            try:
                result = client.infer("gated", [inp], client_timeout=120)
            except InferenceServerException as exc:
                out.add(after, "refused" if exc.status() == "StatusCode.UNAVAILABLE"
                        else "wrong", str(exc))
                return
            got = result.as_numpy(result.get_response().outputs[0].name)
            out.add(after, "answered" if np.array_equal(got, 2 * x) else "wrong", got)
            out.sigterm.wait()


def _enqueued(client: Client) -> int:
    model = next(m for m in client.state()["models"] if m["name"] == "gated")
    return int(model["queue"]["enqueued"])


def _http_refuses(url: str) -> bool:
    """A new connection is refused (one taken just before the listener closed may be closed
    unanswered instead, as its request had not been read: then ask again)."""
    try:
        httpx.get(f"{url}/v2/health/live", timeout=5)
    except httpx.ConnectError:
        return True
    except httpx.TransportError:
        return False
    return False


def _grpc_refuses(address: str) -> bool:
    """A new channel's call is refused (UNAVAILABLE) rather than served."""
    with tg.InferenceServerClient(address) as probe:
        try:
            probe.is_server_live(client_timeout=5)
        except InferenceServerException as exc:
            return exc.status() in ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED")
    return False


@pytest.mark.parametrize(("http_clients", "grpc_clients"), [(6, 4), (0, 4)],
                         ids=["http-and-grpc", "grpc-only"])
def test_sigterm_under_load_answers_every_accepted_query_then_exits_0(
        tmp_path: Path, http_clients: int, grpc_clients: int) -> None:
    """Guards the rule "every accepted query gets exactly one answer" across a shutdown: on
    SIGTERM both edges stop taking work at once, and every query already accepted (HTTP and
    gRPC alike) gets its prediction before the process exits 0. Before, gRPC kept taking calls
    while HTTP drained (http-and-grpc), and with no HTTP query to wait for it cut its own
    accepted calls 1 s after SIGTERM (grpc-only: the replica answers 1.5 s after the gate)."""
    (tmp_path / "gatedmodel.py").write_text(_GATED)
    gate = tmp_path / "gate"
    grpc_port = free_port()
    config = write_config({
        "server": {"http_port": 0, "grpc_port": grpc_port},
        "models": [{"name": "gated", "source": "python:gatedmodel:Gated", "replicas": 1,
                    "options": {"gate": str(gate), "delay_s": 1.5}, "timeout_ms": 120_000,
                    "batching": {"max_batch_size": 32}}],
        "applications": [{"name": "gated", "models": ["gated"], "slo_ms": 120_000,
                          "default_output": -1}],
    }, tmp_path / "serving.yaml")
    server = ServerProcess(config).start()
    address = f"127.0.0.1:{grpc_port}"
    out = Outcomes()
    threads = [threading.Thread(target=_http_client, args=(server.url, i, out), daemon=True)
               for i in range(http_clients)]
    threads += [threading.Thread(target=_grpc_client, args=(address, i, out), daemon=True)
                for i in range(grpc_clients)]
    try:
        with Client(server.url) as admin:
            for t in threads:
                t.start()
            # Every client's first query is accepted and waiting at the gate or in the queue.
            wait_for(lambda: _enqueued(admin) == len(threads), "all first queries accepted")
        assert out.seen == []  # none answered yet: the gate is shut
        assert server.proc is not None
        out.sigterm.set()
        server.proc.send_signal(signal.SIGTERM)
        # Both edges stop taking new work while the accepted queries are still waiting.
        wait_for(lambda: _http_refuses(server.url), "HTTP refusing new connections", 30)
        wait_for(lambda: _grpc_refuses(address), "gRPC refusing new calls", 30)
        assert server.proc.poll() is None and out.seen == []
        gate.touch()
        code = server.proc.wait(120)
        for t in threads:
            t.join(30)
    finally:
        gate.touch()
        server.stop()
    assert code == 0 and SHUTDOWN_LINE in "".join(server.output), "".join(server.output[-30:])
    before = [(kind, value) for after, kind, value in out.seen if not after]
    assert [kind for kind, _ in before] == ["answered"] * len(threads), before
    after = [(kind, value) for a, kind, value in out.seen if a]
    assert all(kind in ("answered", "refused") for kind, _ in after), after
    assert not any(t.is_alive() for t in threads)


# The SLO of the default case: room for the test to see the queries accepted and send SIGTERM
# (a few admin reads), however loaded the machine; the test waits this long for the defaults.
_DEFAULT_SLO_MS = 5000


def _default_client(url: str, index: int, out: Outcomes) -> None:
    """One query before SIGTERM, then one after: (kind, (status, body, SIGTERM sent by
    then?)), the kind 'default' for the application's default output, 'refused' when the
    connection is refused or closed unanswered."""
    with httpx.Client(base_url=url, timeout=120) as http:
        for after in (False, True):
            try:
                reply = http.post("/gated/predict", json={"input": [float(index), 0.0]})
            except httpx.TransportError as exc:
                out.add(after, "refused", repr(exc))
                return
            body = reply.json() if reply.status_code == 200 else reply.text
            default = reply.status_code == 200 and body["default"] and body["output"] == -1
            out.add(after, "default" if default else "wrong",
                    (reply.status_code, body, out.sigterm.is_set()))
            out.sigterm.wait()


def test_sigterm_answers_an_accepted_query_with_its_default_at_its_deadline(
        tmp_path: Path) -> None:
    """Guards "every accepted query gets exactly one answer" where that answer is the default:
    queries accepted before SIGTERM whose model holds them past the application's SLO get the
    default at their deadline, during the drain, exactly once each, and the server then exits
    0. The scheduler and the router must keep running while HTTP drains: stopped at SIGTERM,
    they would fail the queries at once ('error: server shutting down'), not at their
    deadline; the explanation says which, so nothing here reads a clock. The gate opens only
    once every default is in, so no answer can be the model's."""
    (tmp_path / "gatedmodel.py").write_text(_GATED)
    gate = tmp_path / "gate"
    config = write_config({
        "server": {"http_port": 0},
        "models": [{"name": "gated", "source": "python:gatedmodel:Gated", "replicas": 1,
                    "options": {"gate": str(gate), "delay_s": 0.0}}],
        "applications": [{"name": "gated", "models": ["gated"], "slo_ms": _DEFAULT_SLO_MS,
                          "default_output": -1}],
    }, tmp_path / "serving.yaml")
    server = ServerProcess(config).start()
    out = Outcomes()
    threads = [threading.Thread(target=_default_client, args=(server.url, i, out), daemon=True)
               for i in range(3)]
    try:
        with Client(server.url) as admin:
            for t in threads:
                t.start()
            wait_for(lambda: _enqueued(admin) == len(threads), "all first queries accepted")
        assert server.proc is not None
        out.sigterm.set()
        server.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: _http_refuses(server.url), "HTTP refusing new connections", 30)
        wait_for(lambda: len([s for s in out.seen if not s[0]]) == len(threads),
                 "every accepted query answered", 60 + _DEFAULT_SLO_MS / 1000)
        gate.touch()
        code = server.proc.wait(120)
        for t in threads:
            t.join(30)
    finally:
        gate.touch()
        server.stop()
    assert code == 0 and SHUTDOWN_LINE in "".join(server.output), "".join(server.output[-30:])
    before = [(kind, value) for after, kind, value in out.seen if not after]
    assert [kind for kind, _ in before] == ["default"] * len(threads), before
    for _, (_, body, sigterm_sent) in before:
        assert sigterm_sent, f"answered before SIGTERM was sent: {body}"
        assert body["default_explanation"].startswith("deadline: model 'gated'"), body
    after = [kind for a, kind, _ in out.seen if a]
    assert all(kind in ("default", "refused") for kind in after), out.seen
    assert not any(t.is_alive() for t in threads)
