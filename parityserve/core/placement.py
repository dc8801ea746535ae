"""Where each replica runs on a cluster: a pure function of nodes, resources and coding groups.

ParM and ApproxIFER tolerate a bounded number of erasures per coding group (one for ParM with
one parity model, S for Berrut). Their premise holds on a cluster only when one node's failure
erases at most one member of each group, so the members of a group (the k data replicas and
their parity replicas, or the Berrut workers) go on distinct nodes whenever the cluster has
room. Within that, replicas of one model spread across nodes, and load evens out.

``place`` is a greedy pass: members in order, each to the node that fits its demand with the
fewest members of its own group, then of the members it is asked to keep ``apart`` from (a
soft wish: HAMS graph members use it for the primary of one operator and the backup of the
next, see ``core/hams/placement.py``), then of its own model, then the least loaded. It never
exceeds a node's capacity. When every node can hold one member of every group and there are
at least as many nodes as the largest group has members, it places every group on distinct
nodes (each node then has room left for any group it does not yet hold).
When a group must share a node, the placement says so, and why, in ``notes``.

``replace_after_failure`` keeps every member on a surviving node where it is and places only
those of the dead nodes, so a node failure restarts nothing that still runs.

``plan_groups`` says the same for a cluster manager with placement groups (Ray): one group per
coding group, STRICT_SPREAD (every bundle on its own node) when enough nodes could each hold one
member, else SPREAD (as spread as the cluster allows) with a note saying so; and one SPREAD
group per model for its replicas outside any coding group. Member i of a plan is bundle i.
``holds_strictly`` says whether live nodes can still hold a STRICT_SPREAD group: when one of
too few nodes dies, Ray cannot reschedule the lost bundle, and a replacement must go elsewhere.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from parityserve.core.scheduling.pools import DATA_POOL, parity_pool

__all__ = [
    "SPREAD",
    "STRICT_SPREAD",
    "GroupPlan",
    "Member",
    "Node",
    "Placement",
    "Resources",
    "coding_groups",
    "erasures",
    "holds_strictly",
    "place",
    "plan_groups",
    "replace_after_failure",
]

STRICT_SPREAD = "STRICT_SPREAD"  # Ray's strategies: each bundle on a distinct node, or fail
SPREAD = "SPREAD"  # spread as far as the nodes allow


@dataclass(frozen=True)
class Resources:
    """What a replica asks for, or what a node has: CPUs, GPUs and memory in bytes."""

    cpu: float = 0.0
    gpu: float = 0.0
    memory: float = 0.0

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.cpu + other.cpu, self.gpu + other.gpu, self.memory + other.memory)

    def __sub__(self, other: Resources) -> Resources:
        return Resources(self.cpu - other.cpu, self.gpu - other.gpu, self.memory - other.memory)

    def fits_in(self, free: Resources) -> bool:
        # A tiny tolerance: fractional CPU requests summed in floats must not refuse a fit.
        eps = 1e-9
        return (self.cpu <= free.cpu + eps and self.gpu <= free.gpu + eps
                and self.memory <= free.memory + eps)

    def __str__(self) -> str:
        return f"{self.cpu:g} CPU, {self.gpu:g} GPU, {self.memory / 2**20:.0f} MiB"


@dataclass(frozen=True)
class Node:
    node_id: str
    capacity: Resources


@dataclass(frozen=True)
class Member:
    """One replica to place. ``group`` names its coding group; a replica in no group gets a
    group of its own (its key), so it only spreads by model."""

    key: str
    model: str
    demand: Resources = Resources()
    group: str = ""

    @property
    def group_key(self) -> str:
        return self.group or self.key


@dataclass(frozen=True)
class Placement:
    """member key -> node id, the members no node had room for (key -> why), and one note per
    coding group that had to share a node."""

    nodes: Mapping[str, str] = field(default_factory=dict)
    unplaced: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


class _Ledger:
    """What is placed so far: free resources and group/model counts per node."""

    def __init__(self, nodes: Sequence[Node],
                 apart: Mapping[str, Collection[str]] | None = None) -> None:
        self.apart = apart or {}
        self.order = {n.node_id: i for i, n in enumerate(nodes)}
        self.capacity = {n.node_id: n.capacity for n in nodes}
        self.free = dict(self.capacity)
        self.groups: dict[str, Counter[str]] = defaultdict(Counter)  # node -> group -> count
        self.models: dict[str, Counter[str]] = defaultdict(Counter)
        self.assigned: dict[str, str] = {}

    def put(self, member: Member, node_id: str) -> None:
        self.free[node_id] = self.free[node_id] - member.demand
        self.groups[node_id][member.group_key] += 1
        self.models[node_id][member.model] += 1
        self.assigned[member.key] = node_id

    def best(self, member: Member, avoid: str | None = None) -> str | None:
        fits = [n for n in self.order if member.demand.fits_in(self.free[n])]
        fits = [n for n in fits if n != avoid] or fits
        return min(fits, key=lambda n: self._score(member, n), default=None)

    def _score(self, member: Member, node_id: str) -> tuple[int, int, int, float, int]:
        cap, free = self.capacity[node_id], self.free[node_id]
        used = cap.cpu - free.cpu + member.demand.cpu
        load = used / cap.cpu if cap.cpu > 0 else used
        shunned = sum(self.assigned.get(k) == node_id for k in self.apart.get(member.key, ()))
        return (self.groups[node_id][member.group_key], shunned,
                self.models[node_id][member.model], load, self.order[node_id])


def place(members: Sequence[Member], nodes: Sequence[Node],
          fixed: Mapping[str, str] | None = None,
          avoid: Mapping[str, str] | None = None,
          apart: Mapping[str, Collection[str]] | None = None) -> Placement:
    """Assign every member a node (or say why not). ``fixed`` members keep their node (it must
    be one of ``nodes``) and count against its resources. A member in ``avoid`` goes on
    another node than the one named there whenever another has room: a replacement for a
    replica that died goes elsewhere, since its node may be dying before the cluster says so.
    A member in ``apart`` prefers nodes holding fewest of the keys named there, but never at
    the cost of sharing a node with its own group (a wish about correlated failures across
    groups ranks below the guarantee within one)."""
    ledger = _Ledger(nodes, apart)
    by_key = {m.key: m for m in members}
    for key, node_id in (fixed or {}).items():
        if key in by_key and node_id in ledger.free:
            ledger.put(by_key[key], node_id)
    unplaced: dict[str, str] = {}
    for member in members:
        if member.key in ledger.assigned:
            continue
        best = ledger.best(member, (avoid or {}).get(member.key))
        if best is None:
            unplaced[member.key] = _no_room(member, ledger)
        else:
            ledger.put(member, best)
    return Placement(ledger.assigned, unplaced, _collision_notes(members, ledger))


def replace_after_failure(previous: Placement, members: Sequence[Member],
                          alive: Sequence[Node]) -> Placement:
    """Members on surviving nodes stay; those of dead nodes (and any unplaced) are placed anew."""
    alive_ids = {n.node_id for n in alive}
    kept = {k: n for k, n in previous.nodes.items() if n in alive_ids}
    return place(members, alive, kept)


def erasures(placement: Placement, members: Iterable[Member], node_id: str) -> dict[str, int]:
    """Per coding group: how many of its members ``node_id``'s failure takes down."""
    lost: Counter[str] = Counter()
    for m in members:
        if m.group and placement.nodes.get(m.key) == node_id:
            lost[m.group] += 1
    return dict(lost)


