"""One new graph member's node given the running members' nodes, and its state link
(``core/hams/member_nodes.py``, issue 41): pure, no Ray."""

from __future__ import annotations

import pytest

from parityserve.core.hams.member_nodes import (
    RunningMember,
    members_to_renew,
    place_member,
    state_link,
    usable_nodes,
)
from parityserve.core.hams.placement import StatefulGraph
from parityserve.core.placement import Node, Resources

GRAPH = StatefulGraph.chain(["seq1", "seq2"], {"seq1": Resources(cpu=1), "seq2": Resources(cpu=1)})


def nodes(n: int, cpu: float = 4) -> list[Node]:
    return [Node(f"n{i}", Resources(cpu=cpu)) for i in range(n)]


def launch_all(alive: list[Node]) -> dict[str, RunningMember]:
    """The runtime's start: each operator's primary, backup and spare, one after another."""
    running: dict[str, RunningMember] = {}
    for op in GRAPH.operators:
        for role in ("primary", "backup", "spare"):
            spot = place_member(GRAPH, op, f"{op}/{role}", role, running, alive)
            assert spot.node is not None
            running[f"{op}/{role}"] = RunningMember(op, role, spot.node)
    return running


def nodes_of(running: dict[str, RunningMember], op: str) -> list[str]:
    return [m.node for m in running.values() if m.op == op]


def test_each_operators_members_start_on_three_distinct_nodes() -> None:
    running = launch_all(nodes(3))
    for op in GRAPH.operators:
        assert len(set(nodes_of(running, op))) == 3, running


def test_the_correlated_pair_is_kept_apart_when_a_fourth_node_allows_it() -> None:
    running = launch_all(nodes(4))
    assert running["seq1/primary"].node != running["seq2/backup"].node, running


def test_a_replacement_goes_to_a_node_holding_none_of_its_operators_members() -> None:
    running = launch_all(nodes(4))
    lost = running.pop("seq1/primary").node  # its node is gone
    alive = [n for n in nodes(4) if n.node_id != lost]
    running = {k: m for k, m in running.items() if m.node != lost}
    spot = place_member(GRAPH, "seq1", "seq1/spare2", "spare", running, alive)
    assert spot.note is None
    assert spot.node not in nodes_of(running, "seq1")


def test_a_suspect_node_still_reported_alive_is_the_last_choice() -> None:
    """Ray lists a crashed machine as alive until its health checks give up."""
    running = launch_all(nodes(4))
    lost = running.pop("seq1/primary").node
    free = next(n.node_id for n in nodes(4) if n.node_id not in nodes_of(running, "seq1")
                and n.node_id != lost)
    spot = place_member(GRAPH, "seq1", "seq1/new", "spare",
                        {k: m for k, m in running.items() if m.node != lost}, nodes(4),
                        suspect={lost})
    assert spot.node == free
    # with no other node, the suspect one is used rather than none
    only = place_member(GRAPH, "seq1", "x", "spare", {}, [nodes(1)[0]], suspect={"n0"})
    assert only.node == "n0"


def test_too_few_nodes_place_as_apart_as_possible_and_say_so() -> None:
    alive = nodes(2)
    running = {"seq1/primary": RunningMember("seq1", "primary", "n0"),
               "seq1/backup": RunningMember("seq1", "backup", "n1")}
    spot = place_member(GRAPH, "seq1", "seq1/spare", "spare", running, alive)
    assert spot.node in ("n0", "n1")
    assert spot.note is not None and "only 2 usable live nodes" in spot.note
    assert "seq1/spare" in spot.note


def test_no_room_anywhere_leaves_it_to_ray_with_a_note() -> None:
    spot = place_member(GRAPH, "seq1", "seq1/primary", "primary", {}, nodes(3, cpu=0.5))
    assert spot.node is None and spot.note is not None and "no live node" in spot.note


@pytest.mark.parametrize(("node", "others", "link"), [
    ("a", ["a", "a"], "unix"),  # the whole operator on one node (a one-node cluster)
    ("a", [], "tcp"),  # no running peer: the next one may be placed on another node
    ("b", ["a"], "tcp"),  # a backup apart from its primary
    ("c", ["a", "b"], "tcp"),  # a spare: either survivor may be its primary later
    ("a", ["a", "b"], "tcp"),
    ("a", ["a", None], "tcp"),  # a member whose node Ray has not said yet
    (None, [], "tcp"),  # left to Ray's scheduler: node unknown
], ids=["all-on-one", "alone", "apart", "spare-apart", "one-elsewhere", "unknown-other",
        "unknown-self"])
def test_state_link_is_unix_only_when_the_whole_operator_shares_a_node(node, others, link
                                                                      ) -> None:
    assert state_link(node, others) == link


def shared_on_two() -> dict[str, RunningMember]:
    """After two nodes of four were lost: every operator on the two left, each spare sharing."""
    return {"seq1/p": RunningMember("seq1", "primary", "n0"),
            "seq1/b": RunningMember("seq1", "backup", "n1"),
            "seq1/s": RunningMember("seq1", "spare", "n1"),
            "seq2/p": RunningMember("seq2", "primary", "n1"),
            "seq2/b": RunningMember("seq2", "backup", "n0"),
            "seq2/s": RunningMember("seq2", "spare", "n0")}


