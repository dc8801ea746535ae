"""Whether a replica is healthy, judged from what the frontend saw of it.

Pure functions of a replica record and the time: the supervisor replaces a replica for the
reason given here, and readiness counts only the replicas that have none.
"""

from __future__ import annotations

from parityserve.core.scheduling import DATA_POOL, ReplicaState
from parityserve.runtime.modelpath.dispatch import ModelPath, Replica

__all__ = ["STARTUP_TIMEOUT_S", "holds_server_readiness", "live_replicas", "replica_failure"]

STARTUP_TIMEOUT_S = 120.0  # importing torch and loading weights on a busy 2-core box is slow


def replica_failure(replica: Replica, now: float, heartbeat_timeout_s: float,
                    startup_timeout_s: float = STARTUP_TIMEOUT_S) -> str | None:
    """Why a replica counts as failed, or None while it is healthy."""
    if replica.state == ReplicaState.DEAD:
        return "unreachable"
    code = replica.process.exit_code() if replica.process is not None else None
    if code is not None:
        return f"process exited with code {code}"
    if replica.state == ReplicaState.STARTING:
        return "did not start in time" if now - replica.started_at > startup_timeout_s else None
    if now - replica.last_seen > heartbeat_timeout_s:
        return f"no heartbeat for {now - replica.last_seen:.1f}s"
    return None


def live_replicas(path: ModelPath, now: float, heartbeat_timeout_s: float) -> list[Replica]:
    """Replicas that can answer now: ready, heartbeating, process alive, and running the
    model itself (a parity model alone cannot answer). Judged at the moment of asking, not
    from the supervisor's last verdict, which trails a kill or a hang."""
    return [r for r in path.ready_replicas()
            if r.pool == DATA_POOL and replica_failure(r, now, heartbeat_timeout_s) is None]


def holds_server_readiness(path: ModelPath, load_error: str | None) -> bool:
    """Whether the server's readiness waits for this model to be live: every model that asks
    for replicas, except one whose load failed. That one is not ready itself (its own ready
    route, gRPC ModelReady, ``load_error`` in /admin/state), but a load balancer that drops a
    not-ready server must not lose every other model with it. A server whose configured model
    cannot load at start does not start at all, so this covers deploys, scale-ups and reloads
    that fail later; a model that crashed or hangs and is being restarted still counts."""
    return bool(path.deployment.replicas) and load_error is None
