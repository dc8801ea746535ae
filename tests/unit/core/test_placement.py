"""Placement across nodes (core/placement.py): tables of clusters and deployments, and the
properties ParM and ApproxIFER rely on, checked by hypothesis."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parityserve.core.placement import (
    SPREAD,
    STRICT_SPREAD,
    Member,
    Node,
    Placement,
    Resources,
    coding_groups,
    erasures,
    holds_strictly,
    place,
    plan_groups,
    replace_after_failure,
)

CPU1 = Resources(cpu=1)


def nodes(*cpus: float) -> list[Node]:
    return [Node(f"n{i}", Resources(cpu=c, memory=2**30)) for i, c in enumerate(cpus)]


def parm_members(model: str, k: int, groups: int, demand: Resources = CPU1) -> list[Member]:
    """ParM with one parity model: ``groups`` groups of k data replicas plus one parity."""
    out = []
    for g, slots in enumerate(coding_groups(k * groups, k, parity_pools=1)):
        out += [Member(f"{model}/{pool}-{i}", model, demand, f"{model}/g{g}")
                for pool, i in slots]
    return out


def plain_members(model: str, n: int, demand: Resources = CPU1) -> list[Member]:
    return [Member(f"{model}/{i}", model, demand) for i in range(n)]


def used(placement: Placement, members: list[Member]) -> dict[str, Resources]:
    total: dict[str, Resources] = {}
    for m in members:
        node = placement.nodes.get(m.key)
        if node is not None:
            total[node] = total.get(node, Resources()) + m.demand
    return total


def max_per_group(placement: Placement, members: list[Member]) -> int:
    on = Counter((m.group, placement.nodes[m.key]) for m in members
                 if m.group and m.key in placement.nodes)
    return max(on.values(), default=0)


# ---- coding groups over slots ---------------------------------------------------------------
@pytest.mark.parametrize(("data", "size", "pools", "expected"), [
    (2, 2, 1, [[("data", 0), ("data", 1), ("parity0", 0)]]),
    (3, 2, 1, [[("data", 0), ("data", 1), ("parity0", 0)], [("data", 2), ("parity0", 1)]]),
    (4, 2, 2, [[("data", 0), ("data", 1), ("parity0", 0), ("parity1", 0)],
               [("data", 2), ("data", 3), ("parity0", 1), ("parity1", 1)]]),
    (5, 5, 0, [[("data", i) for i in range(5)]]),  # one Berrut group of 5 workers
    (3, 1, 0, []),  # no coding: no groups
])
def test_coding_groups_partition_slots(data: int, size: int, pools: int,
                                       expected: list[list[tuple[str, int]]]) -> None:
    assert coding_groups(data, size, pools) == expected


# ---- tables ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("cpus", "members", "max_collide", "notes"), [
    # ParM k=2 on 3 nodes: the group takes three distinct nodes.
    ((2, 2, 2), parm_members("m", 2, 1), 1, 0),
    # two groups on 3 nodes with room: both distinct.
    ((2, 2, 2), parm_members("m", 2, 2), 1, 0),
    # 2 nodes for a 3-member group: the fewest collisions (two on one node), with a note.
    ((4, 4), parm_members("m", 2, 1), 2, 1),
    # 3 nodes, but one is full: the group must share, and the note says why.
    ((2, 2, 0), parm_members("m", 2, 1), 2, 1),
])
def test_groups_on_distinct_nodes_or_fewest_collisions(
        cpus: tuple[float, ...], members: list[Member], max_collide: int, notes: int) -> None:
    placement = place(members, nodes(*cpus))
    assert not placement.unplaced
    assert max_per_group(placement, members) == max_collide
    assert len(placement.notes) == notes


def test_collision_note_names_the_group_and_the_reason() -> None:
    placement = place(parm_members("m", 2, 1), nodes(4, 4))
    (note,) = placement.notes
    assert "coding group m/g0" in note and "only 2 nodes" in note and "erases 2" in note
    (note,) = place(parm_members("m", 2, 1), nodes(2, 2, 0)).notes
    assert "no room" in note


def test_replicas_of_a_model_spread_across_nodes() -> None:
    members = plain_members("a", 3) + plain_members("b", 3)
    placement = place(members, nodes(4, 4, 4))
    for model in "ab":
        on = {placement.nodes[m.key] for m in members if m.model == model}
        assert on == {"n0", "n1", "n2"}


def test_no_room_is_unplaced_with_the_reason() -> None:
    members = plain_members("a", 3, Resources(cpu=2))
    placement = place(members, nodes(2, 3))
    assert len(placement.nodes) == 2
    (why,) = placement.unplaced.values()
    assert "no node has 2 CPU" in why and "1 CPU" in why


def test_gpu_and_memory_are_resources_too() -> None:
    gpu_node = Node("g", Resources(cpu=8, gpu=1, memory=2**34))
    cpu_node = Node("c", Resources(cpu=8, memory=2**34))
    members = [Member("a/0", "a", Resources(cpu=1, gpu=1)), Member("a/1", "a", Resources(cpu=1,
               gpu=1)), Member("b/0", "b", Resources(cpu=1, memory=2**35))]
    placement = place(members, [cpu_node, gpu_node])
    assert placement.nodes == {"a/0": "g"}
    assert set(placement.unplaced) == {"a/1", "b/0"}


def test_no_live_node() -> None:
    placement = place(plain_members("a", 1), [])
    assert placement.unplaced == {"a/0": "no live node in the cluster"}


def test_fixed_members_keep_their_node_and_use_its_room() -> None:
    members = plain_members("a", 2)
    placement = place(members, nodes(1, 1), fixed={"a/0": "n1"})
    assert placement.nodes == {"a/0": "n1", "a/1": "n0"}


def test_a_replacement_avoids_its_predecessors_node_while_another_has_room() -> None:
    members = plain_members("a", 2)
    cluster = nodes(2, 2)
    assert place(members, cluster, {"a/0": "n0"}, avoid={"a/1": "n0"}).nodes["a/1"] == "n1"
    assert place(members, cluster, {"a/0": "n1"}, avoid={"a/1": "n1"}).nodes["a/1"] == "n0"
    # no other node has room: the avoided one is still better than none
    assert place(members, nodes(2, 0), {"a/0": "n0"}, avoid={"a/1": "n0"}).nodes["a/1"] == "n0"


def test_node_failure_moves_only_its_members() -> None:
    members = parm_members("m", 2, 1) + plain_members("p", 2)
    cluster = nodes(3, 3, 3)
    before = place(members, cluster)
    dead = before.nodes["m/data-0"]
    alive = [n for n in cluster if n.node_id != dead]
    after = replace_after_failure(before, members, alive)
    assert not after.unplaced
    for key, node in before.nodes.items():
        if node != dead:
            assert after.nodes[key] == node  # survivors are not restarted
        else:
            assert after.nodes[key] != dead
    assert erasures(before, members, dead) == {"m/g0": 1}
    # two nodes left for a three-member group: it now shares one, and says so
    assert after.notes and max_per_group(after, members) == 2


# ---- placement groups (Ray) -------------------------------------------------------------------
@pytest.mark.parametrize(("cpus", "members", "expected"), [
    # (name, strategy, bundles, fits) per plan
    # a ParM k=2 group on 3 nodes: STRICT_SPREAD; a plain model: one SPREAD group
    ((3, 3, 3), parm_members("p", 2, 1) + plain_members("q", 2),
     [("p/g0", STRICT_SPREAD, 3, True), ("q/spread", SPREAD, 2, True)]),
    # two nodes for a group of three: SPREAD, with a note
    ((3, 3), parm_members("p", 2, 1), [("p/g0", SPREAD, 3, True)]),
    # three nodes, one too small for a 2-CPU member: SPREAD, and two nodes of room do not fit it
    ((2, 2, 1), parm_members("p", 2, 1, Resources(cpu=2)), [("p/g0", SPREAD, 3, False)]),
    ((4, 2, 1), parm_members("p", 2, 1, Resources(cpu=2)), [("p/g0", SPREAD, 3, True)]),
    # two groups of one model: a plan each; k=4 groups need 5 nodes
    ((2,) * 5, parm_members("p", 4, 2),
     [("p/g0", STRICT_SPREAD, 5, True), ("p/g1", STRICT_SPREAD, 5, True)]),
    ((8,) * 4, parm_members("p", 4, 1), [("p/g0", SPREAD, 5, True)]),
    # 7 replicas, room for 6: no group (Ray would hold back all 7), a note says why
    ((3, 3), plain_members("q", 7), [("q/spread", SPREAD, 7, False)]),
])
def test_plan_groups(cpus: tuple[float, ...], members: list[Member],
                     expected: list[tuple[str, str, int, bool]]) -> None:
    plans = plan_groups(members, nodes(*cpus))
    assert [(p.name, p.strategy, len(p.bundles), p.fits) for p in plans] == expected
    for plan in plans:
        assert bool(plan.note) == (not plan.fits or plan.coding and plan.strategy == SPREAD)


def test_a_spread_coding_group_says_why_and_what_it_risks() -> None:
    (plan,) = plan_groups(parm_members("p", 2, 1), nodes(3, 3))
    assert plan.note.startswith("coding group p/g0: 3 members but only 2 of 2 nodes")
    assert "more than one" in plan.note


@pytest.mark.parametrize(("cpus", "bundles", "holds"), [
    ((1, 1, 1), 3, True), ((1, 1), 3, False), ((1, 1, 0.5), 3, False), ((), 1, False),
    ((4,), 1, True),
])
def test_holds_strictly(cpus: tuple[float, ...], bundles: int, holds: bool) -> None:
    assert holds_strictly([CPU1] * bundles, nodes(*cpus)) is holds


# ---- properties -----------------------------------------------------------------------------
@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[Member], list[Node]]:
    """Models with coding groups (sizes 1-4) and nodes, with random demands and capacities."""
    members: list[Member] = []
    for mi in range(draw(st.integers(1, 3))):
        size = draw(st.integers(1, 4))
        for g in range(draw(st.integers(1, 3))):
            for s in range(size):
                demand = Resources(cpu=draw(st.sampled_from([0.5, 1, 2])),
                                   gpu=draw(st.sampled_from([0, 0, 1])))
                members.append(Member(f"m{mi}/g{g}/{s}", f"m{mi}", demand,
                                      f"m{mi}/g{g}" if size > 1 else ""))
    count = draw(st.integers(1, 6))
    cluster = [Node(f"n{i}", Resources(cpu=draw(st.integers(0, 8)), gpu=draw(st.integers(0, 2))))
               for i in range(count)]
    return members, cluster


@settings(max_examples=200, deadline=None)
@given(clusters())
def test_resources_never_exceeded(case: tuple[list[Member], list[Node]]) -> None:
    members, cluster = case
    placement = place(members, cluster)
    capacity = {n.node_id: n.capacity for n in cluster}
    for node, total in used(placement, members).items():
        assert total.fits_in(capacity[node])
    assert set(placement.nodes) | set(placement.unplaced) == {m.key for m in members}
    assert not set(placement.nodes) & set(placement.unplaced)


def roomy(members: list[Member], count: int) -> list[Node]:
    """Nodes that each hold one member of every group: enough, so distinct placement is due."""
    need: dict[str, Resources] = {}
    for m in members:
        prev = need.get(m.group_key, Resources())
        need[m.group_key] = Resources(max(prev.cpu, m.demand.cpu), max(prev.gpu, m.demand.gpu))
    cap = sum(need.values(), Resources())
    return [Node(f"n{i}", cap) for i in range(count)]


@settings(max_examples=200, deadline=None)
@given(clusters(), st.integers(0, 3), st.data())
def test_one_node_failure_erases_at_most_one_member_per_group(
        case: tuple[list[Member], list[Node]], extra: int, data: st.DataObject) -> None:
    members = case[0]
    biggest = max(Counter(m.group_key for m in members).values())
    cluster = roomy(members, biggest + extra)
    placement = place(members, cluster)
    assert not placement.unplaced and not placement.notes
    dead = data.draw(st.sampled_from([n.node_id for n in cluster]))
    assert all(lost <= 1 for lost in erasures(placement, members, dead).values())
    # and after re-placing on the survivors, when they still suffice, it holds again
    alive = [n for n in cluster if n.node_id != dead]
    after = replace_after_failure(placement, members, alive)
    if len(alive) >= biggest:
        assert not after.unplaced and max_per_group(after, members) <= 1
    assert all(after.nodes[k] == n for k, n in placement.nodes.items() if n != dead)


@settings(max_examples=200, deadline=None)
@given(clusters())
def test_placement_groups_cover_every_member_once_with_its_demand(
        case: tuple[list[Member], list[Node]]) -> None:
    members, cluster = case
    plans = plan_groups(members, cluster)
    by_key = {m.key: m for m in members}
    keys = [k for p in plans for k in p.members]
    assert sorted(keys) == sorted(by_key)  # every member in exactly one plan
    for plan in plans:
        assert [by_key[k].demand for k in plan.members] == list(plan.bundles)  # bundle i: member i
        assert len({by_key[k].group_key if plan.coding else by_key[k].model
                    for k in plan.members}) == 1  # one coding group, or one model's others
        # STRICT_SPREAD exactly when enough nodes could each hold a member, so that Ray can
        # always put the group's bundles on distinct nodes of an empty cluster
        strict = plan.fits and plan.coding and holds_strictly(plan.bundles, cluster)
        assert (plan.strategy == STRICT_SPREAD) is strict
        # a plan fits exactly when place() finds room for each of its members
        room = place(members, cluster)
        assert plan.fits == all(k in room.nodes for k in plan.members)
        if strict:
            assert len(members_on_distinct_nodes(plan, cluster)) == len(plan.members)


def members_on_distinct_nodes(plan, cluster: list[Node]) -> dict[str, str]:
    """A witness: bundle i on its own node, each within capacity."""
    free = list(cluster)
    out = {}
    for key, bundle in zip(plan.members, plan.bundles, strict=True):
        node = next(n for n in free if bundle.fits_in(n.capacity))
        free.remove(node)
        out[key] = node.node_id
    return out
