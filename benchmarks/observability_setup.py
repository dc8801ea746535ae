"""The one server that shows every row of the dashboard, and the frontend refusals it
counts: shared by ``benchmarks.observability_run`` (a timed run, drawn) and
``tests/integration/test_observability.py`` (every panel and rule must return data), so the
two never drift apart.

The server: a ParM model (2 replicas, k=2; its answers rebuilt when a replica is slow), a
slow model behind a 50 ms SLO with a queue of two (defaults and shed queries), a model under
the SERF controller, and a one-operator stateful graph under HAMS (a failover when its
primary is killed).
"""

from __future__ import annotations

import contextlib
import json
import socket
from pathlib import Path
from typing import Any

import httpx

__all__ = ["VECTOR", "observed_config", "provoke_frontend_refusals"]

VECTOR = {"name": "x", "datatype": "FP32", "shape": [4]}


def observed_config(folder: Path, server: dict[str, Any], *, source: str,
                    sick_faults: dict[str, Any] | None = None, serf_period_s: float = 0.5,
                    serf_window_s: float = 5.0) -> dict[str, Any]:
    """The serving config, with the SERF profile ``ctl`` reads written to ``folder``.
    ``server``: the ``server`` section's own keys (token, timeouts); ``source``: where the
    stated expected accuracy of rebuilt answers comes from; ``sick_faults``: the ParM
    model's faults from the start (the run slows it on its timeline instead)."""
    profile = {"schema": "parityserve.profile/1", "model": "ctl", "cores": 2,
               "oversubscribe": False, "elapsed_s": 1.0, "measurements": [],
               "profiles": {"1": [50.0, 45.0], "2": [80.0]}}
    (folder / "ctl.json").write_text(json.dumps(profile))
    echo = {"source": "zoo:echo", "input": VECTOR}
    sick = {**echo, "name": "sick", "replicas": 2, "parity": {"k": 2},
            "batching": {"max_batch_size": 1},
            "reconstruction": {"expected_accuracy": {"parm-subtraction": 0.9},
                               "source": source}}
    if sick_faults:
        sick["faults"] = sick_faults
    return {
        "server": {"http_port": 0, "grpc_port": 0, "max_queue": 2, **server,
                   "model_roots": [str(folder)]},
        "models": [
            sick,
            {**echo, "name": "slow", "replicas": 1, "batching": {"max_batch_size": 1},
             "faults": {"all": {"delay_ms": 300}}},
            {**echo, "name": "ctl", "replicas": 1, "parallelism": 1, "threads_per_replica": 1,
             "scheduler": {"policy": "serf", "profile": str(folder / "ctl.json"),
                           "period_s": serf_period_s, "window_s": serf_window_s}},
            {"name": "means", "source": "zoo:stream-mean", "options": {"features": 4}}],
        "applications": [
            {"name": "sick", "models": ["sick"], "slo_ms": 10_000, "default_output": "D"},
            {"name": "slow", "models": ["slow"], "slo_ms": 50, "default_output": "D"},
            {"name": "ctl", "models": ["ctl"], "slo_ms": 10_000, "default_output": "D"}],
        "graphs": [{"name": "stocks", "stream_key": "ticker", "max_batch": 8,
                    "fault_tolerance": "hams",
                    "operators": [{"name": "mean", "model": "means", "inputs": ["frontend"],
                                   "stateful": True}],
                    "output": "mean"}],
    }


def provoke_frontend_refusals(url: str) -> None:
    """A malformed body (a bad request) and bytes that are not HTTP (a refused connection)."""
    httpx.post(f"{url}/sick/predict", content=b"{not json", timeout=10)
    target = httpx.URL(url)
    with socket.create_connection((target.host, target.port), timeout=10) as s:
        s.sendall(b"\x00\x01 NOT HTTP\r\n\r\n")
        with contextlib.suppress(OSError):
            s.recv(1024)
