"""``parityserve profile`` end to end: the console script starts (or finds) a real server,
sets c and threads live, measures, and writes a profile the library reads back."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from parityserve.bench.serverproc import ServerProcess
from parityserve.client import Client
from parityserve.core.profiling import ProfileDocument
from parityserve.core.queueing import Config

pytestmark = pytest.mark.e2e

PARITYSERVE = str(Path(sys.executable).with_name("parityserve"))
NOOP = {"name": "noop", "source": "zoo:noop", "replicas": 1,
        "input": {"name": "input", "datatype": "FP32", "shape": [4]}}
TINY = ["--warmup", "2", "--requests", "10", "--no-progress", "--cores", "2"]


def _cli(*args: str, timeout_s: float = 240.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PARITYSERVE, "profile", *args], capture_output=True, text=True,
                          timeout=timeout_s, stdin=subprocess.DEVNULL)


def _yaml(path: Path, mapping: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(mapping, sort_keys=False))
    return path


def test_profile_from_a_yaml_with_the_exhaustive_baseline(tmp_path: Path) -> None:
    config = _yaml(tmp_path / "serving.yaml", {"server": {"http_port": 0}, "models": [NOOP]})
    out = tmp_path / "p.json"
    done = _cli("-c", str(config), "--model", "noop", *TINY, "--exhaustive", "--levels", "2",
                "--exhaustive-queries", "20", "--slo-p99-ms", "1000", "--tail-queries", "300",
                "--idle-requests", "5", "-o", str(out))
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    doc = ProfileDocument.from_dict(report)
    assert [m.config for m in doc.measurements] == [Config(1, 1), Config(2, 1), Config(1, 2)]
    assert all(m.n == 10 and m.warmup == 2 for m in doc.measurements)
    # the server computed each timed request once (no cache, batches of one)
    assert [s["batches"] for s in report["server_side"]] == [10, 10, 10]
    assert all(0 < s["worker_mean_s"] <= s["round_trip_mean_s"] for s in report["server_side"])
    # the default service time is the server's slot time; the rest is overhead outside it
    assert doc.service_time == "server"
    for m, s in zip(doc.measurements, report["server_side"], strict=True):
        assert m.mean_s == pytest.approx(s["round_trip_mean_s"]) and m.overhead_s >= 0
    assert doc.profiles.keys() == {1, 2} and len(report["reference_table"]) == 2
    cost = report["exhaustive"]["cost"]
    assert cost["exhaustive"]["runs"] == 3 * 2 and cost["profiling"]["runs"] == 3
    assert all(cell["errors"] == 0 and cell["n"] == 20 for cell in report["exhaustive"]["cells"])
    assert "reference table" in done.stdout and "search cost" in done.stdout
    assert "profiled noop: 3 runs" in done.stdout
    assert not list(tmp_path.glob(".serving.profile-*.yaml"))  # the derived file is gone
    # a second a query: every stable configuration meets it, so the cheapest stable one wins
    tail = report["tail_aware"]
    for row in tail["levels"]:
        stable = [e["cores"] for e in row["candidates"] if e["p99_s"] is not None]
        assert len(row["candidates"]) == 3 and row["chosen"]["cores"] == min(stable)
    assert "tail-aware" in done.stdout
    # beyond SERF: back-to-back slot times for every i, and spaced runs at c = 1, per intra
    idle = report["idle"]
    assert idle.keys() == {"1", "2"} and report["idle_elapsed_s"] > 0
    assert [len(idle[k]["busy_slot_s"]) for k in ("1", "2")] == [2, 1]
    assert [run["sleep_s"] for run in idle["1"]["spaced"]] == [0.002, 0.005, 0.01, 0.02, 0.05]
    assert all(run["slot_s"] > 0 and run["client_s"] > run["slot_s"]
               for run in idle["1"]["spaced"])
    assert "idle penalty" in done.stdout


def test_profile_a_running_server_and_leave_it_as_it_was(tmp_path: Path) -> None:
    # Every one of 3 replicas pulls (no parallelism), 1 thread: profiling ends at (1, 2), and
    # threads go back to 1 before c goes back to unlimited (3 x 1 would not pass 2 cores).
    config = _yaml(tmp_path / "serving.yaml", {
        "server": {"http_port": 0, "cache_bytes": 0}, "models": [{**NOOP, "replicas": 3}]})
    with ServerProcess(config) as server, Client(server.url) as client:
        out = tmp_path / "p.json"
        done = _cli("--url", server.url, "--model", "noop", *TINY, "--service-time", "client",
                    "-o", str(out))
        assert done.returncode == 0, done.stderr
        assert "warning" not in done.stderr, done.stderr
        doc = ProfileDocument.from_dict(json.loads(out.read_text()))
        assert [m.config for m in doc.measurements] == [Config(1, 1), Config(2, 1),
                                                        Config(1, 2)]
        assert doc.service_time == "client" and all(m.overhead_s == 0 for m in doc.measurements)
        assert "idle" not in json.loads(out.read_text())  # it needs the server's slot times
        state = _noop(client)
        assert state["parallelism"] is None and state["threads"] == 1
        deadline = time.monotonic() + 10  # the replicas' heartbeats acknowledge it
        while not all(r["threads"] == 1 for r in _noop(client)["replicas"]):
            assert time.monotonic() < deadline, _noop(client)["replicas"]
            time.sleep(0.05)


def _noop(client: Client) -> dict[str, Any]:
    return next(m for m in client.state()["models"] if m["name"] == "noop")


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "noop"], "exactly one of -c/--config"),
    (["--url", "http://127.0.0.1:9", "--model", "noop", "--requests", "5"],
     "--requests must be at least 10"),
    (["--url", "http://127.0.0.1:9", "--model", "noop", "--intra", "one"],
     "--intra must be thread counts"),
    (["--url", "http://127.0.0.1:9", "--model", "noop", "--slo-p99-ms", "0"],
     "--slo-p99-ms must be"),
    (["--url", "http://127.0.0.1:9", "--model", "noop", "--tail-queries", "10"],
     "--tail-queries must be at least 100"),
    (["--url", "http://127.0.0.1:9", "--model", "noop", "--idle-requests", "-1"],
     "--idle-requests must be 0"),
])
def test_bad_arguments_are_clear_errors(args, message) -> None:
    done = _cli(*args, timeout_s=60)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_server_service_time_refuses_a_server_that_batches(tmp_path: Path) -> None:
    config = _yaml(tmp_path / "serving.yaml", {
        "server": {"http_port": 0, "cache_bytes": 0},
        "models": [{**NOOP, "replicas": 2, "batching": {"max_batch_size": 8,
                                                        "max_delay_ms": 50}}]})
    with ServerProcess(config) as server:
        done = _cli("--url", server.url, "--model", "noop", *TINY, "--intra", "1",
                    "-o", str(tmp_path / "p.json"), timeout_s=60)
    # delayed batching puts the two requests in flight into one batch: one slot time for two
    assert done.returncode == 2 and "needs batches of one" in done.stderr, done.stderr


def test_a_model_not_in_the_file_and_a_cache_that_is_on(tmp_path: Path) -> None:
    config = _yaml(tmp_path / "serving.yaml", {"server": {"http_port": 0}, "models": [NOOP]})
    done = _cli("-c", str(config), "--model", "mlp", *TINY, "-o", str(tmp_path / "p.json"),
                timeout_s=60)
    assert done.returncode == 2 and "'mlp' is not in the deployment file" in done.stderr
    with ServerProcess(config) as server:  # the cache is on by default
        done = _cli("--url", server.url, "--model", "noop", *TINY, "-o",
                    str(tmp_path / "p.json"), timeout_s=60)
    assert done.returncode == 2 and "prediction cache is on" in done.stderr, done.stderr
