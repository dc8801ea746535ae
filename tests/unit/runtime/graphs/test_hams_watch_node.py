"""A lost machine takes all its members (``Watch._node_loss``): once a Ray member is lost by
its silence, a member on the same node silent past two heartbeat intervals is lost with it,
in the same tick; one that spoke lately, one on another node, one on the frontend's own
host, and any member of a graph with no plan are left to the heartbeat. Pure: a fake graph
context and a recovery driver that records what it is told."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from parityserve.runtime.graphs import hams_watch
from parityserve.runtime.graphs.hams_context import Pair
from parityserve.runtime.graphs.hams_watch import Watch


def _member(name: str, node: str, last_beat: float) -> Any:
    return SimpleNamespace(worker_id=name, last_beat=last_beat, lost=None, pid=1, extra={},
                           hello=SimpleNamespace(done=lambda: True), on_this_host=False,
                           node=node, exited=lambda: False,
                           popen=SimpleNamespace(poll=lambda: None))


class _Recovery:
    def __init__(self) -> None:
        self.suspected: list[str] = []

    def suspect(self, member: Any, why: str) -> None:
        self.suspected.append(member.worker_id)


def _rig(members: dict[str, tuple[str, Any]], *, plan: bool = True) -> tuple[Watch, _Recovery]:
    """Operator ``a`` and ``b``; the heartbeat timeout 200 ms, and nothing in flight."""
    pairs = {op: Pair(op) for op in ("a", "b")}
    ctx = SimpleNamespace(graph=SimpleNamespace(name="g", heartbeat_timeout_ms=200,
                                                data_path_detection=True, detection="timeout"),
                          pairs=pairs, inflight={}, plan=SimpleNamespace(suspects=lambda: ())
                          if plan else None, clock=lambda: 0.0, spawn=lambda c: c.close())
    recovery = _Recovery()
    baselines = SimpleNamespace(recover=lambda *a: _noop())
    watch = Watch(ctx, SimpleNamespace(by_id=members), None, recovery,  # type: ignore[arg-type]
                  baselines)  # type: ignore[arg-type]
    return watch, recovery


async def _noop() -> None:
    return None


def _cluster(now: float) -> dict[str, Any]:
    """Node n1 held a's primary (silent 210 ms: past the timeout) and b's primary (idle,
    silent 120 ms); n2 and n3 hold the others, heard just now."""
    return {"a1": _member("a1", "n1", now - 0.21), "b1": _member("b1", "n1", now - 0.12),
            "a2": _member("a2", "n2", now - 0.01), "b2": _member("b2", "n3", now - 0.02),
            "b3": _member("b3", "n2", now - 0.03)}


def _members(found: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    return {name: (name[0], m) for name, m in found.items()}


def _heard(found: dict[str, Any], at: float) -> None:
    """The members on n2 and n3 speak at ``at`` (they vouch that the frontend hears)."""
    for name in ("a2", "b2", "b3"):
        found[name].last_beat = at


def test_a_silent_node_mate_is_lost_in_the_same_tick_and_says_why() -> None:
    found = _cluster(10.0)
    watch, recovery = _rig(_members(found))
    watch._check("a", found["a1"], 10.0, hearing=True)
    assert recovery.suspected == ["a1", "b1"]  # b1 before the heartbeat's 200 ms
    assert [(x["member"], x["detector"]) for x in watch.losses] == [
        ("a1", "heartbeat"), ("b1", "node")]
    assert found["a2"].lost is None and found["b2"].lost is None  # other nodes: untouched


def test_a_node_mate_heard_lately_is_not_lost_yet_and_lost_if_it_stays_silent() -> None:
    """a1 was lost by the data path at 10.0, its last word at 9.89; b1 spoke at 9.95 (within
    the floor of that: nothing the node did after a1 went quiet)."""
    found = _cluster(10.0)
    found["b1"].last_beat, found["a1"].lost = 9.95, "timeout"
    watch, recovery = _rig(_members(found))
    watch._silent_nodes["n1"] = (10.0, 9.89)
    assert watch._node_loss(found["b1"], 10.0, True) is None  # 50 ms silent: not yet
    _heard(found, 10.06)
    watch._check("b", found["b1"], 10.06, hearing=True)  # 110 ms: past the floor
    assert recovery.suspected == ["b1"] and watch.losses[-1]["detector"] == "node"


def test_a_node_mate_heard_well_after_the_lost_one_shows_the_node_is_up() -> None:
    """a1 went quiet at 9.79 (a hung process, not a lost machine); b1 spoke at 9.95, 160 ms
    later: the node was up after a1 went quiet, so b1's own silence must be its own."""
    found = _cluster(10.0)
    found["b1"].last_beat = 9.95
    watch, recovery = _rig(_members(found))
    watch._check("a", found["a1"], 10.0, hearing=True)
    _heard(found, 10.1)
    watch._check("b", found["b1"], 10.1, hearing=True)  # 150 ms silent: past the floor
    assert recovery.suspected == ["a1"] and "n1" not in watch._silent_nodes


