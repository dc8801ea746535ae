"""Where a stateful graph's members run on a cluster (issue 41): primary, backup, spare apart.

HAMS keeps a stateful operator answering through a host failure only if one host's loss takes
at most one of its members: the primary and its backup on one machine die together, and the
warm spare, the next backup, must not go down with either. So each stateful operator's three
members go on three distinct nodes when the cluster has them. With fewer, the primary and backup
are kept apart first and the spare shares last, and a note per operator says so and why (the
text ``/admin/state`` and the log show): ``notes`` has an entry exactly for the operators whose
three members are not on three distinct nodes.

Across operators, a node holding the primary of one operator and the backup of the next stateful
one downstream is HAMS's correlated case (Fig. 6: the downstream operator must roll back in
place). Placement avoids it when it has a choice, but never at the cost of an operator's own
members sharing a node (``core.placement.place``'s ``apart`` ranks below its group rule).

Members are processes with keys (``op/1``, ``op/2``, ...) that never change node; roles point at
keys. ``replan`` folds any change in the live nodes into a placement, the same rule for a loss,
two losses at once, a new node or a returning one:

* members on live nodes stay where they are; an operator's survivors take its roles by rank (a
  lost primary's backup is promoted, the spare becomes the backup) and new members fill the
  roles left, each on a node holding none of its operator's members when one has room. One
  exception: a spare promoted to backup on the primary's own node trades roles with the new
  spare when that one is elsewhere (neither holds state yet; primary and backup apart first);
* a spare that shares a node with its operator while another node could hold it apart is
  replaced there (a spare holds no state, so nothing is lost): this is how a node that comes back
  is used. It holds none of its old members (they were dropped when it was lost, or are dropped
  now when named in ``lost``), and primaries and backups never move to it while they run.

``place_graph`` is ``replan`` from nothing. ``plan_member_groups`` says the same for Ray's
placement groups, in the style of ``core.placement.plan_groups``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from parityserve.core.hams.lineage import FRONTEND
from parityserve.core.hams.topology import Topology
from parityserve.core.placement import (
    SPREAD,
    STRICT_SPREAD,
    GroupPlan,
    Member,
    Node,
    Resources,
    holds_strictly,
    place,
)

__all__ = ["BACKUP", "PRIMARY", "ROLES", "SPARE", "GraphPlacement", "StatefulGraph",
           "correlated", "place_graph", "plan_member_groups", "replan"]

PRIMARY, BACKUP, SPARE = "primary", "backup", "spare"
ROLES = (PRIMARY, BACKUP, SPARE)  # by rank: survivors fill them in this order
# The backup is placed before its primary: it then sees the upstream operator's primary (placed
# already) and avoids it, and the primary, free but for its own backup's node, follows. On a
# chain this finds a layout without the correlated pair whenever there are two nodes.
_PLACING = (BACKUP, PRIMARY, SPARE)


@dataclass(frozen=True)
class StatefulGraph:
    """The stateful operators of a graph, upstream first, with the nearest stateful operators
    downstream of each (the correlated pairs) and what one member of each asks for."""

    operators: tuple[str, ...]
    downstream: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    demand: Mapping[str, Resources] = field(default_factory=dict)

    @classmethod
    def chain(cls, operators: Sequence[str],
              demand: Mapping[str, Resources] | None = None) -> StatefulGraph:
        """Operators in a line, each feeding the next."""
        ops = tuple(operators)
        return cls(ops, {a: (b,) for a, b in zip(ops, ops[1:], strict=False)}, demand or {})

    @classmethod
    def of(cls, topology: Topology,
           demand: Mapping[str, Resources] | None = None) -> StatefulGraph:
        """A validated graph's stateful operators; downstream is its NFM without the frontend."""
        ops = tuple(o for o in topology.operators if o in topology.stateful)
        down = {o: tuple(d for d in topology.next_stateful(o) if d != FRONTEND) for o in ops}
        return cls(ops, down, demand or {})

    def demand_of(self, op: str) -> Resources:
        return self.demand.get(op, Resources())


@dataclass(frozen=True)
class GraphPlacement:
    """member key -> node; op -> role -> member key; op -> why its members share a node; member
    key -> why no node has room. ``started``: keys new in this placement (processes to start);
    ``retired``: spares on live nodes replaced apart (processes to stop); ``stateless``: the
    operators whose primary and backup were both lost, so that a member holding no state took the
    primary role (the recovery plan decides whether that loses state: not while pristine)."""

    nodes: Mapping[str, str] = field(default_factory=dict)
    roles: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    notes: Mapping[str, str] = field(default_factory=dict)
    unplaced: Mapping[str, str] = field(default_factory=dict)
    started: tuple[str, ...] = ()
    retired: tuple[str, ...] = ()
    stateless: tuple[str, ...] = ()
    serials: Mapping[str, int] = field(default_factory=dict)  # op -> last member number used

    def node_of(self, op: str, role: str) -> str | None:
        return self.nodes.get(self.roles[op][role])