def coding_groups(data: int, group_size: int, parity_pools: int = 0) -> list[list[tuple[str, int]]]:
    """Static coding groups over replica slots, as (pool, index) pairs.

    Group g holds data slots [g*size, (g+1)*size) and, with ParM, slot g of every parity pool
    (``parity<j>``): ParM deploys ceil(m/k) parity replicas per pool, one per such group. A last
    short group keeps its parity replica. Without coding (size 1) there are no groups.
    """
    if group_size <= 1 and parity_pools == 0:
        return []
    groups = []
    for g, start in enumerate(range(0, data, group_size)):
        slots = [(DATA_POOL, i) for i in range(start, min(start + group_size, data))]
        slots += [(parity_pool(j), g) for j in range(parity_pools)]
        groups.append(slots)
    return groups


@dataclass(frozen=True)
class GroupPlan:
    """One placement group: member ``members[i]`` runs in bundle i, which reserves
    ``bundles[i]``. ``note`` says why a coding group is not STRICT_SPREAD."""

    name: str
    strategy: str
    members: tuple[str, ...]
    bundles: tuple[Resources, ...]
    coding: bool  # a coding group (else a model's replicas outside any)
    note: str = ""
    fits: bool = True  # False: the cluster cannot hold every member at once (see plan_groups)


