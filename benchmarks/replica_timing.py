"""What a task costs beyond the model, from two ``/admin/state`` snapshots of a model's replicas.

Every replica's state carries running sums: ``round_trip_s`` (the frontend's clock, from
sending a batch to reading its answer), ``worker_s`` (the worker's own clock, from receiving
the batch to sending the answer: the model, an emulated device's hold, injected delays) and
``served`` (batches answered). Two snapshots around a run split the round trip per task into
the worker's hold and the transport around it (ZeroMQ, socket queues, the frontend's event
loop getting to the answer). The simulators take these as inputs: they are measured waits,
not fits to the latencies they are compared with.

Why per point and not once: the transport grows with the frontend's load (on the 2-core VM,
in the EMULATED ParM testbed, 0.91 ms per task at 20 q/s, 1.08 at 100 and 1.33 at 250, by
hand on 2026-11-27), because an answer waits for the event loop to finish whatever it is
doing. A transport measured idle under-reads a loaded point.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["Snapshot", "replica_state", "settled_replica_state", "transport_ms_per_task",
           "worker_hold_ms"]

Snapshot = Sequence[Mapping[str, Any]]


def replica_state(url: str, model: str) -> list[dict[str, Any]]:
    """``model``'s replicas as the server's ``/admin/state`` reports them (timing sums
    included); empty when the server has no such model."""
    from parityserve.client import Client

    with Client(url, timeout=10.0) as client:
        models = client.state()["models"]
    return next((list(m["replicas"]) for m in models if m["name"] == model), [])


def settled_replica_state(url: str, model: str, timeout_s: float = 5.0,
                          poll_s: float = 0.05) -> list[dict[str, Any]]:
    """``replica_state`` once no replica has a batch in flight (or after ``timeout_s``): taken
    right after a run, it would leave out the tasks still out then (a slow data task a
    parity answer overtook), the very ones a slowdown made long."""
    deadline = time.monotonic() + timeout_s
    while True:
        replicas = replica_state(url, model)
        if not any(int(r.get("inflight") or 0) for r in replicas) or (
                time.monotonic() >= deadline):
            return replicas
        time.sleep(poll_s)


def _deltas(before: Snapshot, after: Snapshot) -> tuple[float, float, int]:
    """Round-trip seconds, worker seconds and tasks between two snapshots, summed over the
    replicas of ``after`` (one started in between counts from zero)."""
    start = {str(r["rid"]): r for r in before}
    trip = work = 0.0
    tasks = 0
    for r in after:
        r0 = start.get(str(r["rid"]), {})
        trip += float(r.get("round_trip_s", 0.0)) - float(r0.get("round_trip_s", 0.0))
        work += float(r.get("worker_s", 0.0)) - float(r0.get("worker_s", 0.0))
        tasks += int(r.get("served", 0)) - int(r0.get("served", 0))
    return trip, work, tasks


def transport_ms_per_task(before: Snapshot, after: Snapshot) -> float | None:
    """Mean time a task held its replica beyond the worker's own time (transport, socket
    queues, the frontend's loop); None if no task finished between the snapshots."""
    trip, work, tasks = _deltas(before, after)
    return (trip - work) * 1000 / tasks if tasks > 0 else None


def worker_hold_ms(before: Snapshot, after: Snapshot) -> float | None:
    """Mean time a worker held a batch, on its own clock (model, emulated hold, injected
    delays); None if no task finished between the snapshots."""
    _, work, tasks = _deltas(before, after)
    return work * 1000 / tasks if tasks > 0 else None
