"""``python -m benchmarks.ray_cluster``: its flags, how processes are billed, the CPU window
and the failure timeline's bins (the measurement itself needs a Ray cluster: run it)."""

from __future__ import annotations

import pytest

from benchmarks.ray_cluster import build_parser, classify, cost, timeline


def test_flags() -> None:
    args = build_parser().parse_args(["--quick", "--clients", "4"])
    assert args.quick and args.clients == 4 and callable(args.func)


@pytest.mark.parametrize(("cmd", "bill"), [
    ("/usr/bin/python -m parityserve.runtime.workers.worker --connect tcp://x", "worker"),
    ("ray::ReplicaActor.poll", "actor"),
    ("ray::IDLE", "ray"),
    (".../ray/core/src/ray/gcs/gcs_server --redis_address", "ray"),
    (".../raylet --node_id", "ray"),
])
def test_processes_are_billed_to_ray_actors_or_workers(cmd: str, bill: str) -> None:
    assert classify(cmd) == bill


def test_cost_is_cpu_over_the_window_and_rss_now() -> None:
    before = {1: ("raylet", 10.0, 100.0), 2: ("ray::ReplicaActor", 1.0, 90.0)}
    after = {1: ("raylet", 10.5, 110.0), 2: ("ray::ReplicaActor", 1.0, 90.0),
             # started in the window
             3: ("python -m parityserve.runtime.workers.worker", 0.2, 50.0)}
    bills = cost(before, after, seconds=2.0)
    assert bills["ray"] == {"processes": 1, "cpu_pct": 25.0, "rss_mib": 110.0}
    assert bills["actor"]["cpu_pct"] == 0.0
    assert bills["worker"]["cpu_pct"] == 0.0  # no earlier sample: its CPU is not guessed


def test_timeline_bins_answers_by_when_they_came_back() -> None:
    # (sent, seconds, rebuilt): two answers in the first half second, one rebuilt in the next
    samples = [(10.0, 0.1, 0), (10.2, 0.2, 0), (10.3, 0.4, 1)]
    rows = timeline(samples, start=10.0, bin_s=0.5)
    assert [r["n"] for r in rows] == [2, 1]
    assert rows[1]["rebuilt_per_s"] == 2.0 and rows[0]["qps"] == 4.0
    assert rows[0]["p50_ms"] == pytest.approx(150.0)
    assert timeline([], 0.0, 0.5) == []
