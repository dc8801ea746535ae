"""How a deployment's replicas are named, which pools it runs, and what each replica loads.

Pure functions of the deployment: the supervisor launches from them, the admin operations name
replicas with them.
"""

from __future__ import annotations

from typing import Any

from parityserve.config import Deployment, FaultConfig
from parityserve.runtime.coding import parity_pool
from parityserve.runtime.dispatch import DATA_POOL, Replica

__all__ = [
    "ONE_SHOT_FAULTS",
    "parity_pools",
    "pool_model",
    "slot_name",
    "slot_of",
    "worker_faults",
]

# Faults that fire once: a replica restarted after one must not crash or hang again.
ONE_SHOT_FAULTS = ("crash_after_batches", "hang_after_batches")


def slot_name(index: int, pool: str) -> str:
    """How admin calls and replica ids name a replica: "2", or "parity0-1" for parity ones."""
    return str(index) if pool == DATA_POOL else f"{pool}-{index}"


def slot_of(replica: Replica) -> str:
    return slot_name(replica.index, replica.pool)


def parity_pools(deployment: Deployment) -> list[str]:
    if deployment.redundancy.mode != "parm" or deployment.parity is None:
        return []
    return [parity_pool(j) for j in range(deployment.parity.r)]


def pool_model(dep: Deployment, pool: str) -> tuple[str, str | None, dict[str, Any]]:
    """(source, weights, options) a replica of ``pool`` loads."""
    if pool == DATA_POOL or dep.parity is None:
        return dep.source, dep.weights, dict(dep.options)
    j = int(pool.removeprefix("parity"))
    parity = dep.parity
    weights = parity.weight_files[j]
    options = dict(parity.options if parity.options is not None else dep.options)
    return parity.source or dep.source, weights if weights is not None else dep.weights, options


def worker_faults(faults: dict[str, Any]) -> dict[str, Any]:
    """The fault spec a worker gets: empty when it injects nothing."""
    return {} if FaultConfig.model_validate(faults).is_noop else faults