def place_graph(graph: StatefulGraph, nodes: Sequence[Node]) -> GraphPlacement:
    """Every operator's primary, backup and spare, placed from nothing."""
    return replan(GraphPlacement(), graph, nodes)


def replan(previous: GraphPlacement, graph: StatefulGraph, alive: Sequence[Node],
           lost: Collection[str] = ()) -> GraphPlacement:
    """Fold the live nodes now into ``previous``. ``lost`` names nodes in ``alive`` whose members
    are gone all the same (the node came back before its loss was folded in): their old members
    are dropped like those of a node not in ``alive``, and the node takes only new ones."""
    live = {n.node_id for n in alive} - set(lost)
    kept = {k: n for k, n in previous.nodes.items() if n in live}
    roles, serials = _fill_roles(previous, graph, kept)
    stateless = tuple(op for op in graph.operators if _lost_state(previous, op, kept))
    placed = place(_members(graph, roles), alive, kept, apart=_apart(graph, roles))
    at = dict(placed.nodes)
    roles = _backups_apart(previous, roles, at)
    roles, at, retired = _spares_apart(graph, roles, at, alive, serials, kept)
    unplaced = {k: why for k, why in placed.unplaced.items() if k not in at}
    fresh = [k for k in _keys(graph, roles) if k not in previous.nodes]
    return GraphPlacement(
        at, roles, _notes(graph, roles, at, alive, unplaced, set(fresh)), unplaced,
        tuple(k for k in fresh if k in at), retired, stateless, serials)


def _fill_roles(previous: GraphPlacement, graph: StatefulGraph, kept: Mapping[str, str],
                ) -> tuple[dict[str, dict[str, str]], dict[str, int]]:
    """Survivors take their operator's roles by rank; new keys fill the rest."""
    roles: dict[str, dict[str, str]] = {}
    serials = dict(previous.serials)
    for op in graph.operators:
        old = previous.roles.get(op, {})
        survivors = [old[r] for r in ROLES if r in old and old[r] in kept]
        for _ in range(len(ROLES) - len(survivors)):
            serials[op] = serials.get(op, 0) + 1
            survivors.append(f"{op}/{serials[op]}")
        roles[op] = dict(zip(ROLES, survivors, strict=True))
    return roles, serials


