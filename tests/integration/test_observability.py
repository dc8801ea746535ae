"""The dashboard and the alert rules against a real Prometheus scraping a real parityserve.

One server serves what every row of the dashboard shows: a ParM model with a slowed replica
(answers rebuilt), a slow model behind a 50 ms SLO (defaults) and a queue of two (shed
queries), a model under the SERF controller, and a stateful graph whose primary is killed
(a failover). Prometheus (Debian's package, started by scripts/prometheus.sh) scrapes it every
second and evaluates a copy of deploy/prometheus/rules.yml with every ``for:`` at 0 s; the
test then runs each dashboard and rule expression through the HTTP query API.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from benchmarks.observability_setup import observed_config, provoke_frontend_refusals
from parityserve.client import Client
from parityserve.errors import ParityServeError
from parityserve.runtime.server import RunningServer
from tests.integration.conftest import start_server, wait_until
from tests.unit.deploy.promql_exprs import RULES, dashboard_exprs, rules, runnable

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "prometheus.sh"

# What this test cannot provoke in a minute, and why; everything else must return data.
NOT_PROVOKED = {
    "Byzantine workers located": "needs a Berrut group of 2K + 2E replicas (6 processes)",
    "Worker messages rejected": "needs a forged or malformed worker message",
}
MUST_FIRE = ("ParityserveReplicaSick", "ParityserveFailover", "ParityserveSLOBurnRateFast",
             "ParityserveShedding")


def _prometheus_missing() -> str | None:
    if shutil.which("prometheus") and shutil.which("promtool"):
        return None
    return ("prometheus/promtool not on PATH: run scripts/prometheus.sh ensure (installs "
            "Debian's 'prometheus' package with apt-get)")


def _test_rules(folder: Path) -> Path:
    """deploy/prometheus/rules.yml with every ``for:`` at 0 s, so an alert fires on its first
    true evaluation: the expressions and thresholds are the file's own."""
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        group["interval"] = "1s"
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "0s"
    path = folder / "rules.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    folder = tmp_path_factory.mktemp("observability")
    server = start_server(observed_config(
        folder, {"require_admin_token": False, "heartbeat_timeout_ms": 5000},
        source="a test", sick_faults={"0": {"delay_ms": 400}}, serf_period_s=0.2,
        serf_window_s=2.0), folder)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def prometheus(served: RunningServer, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[str]:
    missing = _prometheus_missing()
    if missing:
        pytest.skip(missing)
    folder = tmp_path_factory.mktemp("prometheus")
    env = {**os.environ, "PARITYSERVE_PROMETHEUS_PORT": str(_free_port())}
    target = httpx.URL(served.url)
    subprocess.run([str(SCRIPT), "start", f"{target.host}:{target.port}",
                    str(_test_rules(folder))], check=True, env=env, timeout=60)
    url = subprocess.run([str(SCRIPT), "url"], check=True, env=env, capture_output=True,
                         text=True).stdout.strip()
    yield url
    subprocess.run([str(SCRIPT), "stop"], check=True, env=env, timeout=60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10)
    body = response.json()
    assert body["status"] == "success", f"{expr}: {body}"
    return list(body["data"]["result"])


def _alerts(prometheus: str) -> dict[str, set[str]]:
    body = httpx.get(f"{prometheus}/api/v1/alerts", timeout=10).json()
    states: dict[str, set[str]] = {}
    for alert in body["data"]["alerts"]:
        states.setdefault(alert["labels"]["alertname"], set()).add(alert["state"])
    return states


def _load(url: str, stop: threading.Event) -> None:
    """Steady traffic on every application, and a burst now and then that the slow model's
    queue of two cannot hold (shed)."""
    rng = np.random.default_rng(0)
    with Client(url, timeout=30) as client, ThreadPoolExecutor(6) as pool:
        while not stop.is_set():
            x = rng.random(4).tolist()
            calls = [(client.predict, (app, x), {}) for app in ("sick", "ctl")]
            calls += [(client.predict, ("slow", x), {})] * 4
            calls.append((client.predict_graph, ("stocks", x),
                          {"stream": "s1", "stream_key": "ticker"}))
            for future in [pool.submit(f, *args, **kw) for f, args, kw in calls]:
                # shed queries and the graph's pause during failover are the point
                with contextlib.suppress(ParityServeError):
                    future.result()
            time.sleep(0.05)


def _kill_primary(url: str) -> int:
    with Client(url) as client:
        wait_until(lambda: client.state()["graphs"]["stocks"]["operators"]["mean"]
                   ["backup_synced"], 60)
        pid = client.state()["graphs"]["stocks"]["operators"]["mean"]["primary_pid"]
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: len(client.state()["graphs"]["stocks"]["failovers"]) >= 1, 60)
    return int(pid)


def _kill_replica(url: str, model: str) -> None:
    """SIGKILL a model's replica 0 and wait for the supervisor to start another."""
    with Client(url) as client:
        def replica() -> dict[str, Any]:
            entry = next(m for m in client.state()["models"] if m["name"] == model)
            return dict(entry["replicas"][0])
        before = replica()
        os.kill(before["pid"], signal.SIGKILL)
        wait_until(lambda: replica()["pid"] not in (None, before["pid"])
                   and replica()["state"] == "ready", 60)


def test_every_panel_and_rule_returns_data_and_the_alerts_fire(served: RunningServer,
                                                               prometheus: str) -> None:
    stop = threading.Event()
    loader = threading.Thread(target=_load, args=(served.url, stop), daemon=True)
    loader.start()
    try:
        provoke_frontend_refusals(served.url)
        # increase() needs a sample before the failover: a counter first seen at 1 has not
        # increased (a server in production scrapes at 0 long before its first failover)
        wait_until(lambda: bool(_query(prometheus, "parityserve_graph_failovers_total")), 60)
        _kill_primary(served.url)
        _kill_replica(served.url, "slow")
        exprs = [(title, runnable(e)) for title, e in dashboard_exprs()
                 if title not in NOT_PROVOKED]
        exprs += [(r["record"], r["expr"]) for r in rules() if "record" in r]
        empty: list[str] = []

        def all_have_data() -> bool:
            empty[:] = [f"{title}: {expr}" for title, expr in exprs
                        if not _query(prometheus, expr)]
            return not empty

        try:
            wait_until(all_have_data, 90)
        except AssertionError:
            pytest.fail("no data for:\n" + "\n".join(empty))
        firing: dict[str, set[str]] = {}

        def fired() -> bool:
            firing.update(_alerts(prometheus))
            return all("firing" in firing.get(name, set()) for name in MUST_FIRE)

        try:
            wait_until(fired, 60)
        except AssertionError:
            pytest.fail(f"alerts not firing: {sorted(set(MUST_FIRE) - set(firing))}; "
                        f"seen: {firing}")
    finally:
        stop.set()
        loader.join(60)
    # every alert expression at least evaluates (most are rightly empty here)
    for rule in rules():
        if "alert" in rule:
            _query(prometheus, rule["expr"])