def plan_groups(members: Sequence[Member], nodes: Sequence[Node]) -> list[GroupPlan]:
    """Placement groups for ``members`` on a cluster of ``nodes``, in the members' order: a
    coding group's plan is named after the group, a model's other replicas after its first
    key's prefix plus ``/spread``.

    Ray reserves a group whole or not at all, so a plan with a member that ``place`` finds no
    room for does not ``fit``: created, it would hold back every member, not only that one.
    """
    room = place(members, nodes)
    units: dict[str, list[Member]] = {}
    for m in members:
        units.setdefault(m.group or f"{m.key.rsplit('/', 1)[0]}/spread", []).append(m)
    plans = []
    for name, unit in units.items():
        bundles = tuple(m.demand for m in unit)
        keys = tuple(m.key for m in unit)
        if any(k in room.unplaced for k in keys):
            plans.append(GroupPlan(name, SPREAD, keys, bundles, bool(unit[0].group), fits=False,
                                   note=f"{name}: no room for all {len(unit)} members at once"))
        elif not unit[0].group:
            plans.append(GroupPlan(name, SPREAD, keys, bundles, coding=False))
        elif holds_strictly(bundles, nodes):
            plans.append(GroupPlan(name, STRICT_SPREAD, keys, bundles, coding=True))
        else:
            able = len(_able(bundles, nodes))
            plans.append(GroupPlan(name, SPREAD, keys, bundles, True, (
                f"coding group {name}: {len(unit)} members but only {able} of {len(nodes)} "
                f"nodes can hold one; SPREAD instead of STRICT_SPREAD, so one node's failure "
                f"may erase more than one of them")))
    return plans


def holds_strictly(bundles: Sequence[Resources], nodes: Sequence[Node]) -> bool:
    """Whether each bundle can go on its own node: as many nodes as bundles whose capacity
    holds the largest of them (one deployment's members ask alike)."""
    return len(_able(bundles, nodes)) >= len(bundles)


def _able(bundles: Sequence[Resources], nodes: Sequence[Node]) -> list[Node]:
    need = Resources(max((b.cpu for b in bundles), default=0.0),
                     max((b.gpu for b in bundles), default=0.0),
                     max((b.memory for b in bundles), default=0.0))
    return [n for n in nodes if need.fits_in(n.capacity)]


def _no_room(member: Member, ledger: _Ledger) -> str:
    if not ledger.free:
        return "no live node in the cluster"
    most = max(ledger.free.values(), key=lambda r: (r.cpu, r.gpu, r.memory))
    return (f"no node has {member.demand} free for {member.key} "
            f"(the most free on one node: {most})")


def _collision_notes(members: Sequence[Member], ledger: _Ledger) -> tuple[str, ...]:
    groups: dict[str, list[Member]] = defaultdict(list)
    for m in members:
        if m.group and m.key in ledger.assigned:
            groups[m.group].append(m)
    notes = []
    for group, group_members in groups.items():
        on = Counter(ledger.assigned[m.key] for m in group_members)
        worst, count = on.most_common(1)[0]
        if count > 1:
            why = (f"the cluster has only {len(ledger.order)} nodes"
                   if len(ledger.order) < len(group_members)
                   else "the other nodes had no room left")
            notes.append(
                f"coding group {group}: {len(group_members)} members on {len(on)} nodes "
                f"({why}); losing node {worst} erases {count} of them, more than one")
    return tuple(notes)
