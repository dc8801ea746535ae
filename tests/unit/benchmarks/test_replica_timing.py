"""benchmarks.replica_timing: a task's round trip split into the worker's hold and the
transport around it, from two /admin/state snapshots."""

from __future__ import annotations

import pytest

from benchmarks.replica_timing import transport_ms_per_task, worker_hold_ms

BEFORE = [{"rid": "a", "round_trip_s": 1.0, "worker_s": 0.5, "served": 10}]
AFTER = [{"rid": "a", "round_trip_s": 1.3, "worker_s": 0.7, "served": 110},
         {"rid": "b", "round_trip_s": 0.2, "worker_s": 0.1, "served": 100}]  # started between


def test_transport_is_the_round_trip_beyond_the_workers_own_time() -> None:
    # (0.3 - 0.2) + (0.2 - 0.1) s over 200 tasks
    assert transport_ms_per_task(BEFORE, AFTER) == pytest.approx(1.0)


def test_the_hold_is_the_workers_own_time_per_task() -> None:
    # 0.2 + 0.1 s over 200 tasks
    assert worker_hold_ms(BEFORE, AFTER) == pytest.approx(1.5)


def test_nothing_finished_between_the_snapshots_measures_nothing() -> None:
    assert transport_ms_per_task(AFTER, AFTER) is None
    assert worker_hold_ms(AFTER, AFTER) is None
    assert worker_hold_ms([], []) is None


def test_the_closing_snapshot_waits_for_the_tasks_still_out(monkeypatch) -> None:
    import benchmarks.replica_timing as rt

    states = iter([[{"rid": "a", "inflight": 1}], [{"rid": "a", "inflight": 1}],
                   [{"rid": "a", "inflight": 0, "served": 5}]])
    monkeypatch.setattr(rt, "replica_state", lambda url, model: next(states))
    assert rt.settled_replica_state("u", "m", poll_s=0.0) == [
        {"rid": "a", "inflight": 0, "served": 5}]


def test_the_closing_snapshot_gives_up_on_a_task_that_never_ends(monkeypatch) -> None:
    import benchmarks.replica_timing as rt

    monkeypatch.setattr(rt, "replica_state", lambda url, model: [{"rid": "a", "inflight": 2}])
    assert rt.settled_replica_state("u", "m", timeout_s=0.05, poll_s=0.01) == [
        {"rid": "a", "inflight": 2}]
