"""Where a stateful graph's primary, backup and spare run (issue 41's placement rule): the named
cases, then a state machine that adds, kills (one, two in a row, two at once) and returns nodes
and checks the rule after every step."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from parityserve.core.hams.placement import (
    BACKUP,
    PRIMARY,
    ROLES,
    SPARE,
    GraphPlacement,
    StatefulGraph,
    correlated,
    place_graph,
    plan_member_groups,
    replan,
)
from parityserve.core.hams.topology import Topology
from parityserve.core.placement import SPREAD, STRICT_SPREAD, Node, Resources, place
from parityserve.core.placement import Member as Replica

ONE = Resources(cpu=1)
CHAIN = StatefulGraph.chain(["a", "b", "c"], {op: ONE for op in "abc"})


def nodes(*ids: str, cpu: float = 16) -> list[Node]:
    return [Node(i, Resources(cpu=cpu)) for i in ids]


def layout(p: GraphPlacement, op: str) -> dict[str, str | None]:
    return {r: p.node_of(op, r) for r in ROLES}


def shared_correlated(p: GraphPlacement, graph: StatefulGraph) -> list[tuple[str, str]]:
    return [(a, b) for a, b in correlated(graph, p.roles) if p.nodes[a] == p.nodes[b]]


def test_public_names() -> None:
    from parityserve.core.hams import placement

    assert sorted(placement.__all__) == [
        "BACKUP", "GraphPlacement", "PRIMARY", "ROLES", "SPARE", "StatefulGraph", "correlated",
        "place_graph", "plan_member_groups", "replan"]


# -- first placement ------------------------------------------------------------------------

@pytest.mark.parametrize("count", [3, 4, 7])
def test_three_nodes_or_more_put_each_operator_on_three_distinct_nodes(count: int) -> None:
    p = place_graph(CHAIN, nodes(*(f"n{i}" for i in range(count))))
    for op in CHAIN.operators:
        assert len(set(layout(p, op).values())) == 3
    assert p.notes == {} and p.unplaced == {}
    assert sorted(p.started) == sorted(f"{op}/{i}" for op in "abc" for i in (1, 2, 3))


def test_two_nodes_keep_primary_and_backup_apart_and_say_the_spare_shares() -> None:
    p = place_graph(CHAIN, nodes("n1", "n2"))
    for op in CHAIN.operators:
        where = layout(p, op)
        assert where[PRIMARY] != where[BACKUP]
        assert where[SPARE] in (where[PRIMARY], where[BACKUP])
        assert p.notes[op].startswith(f"operator {op}: ")
        assert "spare share node" in p.notes[op]
        assert "the cluster has only 2 live nodes" in p.notes[op]


def test_one_node_says_losing_it_takes_the_state() -> None:
    p = place_graph(StatefulGraph.chain(["a"]), nodes("n1"))
    assert p.notes["a"] == ("operator a: primary and backup and spare share node n1 (the cluster "
                            "has only 1 live node); losing n1 takes its primary and backup "
                            "together, and with them its state")


def test_nodes_too_small_for_a_member_count_as_missing() -> None:
    graph = StatefulGraph.chain(["a"], {"a": Resources(cpu=4)})
    p = place_graph(graph, [*nodes("big1", "big2", cpu=8), *nodes("small", cpu=2)])
    where = layout(p, "a")
    assert where[PRIMARY] != where[BACKUP] and "small" not in where.values()
    assert "only 2 of 3 live nodes can hold one" in p.notes["a"]


def test_no_room_for_a_member_is_a_note_with_the_reason() -> None:
    graph = StatefulGraph.chain(["a"], {"a": Resources(cpu=4)})
    p = place_graph(graph, nodes("n1", "n2", cpu=4))
    assert set(p.unplaced) == {p.roles["a"][SPARE]}
    assert p.notes["a"].startswith("operator a: no node for its spare (no node has 4 CPU")
    assert p.roles["a"][SPARE] not in p.started


# -- across operators (HAMS Fig. 6) -----------------------------------------------------------

@pytest.mark.parametrize("count", [2, 3, 4, 5])
@pytest.mark.parametrize("length", [2, 3, 5])
def test_no_node_holds_a_primary_and_the_next_operators_backup(count: int, length: int) -> None:
    graph = StatefulGraph.chain([f"op{i}" for i in range(length)],
                                {f"op{i}": ONE for i in range(length)})
    p = place_graph(graph, nodes(*(f"n{i}" for i in range(count))))
    assert shared_correlated(p, graph) == []


def test_the_correlated_pair_never_costs_an_operators_own_spread() -> None:
    """A join on two nodes: c's backup must avoid both a's and b's primaries, which cover both
    nodes. It shares with one of them rather than with its own primary."""
    graph = StatefulGraph(("a", "b", "c"), {"a": ("c",), "b": ("c",)})
    p = place_graph(graph, nodes("n1", "n2"))
    assert {p.node_of("a", PRIMARY), p.node_of("b", PRIMARY)} == {"n1", "n2"}
    for op in graph.operators:
        assert p.node_of(op, PRIMARY) != p.node_of(op, BACKUP)


def test_core_place_prefers_nodes_without_the_members_to_keep_apart() -> None:
    members = [Replica("x", "m", ONE, "gx"), Replica("y", "m", ONE, "gy")]
    apart = {"y": {"x"}, "x": {"y"}}
    assert place(members, nodes("n1", "n2"), {"x": "n1"}, apart=apart).nodes["y"] == "n2"
    assert place(members, nodes("n1"), apart=apart).nodes == {"x": "n1", "y": "n1"}


def test_downstream_comes_from_the_topology_without_the_frontend() -> None:
    topo = Topology.build(["a", "f", "b"], [("frontend", "a"), ("a", "f"), ("f", "b"),
                                            ("b", "frontend")], stateful=["a", "b"])
    graph = StatefulGraph.of(topo)
    assert graph.operators == ("a", "b")
    assert dict(graph.downstream) == {"a": ("b",), "b": ()}


# -- after a loss ---------------------------------------------------------------------------

def lose(p: GraphPlacement, dead: str, live: list[str]) -> GraphPlacement:
    return replan(p, CHAIN, nodes(*[n for n in live if n != dead]))


FOUR = ["n1", "n2", "n3", "n4"]


@pytest.mark.parametrize("role", ROLES)
def test_losing_a_members_node_moves_nothing_else_and_promotes_by_rank(role: str) -> None:
    p = place_graph(CHAIN, nodes(*FOUR))
    dead = p.node_of("a", role)
    assert dead is not None
    q = lose(p, dead, FOUR)
    old = p.roles["a"]
    expected = {PRIMARY: (old[BACKUP], old[SPARE]), BACKUP: (old[PRIMARY], old[SPARE]),
                SPARE: (old[PRIMARY], old[BACKUP])}[role]
    assert (q.roles["a"][PRIMARY], q.roles["a"][BACKUP]) == expected
    new_spare = q.roles["a"][SPARE]
    assert new_spare == "a/4" and new_spare in q.started
    assert q.nodes[new_spare] not in {q.node_of("a", PRIMARY), q.node_of("a", BACKUP)}
    assert all(q.nodes[k] == n for k, n in p.nodes.items() if n != dead)
    assert q.notes == {} and q.stateless == () and q.retired == ()


def test_losing_primary_and_backup_together_hands_the_primary_role_to_the_spare() -> None:
    p = place_graph(CHAIN, nodes(*FOUR))
    gone = {p.node_of("a", PRIMARY), p.node_of("a", BACKUP)}
    q = replan(p, CHAIN, nodes(*[n for n in FOUR if n not in gone]))
    assert q.roles["a"][PRIMARY] == p.roles["a"][SPARE]
    assert "a" in q.stateless
    assert q.node_of("a", PRIMARY) != q.node_of("a", BACKUP)


def test_too_few_nodes_after_a_loss_share_as_apart_as_possible_with_a_note() -> None:
    p = place_graph(CHAIN, nodes("n1", "n2", "n3"))
    q = lose(p, "n3", ["n1", "n2", "n3"])
    for op in CHAIN.operators:
        assert q.node_of(op, PRIMARY) != q.node_of(op, BACKUP)
        assert "the cluster has only 2 live nodes" in q.notes[op]


def test_a_node_that_comes_back_gets_new_spares_only() -> None:
    p = place_graph(CHAIN, nodes("n1", "n2", "n3"))
    q = lose(p, "n3", ["n1", "n2", "n3"])
    r = replan(q, CHAIN, nodes("n1", "n2", "n3"))
    on_n3 = [k for k, n in r.nodes.items() if n == "n3"]
    assert on_n3 and all(k in r.started for k in on_n3)
    assert all(k == r.roles[k.split("/")[0]][SPARE] for k in on_n3)
    assert sorted(r.retired) == sorted(q.roles[op][SPARE] for op in CHAIN.operators)
    assert r.notes == {}
    assert all(r.nodes[k] == q.nodes[k] for k in q.nodes if k not in r.retired)


def test_a_node_that_bounced_before_its_loss_was_seen_keeps_none_of_its_members() -> None:
    p = place_graph(CHAIN, nodes("n1", "n2", "n3", "n4"))
    was = {k for k, n in p.nodes.items() if n == "n2"}
    q = replan(p, CHAIN, nodes("n1", "n2", "n3", "n4"), lost={"n2"})
    assert was and not was & set(q.nodes)
    assert all(k in q.started for k, n in q.nodes.items() if n == "n2")


def test_primary_and_backup_that_share_a_node_stay_and_say_when_they_part() -> None:
    p = place_graph(StatefulGraph.chain(["a"]), nodes("n1", "n2", "n3"))
    survivor = p.node_of("a", PRIMARY)
    assert survivor is not None
    q = replan(p, StatefulGraph.chain(["a"]), nodes(survivor))
    r = replan(q, StatefulGraph.chain(["a"]), nodes(survivor, "back1", "back2"))
    assert r.node_of("a", PRIMARY) == r.node_of("a", BACKUP) == survivor
    assert r.node_of("a", SPARE) in {"back1", "back2"}
    assert "they part at the next failover" in r.notes["a"]


# -- Ray placement groups -------------------------------------------------------------------

def test_placement_groups_are_strict_spread_when_three_nodes_can_hold_one() -> None:
    p = place_graph(CHAIN, nodes("n1", "n2", "n3"))
    plans = plan_member_groups(p, CHAIN, nodes("n1", "n2", "n3"))
    assert [(g.name, g.strategy, g.note, g.fits) for g in plans] == [
        (f"{op}/members", STRICT_SPREAD, "", True) for op in CHAIN.operators]
    assert plans[0].members == tuple(p.roles["a"][r] for r in ROLES)
    assert plans[0].bundles == (ONE, ONE, ONE)


def test_placement_groups_spread_with_a_note_on_too_few_nodes() -> None:
    p = place_graph(CHAIN, nodes("n1", "n2"))
    plan = plan_member_groups(p, CHAIN, nodes("n1", "n2"))[0]
    assert plan.strategy == SPREAD and plan.fits
    assert plan.note == ("operator a: 3 members but only 2 of 2 nodes can hold one; SPREAD "
                         "instead of STRICT_SPREAD, so one node's loss may take more than one "
                         "of them")


def test_a_placement_group_with_an_unplaced_member_does_not_fit() -> None:
    graph = StatefulGraph.chain(["a"], {"a": Resources(cpu=4)})
    p = place_graph(graph, nodes("n1", "n2", cpu=4))
    assert not plan_member_groups(p, graph, nodes("n1", "n2", cpu=4))[0].fits


# -- the state machine ----------------------------------------------------------------------

class GraphPlacementMachine(RuleBasedStateMachine):
    """Live and dead nodes, the placement after every change, and the rule checked each time.

    ``may_share``: the operators whose primary and backup were placed together when fewer than
    two nodes were live. Running stateful members never move, so they stay together (with a
    note) until one of them dies; an operator leaves the set once they are apart again."""

    graph: StatefulGraph
    live: list[str]
    dead: list[str]
    p: GraphPlacement

    @initialize(count=st.integers(1, 5), ops=st.integers(1, 4))
    def start(self, count: int, ops: int) -> None:
        self.graph = StatefulGraph.chain([f"op{i}" for i in range(ops)],
                                         {f"op{i}": ONE for i in range(ops)})
        self.live, self.dead, self.serial = [f"n{i}" for i in range(count)], [], count
        self.returned: dict[str, set[str]] = {}  # node -> member keys that existed at its return
        self.may_share: set[str] = set()
        self.p = GraphPlacement()
        self.apply(place_graph(self.graph, nodes(*self.live)), lost=set())

    def apply(self, new: GraphPlacement, lost: set[str]) -> None:
        """Check the step from ``self.p`` (or nothing) to ``new``, then keep it."""
        self.prev, self.p = self.p, new
        if len(self.live) < 2:
            self.may_share |= set(self.graph.operators)
        self.check_step(lost)

    def replan(self, lost: set[str] | None = None) -> None:
        self.apply(replan(self.p, self.graph, nodes(*self.live), lost or set()), lost or set())

    @rule()
    def add_node(self) -> None:
        self.live.append(f"n{self.serial}")
        self.serial += 1
        self.replan()

    @precondition(lambda self: len(self.live) >= 2)
    @rule(data=st.data())
    def kill_one(self, data: st.DataObject) -> None:
        self.kill(data.draw(st.sampled_from(self.live)))
        self.replan()

    @precondition(lambda self: len(self.live) >= 3)
    @rule(data=st.data(), at_once=st.booleans())
    def kill_two(self, data: st.DataObject, at_once: bool) -> None:
        """Two in a row: each loss folded in before the next, or both in one replan (the
        second came before the first's recovery was planned)."""
        first, second = data.draw(st.lists(st.sampled_from(self.live), min_size=2, max_size=2,
                                           unique=True))
        self.kill(first)
        if not at_once:
            self.replan()
        self.kill(second)
        self.replan()

    @precondition(lambda self: bool(self.dead))
    @rule(data=st.data())
    def bring_back(self, data: st.DataObject) -> None:
        node = data.draw(st.sampled_from(self.dead))
        self.dead.remove(node)
        self.live.append(node)
        self.returned[node] = set(self.p.nodes)
        self.replan()

    @precondition(lambda self: len(self.live) >= 2)
    @rule(data=st.data())
    def bounce(self, data: st.DataObject) -> None:
        """A node lost and back before the loss was folded in: named in ``lost``."""
        node = data.draw(st.sampled_from(self.live))
        self.returned[node] = set(self.p.nodes)
        self.replan(lost={node})

    def kill(self, node: str) -> None:
        self.live.remove(node)
        self.dead.append(node)

    # -- the rule, after every step --

    def check_step(self, lost: set[str]) -> None:
        prev, p, live = self.prev, self.p, set(self.live) - lost
        for k, n in prev.nodes.items():
            if n in live and k in p.nodes:
                assert p.nodes[k] == n, f"{k} moved from {n} to {p.nodes[k]}"
        stateful = {prev.roles[op][r] for op in prev.roles for r in (PRIMARY, BACKUP)}
        for k, n in prev.nodes.items():
            if n in live and k not in p.nodes:
                assert k not in stateful, f"running {k} on live {n} was dropped"
                assert k in p.retired
        assert set(p.retired) <= {k for k, n in prev.nodes.items() if n in live}
        assert set(p.started) == {k for k in p.nodes if k not in prev.nodes}
        assert set(p.stateless) == {
            op for op in prev.roles
            if all(prev.nodes.get(prev.roles[op][r]) not in live for r in (PRIMARY, BACKUP))}

    @invariant()
    def every_role_once_on_a_live_node(self) -> None:
        p = self.p
        assert set(p.roles) == set(self.graph.operators)
        for op in self.graph.operators:
            keys = [p.roles[op][r] for r in ROLES]
            assert len(set(keys)) == 3
            assert all(p.nodes[k] in self.live for k in keys)
        assert set(p.nodes) == {k for r in p.roles.values() for k in r.values()}
        assert p.unplaced == {}

    @invariant()
    def members_apart_whenever_the_live_nodes_allow(self) -> None:
        for op in self.graph.operators:
            where = layout(self.p, op)
            pair = {where[PRIMARY], where[BACKUP]}
            if len(pair) == 2:
                self.may_share.discard(op)
            assert len(pair) == 2 or op in self.may_share, f"{op}'s primary and backup: {where}"
            if len(self.live) > len(pair):
                assert where[SPARE] not in pair, f"{op}'s spare shares a node: {where}"

    @invariant()
    def notes_exactly_when_the_spread_is_not_met(self) -> None:
        for op in self.graph.operators:
            distinct = len(set(layout(self.p, op).values())) == 3
            assert (op in self.p.notes) != distinct, (op, self.p.notes)
            if not distinct:
                assert self.p.notes[op].startswith(f"operator {op}: ")

    @invariant()
    def a_returned_node_holds_no_old_member(self) -> None:
        for node, existing in self.returned.items():
            on = {k for k, n in self.p.nodes.items() if n == node}
            assert not on & existing, f"{node} came back holding {on & existing}"


GraphPlacementMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=30, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow])
TestGraphPlacementMachine = GraphPlacementMachine.TestCase