def test_a_node_that_joins_gets_new_spares_for_operators_whose_spare_shares() -> None:
    running = shared_on_two()
    assert members_to_renew(GRAPH, running, nodes(2)) == {}  # nowhere better: none moves
    assert members_to_renew(GRAPH, running, nodes(3)) == {"seq1": "seq1/s", "seq2": "seq2/s"}
    # and the replacement the plan starts then lands on the new node
    rest = {k: m for k, m in running.items() if k != "seq1/s"}
    assert place_member(GRAPH, "seq1", "seq1/new", "backup", rest, nodes(3)).node == "n2"


def test_members_already_apart_keep_their_spares() -> None:
    running = launch_all(nodes(3))
    assert members_to_renew(GRAPH, running, nodes(4)) == {}


def test_a_joined_node_that_is_suspect_or_full_takes_no_spare() -> None:
    running = shared_on_two()
    assert members_to_renew(GRAPH, running, nodes(3), suspect={"n2"}) == {}
    full = [*nodes(2), Node("n2", Resources(cpu=0.5))]
    assert members_to_renew(GRAPH, running, full) == {}


def test_a_backup_beside_its_primary_is_retired_when_the_spare_is_apart() -> None:
    """The state on one machine (the quick hams_nodes run whose graph broke): the backup
    goes, the spare on n1 becomes the backup, whether or not a third node has room."""
    running = {"seq1/p": RunningMember("seq1", "primary", "n0"),
               "seq1/b": RunningMember("seq1", "backup", "n0"),
               "seq1/s": RunningMember("seq1", "spare", "n1")}
    assert members_to_renew(GRAPH, running, nodes(3)) == {"seq1": "seq1/b"}
    assert members_to_renew(GRAPH, running, nodes(2)) == {"seq1": "seq1/b"}


def test_all_three_on_one_node_move_the_spare_first_then_the_backup() -> None:
    running = {"seq1/p": RunningMember("seq1", "primary", "n0"),
               "seq1/b": RunningMember("seq1", "backup", "n0"),
               "seq1/s": RunningMember("seq1", "spare", "n0")}
    assert members_to_renew(GRAPH, running, nodes(3)) == {"seq1": "seq1/s"}
    rest = {k: m for k, m in running.items() if k != "seq1/s"}
    spot = place_member(GRAPH, "seq1", "seq1/s2", "spare", rest, nodes(3))
    assert spot.node != "n0"
    rest["seq1/s2"] = RunningMember("seq1", "spare", spot.node)  # type: ignore[arg-type]
    assert members_to_renew(GRAPH, rest, nodes(3)) == {"seq1": "seq1/b"}


def test_a_primary_is_never_retired() -> None:
    running = {"seq1/p": RunningMember("seq1", "primary", "n0"),
               "seq1/b": RunningMember("seq1", "backup", "n1"),
               "seq1/s": RunningMember("seq1", "spare", "n1")}
    renewed = members_to_renew(GRAPH, running, nodes(3))
    assert renewed == {"seq1": "seq1/s"}  # the spare sharing with the backup, not p


def test_usable_nodes_leave_out_what_replicas_hold_but_count_our_own_members() -> None:
    """Ray says n0 has 0 CPUs free: replicas took 3, our seq1 primary 1. The primary's CPU
    is ours (the rule counts it as fixed), the replicas' is not."""
    alive = nodes(2)
    running = {"seq1/primary": RunningMember("seq1", "primary", "n0")}
    usable = usable_nodes(GRAPH, alive, {"n0": Resources(cpu=0), "n1": Resources(cpu=4)},
                          running)
    assert [(n.node_id, n.capacity.cpu) for n in usable] == [("n0", 1), ("n1", 4)]
    # never more than the node's total, and a node with no free figure keeps its total
    assert usable_nodes(GRAPH, alive, {"n0": Resources(cpu=9)}, running)[0].capacity.cpu == 4
    assert usable_nodes(GRAPH, alive, {}, running) == alive


def test_a_node_full_of_replicas_takes_no_member_though_its_total_has_room() -> None:
    """Before, placement read nodes' totals: n0 (4 CPUs, every one held by replicas) looked
    empty and got the spare, which then waited in Ray's queue for good."""
    alive = nodes(4)
    running = {"seq1/primary": RunningMember("seq1", "primary", "n1"),
               "seq1/backup": RunningMember("seq1", "backup", "n2")}
    free = {"n0": Resources(cpu=0), "n1": Resources(cpu=3), "n2": Resources(cpu=3),
            "n3": Resources(cpu=4)}
    spot = place_member(GRAPH, "seq1", "seq1/spare", "spare", running,
                        usable_nodes(GRAPH, alive, free, running))
    assert spot.node == "n3", spot
    free["n3"] = Resources(cpu=0.5)  # the only node apart is full too: share, and say so
    spot = place_member(GRAPH, "seq1", "seq1/spare", "spare", running,
                        usable_nodes(GRAPH, alive, free, running))
    assert spot.node in ("n1", "n2") and spot.note is not None, spot
