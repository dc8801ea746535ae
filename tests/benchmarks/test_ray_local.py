"""benchmarks/_ray_local.py without a Ray cluster: a failed attempt is retried once, its
processes are killed and its raylet's error quoted, and a second failure is an error that says
what both attempts died of (the integration test turns it into a skip with that reason)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks import _ray_local


def _failing_then(succeed_on: int, calls: list[str]) -> Any:
    def start(nodes: int, cpus: float, temp_dir: str) -> tuple[Any, list[Any]]:
        calls.append(temp_dir)
        if len(calls) < succeed_on:
            logs = Path(temp_dir) / "session_1" / "logs"
            logs.mkdir(parents=True)
            (logs / "raylet.2.err").write_text("ok\nCheck failed: Timed out waiting for file "
                                               "metrics_agent_port\n")
            (logs / "dashboard_agent.err").write_text("not quoted\n")
            raise Exception("The current node timed out during startup.")
        return "cluster", ["n1", "n2"]
    return start


def test_a_failed_attempt_is_retried_in_a_fresh_temp_dir(monkeypatch) -> None:
    calls: list[str] = []
    stopped: list[str] = []
    monkeypatch.setattr(_ray_local, "_start", _failing_then(2, calls))
    monkeypatch.setattr(_ray_local, "_stop", lambda cluster, temp_dir: stopped.append(temp_dir))
    said: list[str] = []
    with _ray_local.local_cluster(nodes=2, say=said.append) as local:
        assert (local.cluster, local.nodes, local.attempts) == ("cluster", ["n1", "n2"], 2)
    assert len(set(calls)) == 2 and stopped == [calls[1]]
    assert not Path(calls[0]).exists()  # the failed attempt's dir is gone
    assert "attempt 1: Exception: The current node timed out" in said[0]
    assert "raylet.2.err: ok | Check failed: Timed out waiting for file" in said[0]
    assert "not quoted" not in said[0]


def test_every_attempt_failing_raises_with_each_reason(monkeypatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(_ray_local, "_start", _failing_then(99, calls))
    with pytest.raises(_ray_local.ClusterUnavailable) as err, \
            _ray_local.local_cluster(attempts=2, say=lambda _: None):
        pytest.fail("no cluster should have been yielded")
    assert "attempt 1:" in str(err.value) and "attempt 2:" in str(err.value)
    assert str(err.value).count("metrics_agent_port") == 2


def test_leftover_processes_of_a_failed_attempt_are_killed(tmp_path) -> None:
    marker = str(tmp_path / "psray-test")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # Called again until the process is gone: one clean-clone CI run under full load saw
        # a single pass miss a process started just before it (its cause not found; the
        # helper is a clean-up, and calling it twice is harmless). A process it never finds
        # still fails here after 10 s.
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline:
            _ray_local._kill_leftovers(marker)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.5)
        assert proc.poll() is not None and proc.returncode < 0  # killed by a signal
        assert bystander.poll() is None
    finally:
        for p in (proc, bystander):
            p.kill()
            p.wait()
