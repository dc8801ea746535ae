"""How a deployment's replicas are named, which pools it runs, and what each replica loads.

Pure functions of the deployment: the supervisor launches from them, the admin operations name
replicas with them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from parityserve.config import Deployment, FaultConfig
from parityserve.core.scheduling import DATA_POOL, parity_index
from parityserve.core.scheduling import slot_name as slot_name
from parityserve.runtime.modelpath.dispatch import Replica

__all__ = [
    "ONE_SHOT_FAULTS",
    "emulation_spec",
    "pool_model",
    "slot_name",
    "slot_of",
    "worker_faults",
]

# Faults that fire once: a replica restarted after one must not crash or hang again.
ONE_SHOT_FAULTS = ("crash_after_batches", "hang_after_batches")


def slot_of(replica: Replica) -> str:
    return slot_name(replica.index, replica.pool)


def pool_model(dep: Deployment, pool: str) -> tuple[str, str | None, dict[str, Any]]:
    """(source, weights, options) a replica of ``pool`` loads."""
    if pool == DATA_POOL or dep.parity is None:
        return dep.source, dep.weights, dict(dep.options)
    j = parity_index(pool)
    if j is None:
        raise ValueError(f"{pool!r} is neither the data pool nor a parity pool")
    parity = dep.parity
    weights = parity.weight_files[j]
    options = dict(parity.options if parity.options is not None else dep.options)
    return parity.source or dep.source, weights if weights is not None else dep.weights, options


def worker_faults(faults: dict[str, Any]) -> dict[str, Any]:
    """The fault spec a worker gets: empty when it injects nothing."""
    return {} if FaultConfig.model_validate(faults).is_noop else faults


def emulation_spec(dep: Deployment) -> dict[str, Any]:
    """What a worker of ``dep`` needs to emulate an accelerator: empty when it runs natively.
    Every pool (parity models too) runs on the same emulated device."""
    if dep.emulation is None:
        return {}
    profile = dataclasses.asdict(dep.emulation.service_profile())
    return {**profile, "seed": dep.emulation.seed}