def test_only_a_member_on_another_node_vouches_for_the_frontends_hearing() -> None:
    found = _cluster(10.0)
    for name in ("a2", "b2", "b3"):
        found[name].last_beat = 9.5  # the other nodes quiet: the frontend may be deaf
    found["c1"] = _member("c1", "n1", 9.99)  # a third member on n1, heard 10 ms ago...
    watch, recovery = _rig(_members(found))
    watch._silent_nodes["n1"] = (10.0, 9.99)  # (...and a mark that it does not contradict)
    assert watch._node_loss(found["b1"], 10.0, True) is None  # ...does not vouch for n1


def test_a_kept_suspect_casts_no_suspicion_on_its_node() -> None:
    found = _cluster(10.0)
    watch, recovery = _rig(_members(found))
    watch.ctx.plan = SimpleNamespace(suspects=lambda: ("a1",))  # the last holder: kept
    watch._check("a", found["a1"], 10.0, hearing=True)
    assert watch._silent_nodes == {} and found["b1"].lost is None


def test_a_silent_member_whose_process_exited_still_marks_its_node() -> None:
    """On a crashed node the actor often reports its process's SIGKILL before it dies
    itself: the report cannot tell a crash from the node's loss."""
    found = _cluster(10.0)
    found["a1"].exited = lambda: True
    watch, recovery = _rig(_members(found))
    watch._check("a", found["a1"], 10.0, hearing=True)  # (timeout mode: judged by silence)
    assert recovery.suspected == ["a1", "b1"]


def test_a_node_mate_on_this_host_is_not_spared_for_looking_alive(monkeypatch) -> None:
    """The Ray tests and the benchmark run every node on one host, where a crashed node's
    processes look alive (threads asleep or running) while the kernel tears them down: the
    node's evidence still holds."""
    found = _cluster(10.0)
    found["b1"].on_this_host = True
    monkeypatch.setattr(hams_watch, "thread_states", lambda pid: "RSS")
    watch, recovery = _rig(_members(found))
    watch._check("a", found["a1"], 10.0, hearing=True)
    assert recovery.suspected == ["a1", "b1"]


def test_an_exit_says_nothing_of_its_node() -> None:
    found = _cluster(10.0)
    found["a1"].exited = lambda: True  # (the actor saw its process exit; the node is up)
    found["a1"].last_beat = 10.0
    watch, recovery = _rig(_members(found))
    watch.ctx.graph.detection = "exit"
    watch._check("a", found["a1"], 10.0, hearing=True)
    assert recovery.suspected == ["a1"] and watch._silent_nodes == {}
    assert found["b1"].lost is None


def test_a_graph_with_no_plan_keeps_the_heartbeat_alone() -> None:
    found = _cluster(10.0)
    watch, _ = _rig(_members(found), plan=False)
    watch._silent_nodes["n1"] = (10.0, 9.79)
    assert watch._node_loss(found["b1"], 10.0, True) is None
