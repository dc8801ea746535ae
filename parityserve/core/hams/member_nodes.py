"""Where one new member of a stateful operator goes, given where the running ones are, and which
state link it gets (issue 41).

The runtime launches members one at a time (a graph's start, then each replacement a recovery
asks for), so this places one member with every running member fixed, by the same rule as
``placement.place_graph``: an operator's members apart first (``core.placement.place``'s group
rule: the operator is the group), then away from the correlated pair's node (an operator's
primary and the next stateful operator's backup, HAMS Fig. 6), then primaries spread. A node
in ``suspect`` (one where a member was just lost: a dead machine stays "alive" to Ray until its
health checks give up) takes the member only when no other node has room.

The state link: a backup listens on a Unix socket only when every other member of its
operator runs on its own node (then any primary it will serve is there); otherwise on TCP,
with CURVE, at its node's address. Roles change with failovers, so the link is chosen for the
operator, not for the primary of the moment.

A node that joins (a machine back from a crash, or a new one) gets new spares, not old roles
(``members_to_renew``): an operator whose spare shares a node with another of its members, and
for which a fresh member would now go to a node holding none of them, retires that spare, and
the replacement the recovery plan starts is placed there. A spare holds no state, so retiring
one costs a load, never a re-seed.

One backup moves too: a backup on its primary's node while the spare is on another. There the
operator's state lives on one machine, whose loss loses it for good (a quick run of
``benchmarks.hams_nodes`` broke its graph so, 2026-11-29: a spare placed beside its primary
when no other node had room became the backup at the next loss, and stayed). Retiring that
backup makes the spare, apart, the backup (seeded from the primary) and starts a new spare.
While the spare is seeded the primary is the one holder; a node's loss then loses no more than
it would have before (both holders were on that node), and only a second process failure in
those milliseconds could. Nothing else moves: a primary is never retired.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from parityserve.core.hams.placement import BACKUP, PRIMARY, ROLES, SPARE, StatefulGraph
from parityserve.core.placement import Member, Node, Resources, place

__all__ = ["MemberSpot", "RunningMember", "place_member", "members_to_renew", "state_link",
           "usable_nodes"]


@dataclass(frozen=True)
class RunningMember:
    op: str
    role: str  # PRIMARY | BACKUP | SPARE
    node: str


@dataclass(frozen=True)
class MemberSpot:
    """The node for the new member (None: no live node has room; Ray's scheduler then
    decides), and why it shares a node with its operator, when it does."""

    node: str | None
    note: str | None = None


def place_member(graph: StatefulGraph, op: str, key: str, role: str,
                 running: Mapping[str, RunningMember], alive: Sequence[Node],
                 suspect: Collection[str] = ()) -> MemberSpot:
    """The node for member ``key`` of ``op`` in ``role``; ``running`` keep their nodes."""
    trusted = [n for n in alive if n.node_id not in suspect]
    for nodes in (trusted, alive) if trusted else (alive,):
        spot = _place_on(graph, op, key, role, running, nodes)
        if spot.node is not None:
            return spot
    return MemberSpot(None, f"operator {op}: no live node has room for {key}")


def usable_nodes(graph: StatefulGraph, alive: Sequence[Node], free: Mapping[str, Resources],
                 running: Mapping[str, RunningMember]) -> list[Node]:
    """Each live node with the capacity this graph's members may count on: what the cluster
    says is free on it now, plus what the graph's own running members hold there (the rule
    counts those itself, as ``fixed``), never more than its total. What model replicas and
    other graphs use is neither free nor ours, so it is left out: a member pinned to a node
    whose CPUs the replicas took would wait in Ray's queue for good (hard affinity). A node
    the cluster reports no free figure for keeps its total."""
    ours: dict[str, Resources] = {}
    for member in running.values():
        ours[member.node] = ours.get(member.node, Resources()) + graph.demand_of(member.op)
    out = []
    for node in alive:
        if node.node_id not in free:
            out.append(node)
            continue
        room = free[node.node_id] + ours.get(node.node_id, Resources())
        total = node.capacity
        out.append(Node(node.node_id, Resources(min(room.cpu, total.cpu),
                                                min(room.gpu, total.gpu),
                                                min(room.memory, total.memory))))
    return out


def _place_on(graph: StatefulGraph, op: str, key: str, role: str,
              running: Mapping[str, RunningMember], nodes: Sequence[Node]) -> MemberSpot:
    ids = {n.node_id for n in nodes}
    live = {k: m for k, m in running.items() if m.node in ids}
    members = [Member(k, m.role, graph.demand_of(m.op), m.op) for k, m in live.items()]
    members.append(Member(key, role, graph.demand_of(op), op))
    apart = _apart(graph, {**live, key: RunningMember(op, role, "")})
    placed = place(members, nodes, {k: m.node for k, m in live.items()}, apart=apart)
    node = placed.nodes.get(key)
    sharing = sorted(m.role for m in live.values() if m.op == op and m.node == node)
    if node is None or not sharing:
        return MemberSpot(node)
    why = (f"the cluster has only {len(nodes)} usable live node{'s' if len(nodes) != 1 else ''}"
           if len(nodes) < len(ROLES) else "the other nodes had no room left")
    return MemberSpot(node, f"operator {op}: its new {role} {key} shares node {node} with its "
                            f"{' and '.join(sharing)} ({why}); losing {node} takes both")


def _apart(graph: StatefulGraph, members: Mapping[str, RunningMember]) -> dict[str, set[str]]:
    """Each operator's primary and the backups (and spares, the next backups) of the stateful
    operators right downstream, both ways."""
    apart: dict[str, set[str]] = {}
    for up_key, up in members.items():
        if up.role != PRIMARY:
            continue
        for down_key, down in members.items():
            if down.role != PRIMARY and down.op in graph.downstream.get(up.op, ()):
                apart.setdefault(up_key, set()).add(down_key)
                apart.setdefault(down_key, set()).add(up_key)
    return apart


def state_link(node: str | None, others: Collection[str | None]) -> str:
    """``"unix"`` when the member and at least one other member of its operator run, all of
    them on one known node, else ``"tcp"``. A member with no running peer gets TCP: the next
    one is placed apart when the cluster allows (a backup started while its primary was being
    started again, after that one's actor could not be scheduled, got a Unix socket, and the
    primary placed on another node could never have reached it). TCP works on one host too;
    the Unix socket is only the cheaper form."""
    return "unix" if node is not None and others and all(o == node for o in others) else "tcp"


def members_to_renew(graph: StatefulGraph, running: Mapping[str, RunningMember],
                     alive: Sequence[Node], suspect: Collection[str] = ()) -> dict[str, str]:
    """Operator -> the key of its member to retire: a spare that shares a node with another
    member of its operator, when a fresh member (placed as the recovery plan's replacement
    will be, by ``place_member``, with the spare gone) would land on a node holding none of
    the operator's other members; else a backup on its primary's node while the spare is on
    another (see the module docstring). Empty when nothing shares or nowhere better exists."""
    renew: dict[str, str] = {}
    for op in graph.operators:
        mine = {k: m for k, m in running.items() if m.op == op}
        spare = next((k for k, m in mine.items() if m.role == SPARE), None)
        if spare is None:
            continue
        if (backup := _backup_beside_its_primary(mine, spare)) is not None:
            renew[op] = backup
            continue
        others = {m.node for k, m in mine.items() if k != spare}
        if mine[spare].node not in others:
            continue
        rest = {k: m for k, m in running.items() if k != spare}
        spot = place_member(graph, op, f"{spare}+renewed", BACKUP, rest, alive, suspect)
        if spot.node is not None and spot.node not in others and spot.node not in suspect:
            renew[op] = spare
    return renew


def _backup_beside_its_primary(mine: Mapping[str, RunningMember], spare: str) -> str | None:
    """The operator's backup, when it shares its primary's node and the spare is elsewhere."""
    primary = next((m.node for m in mine.values() if m.role == PRIMARY), None)
    backup = next((k for k, m in mine.items() if m.role == BACKUP), None)
    if primary is None or backup is None or mine[backup].node != primary \
            or mine[spare].node == primary:
        return None
    return backup
