"""A deployment's replicas as placement members: their slots, resources and coding groups.

Pure functions of the config: the Ray launcher places from them (``core/placement.py``), and
tests check the groups without a cluster. A member's key is the slot part of a replica id,
``NAME/vVERSION/SLOT``, which every incarnation of that slot shares.

Which replicas form a coding group: the scheduler's groups are formed from whichever replicas
pull the batches, so the static groups here are the slots a deployment of m replicas needs for
its groups to be served one per node: ParM groups k data slots with slot g of each parity pool,
Berrut groups its coded tasks, replication groups its d copies.
"""

from __future__ import annotations

from collections.abc import Iterable

from parityserve.config import Deployment
from parityserve.core.placement import Member, Resources, coding_groups
from parityserve.core.scheduling import DATA_POOL, parity_pool, slot_name

__all__ = ["deployment_members", "group_size", "slot_key"]


def slot_key(replica_id: str) -> str:
    """``NAME/vN/SLOT`` of a replica id ``NAME/vN/SLOT#INCARNATION-RANDOM``."""
    return replica_id.split("#", 1)[0]


def demand(dep: Deployment) -> Resources:
    res = dep.resources
    if res is None:
        return Resources(cpu=float(dep.threads_per_replica))
    return Resources(res.cpu, res.gpu, res.memory_mb * 2**20)


def group_size(dep: Deployment) -> int:
    """Data replicas per coding group (1: the mode codes nothing)."""
    mode = dep.redundancy.mode
    if mode == "parm" and dep.parity is not None:
        return dep.parity.k
    if mode in ("berrut", "systematic-berrut"):
        return dep.redundancy.coded_tasks()
    if mode == "replication":
        return dep.redundancy.d
    return 1


def deployment_members(deps: Iterable[Deployment]) -> list[Member]:
    """Every replica slot of ``deps`` with its demand and coding group."""
    members: list[Member] = []
    for dep in deps:
        prefix = f"{dep.name}/v{dep.version}"
        pools = dep.parity.r if dep.redundancy.mode == "parm" and dep.parity else 0
        grouped: dict[tuple[str, int], str] = {}
        for g, slots in enumerate(coding_groups(dep.data_replicas(), group_size(dep), pools)):
            grouped.update(dict.fromkeys(slots, f"{prefix}/group{g}"))
        slots = [(DATA_POOL, i) for i in range(dep.data_replicas())]
        slots += [(parity_pool(j), i) for j in range(pools) for i in range(dep.parity_replicas())]
        for pool, i in slots:
            members.append(Member(f"{prefix}/{slot_name(i, pool)}", dep.name, demand(dep),
                                  grouped.get((pool, i), "")))
    return members