def _backups_apart(previous: GraphPlacement, roles: dict[str, dict[str, str]],
                   at: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Swap a spare just promoted to backup with the new spare when only the new one is off
    the primary's node: neither holds state yet (both are seeded from the primary), and
    primary and backup apart comes before reusing a warm spare."""
    out = {}
    for op, r in roles.items():
        was_spare = r[BACKUP] == previous.roles.get(op, {}).get(SPARE)
        p, b, s = (at.get(r[x]) for x in ROLES)
        fresh_spare = r[SPARE] not in previous.nodes
        swap = was_spare and fresh_spare and b == p and s is not None and s != p
        out[op] = {**r, BACKUP: r[SPARE], SPARE: r[BACKUP]} if swap else r
    return out


def _lost_state(previous: GraphPlacement, op: str, kept: Mapping[str, str]) -> bool:
    """Whether the primary and backup that ran for ``op`` were both lost now."""
    old = previous.roles.get(op, {})
    ran = [old[r] for r in (PRIMARY, BACKUP) if r in old and old[r] in previous.nodes]
    return len(ran) == 2 and not any(k in kept for k in ran)


def _members(graph: StatefulGraph, roles: Mapping[str, Mapping[str, str]]) -> list[Member]:
    """``place``'s members: the operator is the group (its members apart first), the role is
    the model (primaries, which do the work, spread over the nodes)."""
    return [Member(roles[op][role], role, graph.demand_of(op), op)
            for op in graph.operators for role in _PLACING]


def _apart(graph: StatefulGraph, roles: Mapping[str, Mapping[str, str]],
           ) -> dict[str, set[str]]:
    """Each correlated pair, both ways: an operator's primary and each downstream backup."""
    apart: dict[str, set[str]] = {}
    for op, down in correlated(graph, roles):
        apart.setdefault(op, set()).add(down)
        apart.setdefault(down, set()).add(op)
    return apart


def correlated(graph: StatefulGraph, roles: Mapping[str, Mapping[str, str]],
               ) -> list[tuple[str, str]]:
    """(primary key, downstream backup key) pairs that had better not share a node (Fig. 6)."""
    return [(roles[op][PRIMARY], roles[d][BACKUP])
            for op in graph.operators for d in graph.downstream.get(op, ()) if d in roles]


def _spares_apart(graph: StatefulGraph, roles: dict[str, dict[str, str]], at: dict[str, str],
                  nodes: Sequence[Node], serials: dict[str, int], kept: Mapping[str, str],
                  ) -> tuple[dict[str, dict[str, str]], dict[str, str], tuple[str, ...]]:
    """Replace each running spare that shares a node with its operator by a new one on a node
    holding none of its members, where one has room; the old spare is retired. (A new spare
    sharing already had the least shared node ``place`` could find.)"""
    retired = []
    for op in graph.operators:
        spare = roles[op][SPARE]
        others = {at.get(roles[op][r]) for r in (PRIMARY, BACKUP)}
        if spare not in kept or at[spare] not in others:
            continue
        key = f"{op}/{serials.get(op, 0) + 1}"
        trial = {**roles, op: {**roles[op], SPARE: key}}
        fixed = {k: n for k, n in at.items() if k != spare}
        node = place(_members(graph, trial), nodes, fixed).nodes.get(key)
        if node is not None and node not in others:
            serials[op] = serials.get(op, 0) + 1
            roles, at = trial, {**fixed, key: node}
            retired.append(spare)
    return roles, at, tuple(retired)


def _notes(graph: StatefulGraph, roles: Mapping[str, Mapping[str, str]], at: Mapping[str, str],
           nodes: Sequence[Node], unplaced: Mapping[str, str],
           fresh: Collection[str]) -> dict[str, str]:
    """One note per operator whose three members are not on three distinct nodes."""
    notes = {}
    for op in graph.operators:
        keys = {r: roles[op][r] for r in ROLES}
        missing = [r for r, k in keys.items() if k not in at]
        if missing:
            notes[op] = (f"operator {op}: no node for its {' and '.join(missing)} "
                         f"({unplaced[keys[missing[0]]]})")
        elif len({at[k] for k in keys.values()}) < len(ROLES):
            old_pair = at[keys[PRIMARY]] == at[keys[BACKUP]] and not (
                {keys[PRIMARY], keys[BACKUP]} & set(fresh))
            notes[op] = _sharing_note(op, {r: at[k] for r, k in keys.items()},
                                      _why_shared(graph.demand_of(op), nodes, old_pair))
    return notes


def _sharing_note(op: str, where: Mapping[str, str], why: str) -> str:
    """Which roles share which node, why, and what losing that node costs."""
    on = Counter(where.values())
    node, _ = on.most_common(1)[0]
    roles = [r for r in ROLES if where[r] == node]
    cost = ("its primary and backup together, and with them its state"
            if {PRIMARY, BACKUP} <= set(roles) else f"its {' and '.join(roles)}")
    return (f"operator {op}: {' and '.join(roles)} share node {node} ({why}); "
            f"losing {node} takes {cost}")


def _why_shared(demand: Resources, nodes: Sequence[Node], old_pair: bool) -> str:
    """Too few nodes, too few that can hold a member, a pair placed so earlier, or no room."""
    able = [n for n in nodes if demand.fits_in(n.capacity)]
    if len(nodes) < len(ROLES):
        return f"the cluster has only {len(nodes)} live node{'' if len(nodes) == 1 else 's'}"
    if len(able) < len(ROLES):
        return f"only {len(able)} of {len(nodes)} live nodes can hold one"
    if old_pair:
        return ("placed together earlier, when no other node could hold one, and a running "
                "primary or backup is not moved: they part at the next failover")
    return "the other nodes had no room left"


def _keys(graph: StatefulGraph, roles: Mapping[str, Mapping[str, str]]) -> list[str]:
    return [roles[op][r] for op in graph.operators for r in ROLES]


def plan_member_groups(placement: GraphPlacement, graph: StatefulGraph,
                       nodes: Sequence[Node]) -> list[GroupPlan]:
    """One Ray placement group per operator, bundle i for its members in role order (primary,
    backup, spare): STRICT_SPREAD when enough nodes could each hold one, else SPREAD with a note.
    A group with a member ``placement`` found no room for does not ``fit``: Ray reserves a group
    whole or not at all."""
    plans = []
    for op in graph.operators:
        keys = tuple(placement.roles[op][r] for r in ROLES)
        bundles = (graph.demand_of(op),) * len(keys)
        fits = not any(k in placement.unplaced for k in keys)
        if holds_strictly(bundles, nodes):
            plans.append(GroupPlan(f"{op}/members", STRICT_SPREAD, keys, bundles, False,
                                   fits=fits))
            continue
        able = sum(bundles[0].fits_in(n.capacity) for n in nodes)
        plans.append(GroupPlan(f"{op}/members", SPREAD, keys, bundles, False, (
            f"operator {op}: 3 members but only {able} of {len(nodes)} nodes can hold one; "
            f"SPREAD instead of STRICT_SPREAD, so one node's loss may take more than one of "
            f"them"), fits))
    return plans
