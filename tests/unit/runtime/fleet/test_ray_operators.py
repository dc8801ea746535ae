"""Graph members as Ray actors (issue 41), with Ray's API replaced by fakes (no cluster, no
processes): the handle reports an actor's death as an exit and never blocks, and the graph's
Ray launcher pins each member where placement says, with the state link its nodes call for.
The real cluster is in tests/integration/test_hams_ray_nodes.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("ray", reason="the Ray launcher needs ray: pip install 'parityserve[ray]'")

from ray.exceptions import RayError  # noqa: E402

from parityserve.core.hams.placement import StatefulGraph  # noqa: E402
from parityserve.core.placement import Node, Resources  # noqa: E402
from parityserve.runtime.fleet import ray_launcher, ray_operators  # noqa: E402
from parityserve.runtime.fleet.ray_launcher import ACTOR_DIED  # noqa: E402
from parityserve.runtime.graphs import hams_ray_members  # noqa: E402
from parityserve.runtime.graphs.hams_members import Member  # noqa: E402
from parityserve.runtime.graphs.hams_protocol import OperatorSpec  # noqa: E402


class FakeRef:
    """An ObjectRef: ready or not, its value or the error Ray would raise. ``future()``'s
    callback runs at once when ready, else at ``finish`` (Ray's thread, in the real one)."""

    def __init__(self, value: Any = None, ready: bool = True) -> None:
        self.value, self.ready = value, ready
        self.callbacks: list[Any] = []

    def future(self) -> Any:
        return SimpleNamespace(add_done_callback=self._on_done)

    def _on_done(self, callback: Any) -> None:
        if self.ready:
            callback(self)
        else:
            self.callbacks.append(callback)

    def finish(self) -> None:
        self.ready = True
        for callback in self.callbacks:
            callback(self)


class FakeMethod:
    def __init__(self, refs: list[FakeRef]) -> None:
        self.refs, self.calls = refs, []

    def remote(self, *args: Any) -> FakeRef:
        self.calls.append(args)
        return self.refs.pop(0) if self.refs else FakeRef()


class FakeActor:
    def __init__(self, polls: list[FakeRef], where: FakeRef) -> None:
        self.wait_exit, self.where = FakeMethod(polls), FakeMethod([where])
        self.send_signal, self.stop = FakeMethod([]), FakeMethod([])


class FakeRay:
    def __init__(self) -> None:
        self.killed: list[Any] = []

    def wait(self, refs: list[FakeRef], timeout: float) -> tuple[list[FakeRef], list[FakeRef]]:
        assert timeout == 0  # never blocks
        return [r for r in refs if r.ready], [r for r in refs if not r.ready]

    def get(self, ref: FakeRef) -> Any:
        if isinstance(ref.value, BaseException):
            raise ref.value
        return ref.value

    def kill(self, actor: Any, no_restart: bool) -> None:
        self.killed.append(actor)


@pytest.fixture()
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeRay, list[float]]:
    ray, now = FakeRay(), [100.0]
    clock = SimpleNamespace(monotonic=lambda: now[0],
                            sleep=lambda s: now.__setitem__(0, now[0] + s))
    for module in (ray_operators, ray_launcher):  # (the exit watch, ``ActorExit``, is there)
        monkeypatch.setattr(module, "ray", ray)
        monkeypatch.setattr(module, "time", clock)
    return ray, now


def test_an_actor_that_dies_under_its_operator_is_an_exit(fake_ray) -> None:
    died = RayError("ActorDiedError: the actor's node was lost\nmore")
    in_flight = FakeRef(died, ready=False)
    actor = FakeActor([FakeRef(None), in_flight], FakeRef(("n1", "host", 4321)))
    handle = ray_operators.RayOperatorProcess(actor, "n1")
    assert handle.poll() is None  # alive: the long-poll came back with None, and is sent again
    assert handle.poll() is None  # that one is in flight: Ray is not asked again
    assert handle.poll() is None
    assert actor.wait_exit.calls == [(ray_launcher.WAIT_EXIT_S,)] * 2
    in_flight.finish()  # the node is lost: Ray fails the call in flight
    assert handle.poll() == ACTOR_DIED  # Ray's report of the actor's death
    assert handle.death is not None and "node was lost" in handle.death
    assert handle.wait(timeout=0) == ACTOR_DIED


def test_the_operator_exiting_under_a_live_actor_is_its_exit_code(fake_ray) -> None:
    in_flight = FakeRef(None, ready=False)
    actor = FakeActor([in_flight], FakeRef(("n1", "host", 4321)))
    handle = ray_operators.RayOperatorProcess(actor, "n1")
    assert handle.poll() is None
    in_flight.value = -9  # kill -9 of the operator process: the actor's wait returns its code
    in_flight.finish()
    assert handle.poll() == -9 and handle.death is None
    assert len(actor.wait_exit.calls) == 1


def test_pid_node_and_host_come_from_the_actor_without_waiting(fake_ray) -> None:
    where = FakeRef(("n2", "elsewhere", 4321), ready=False)
    handle = ray_operators.RayOperatorProcess(FakeActor([], where), None)
    assert (handle.pid, handle.node_id) == (0, None)  # not said yet: never blocks
    where.ready = True
    assert (handle.pid, handle.node_id, handle.local) == (4321, "n2", False)


def test_kill_asks_the_actor_to_sigkill_its_operator_and_end_without_waiting(fake_ray
                                                                             ) -> None:
    ray, _ = fake_ray
    actor = FakeActor([FakeRef(ready=False)], FakeRef(("n1", "h", 1)))
    handle = ray_operators.RayOperatorProcess(actor, "n1")
    assert handle.poll() is None
    handle.kill()  # the actor may be gone with its node: nothing here waits on it
    assert actor.stop.calls == [()] and ray.killed == []
    assert handle.poll() == ACTOR_DIED and handle.wait(timeout=0) == ACTOR_DIED


# ---- the graph's Ray launcher ----------------------------------------------------------------
class FakeHandle:
    def __init__(self, node_id: str | None) -> None:
        self.node_id, self.returncode, self.death, self.pid = node_id, None, None, 1

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        self.returncode = ACTOR_DIED

    def wait(self, timeout: float | None = None) -> int:
        return ACTOR_DIED


DEMAND = {"seq1": Resources(cpu=1)}  # what each member's actor asks Ray for


@pytest.fixture(autouse=True)
def _no_suspects_left_over() -> Any:
    """The suspect nodes are one per process (shared with the replicas' launcher): each test
    starts and ends without any."""
    ray_launcher.SUSPECT_NODES.clear()
    yield
    ray_launcher.SUSPECT_NODES.clear()


def graph_launcher(monkeypatch: pytest.MonkeyPatch, n_nodes: int,
                   free: dict[str, Resources] | None = None) -> tuple[Any, list[dict]]:
    """``free``: what Ray says is unreserved per node (default: every node empty)."""
    nodes = [Node(f"n{i}", Resources(cpu=4)) for i in range(n_nodes)]
    started: list[dict] = []

    def start_operator(args: list[str], **kw: Any) -> FakeHandle:
        started.append({"args": args, **kw})
        return FakeHandle(kw["node_id"])

    monkeypatch.setattr(hams_ray_members, "connect_ray", lambda address: None)
    monkeypatch.setattr(hams_ray_members, "live_nodes", lambda: (
        nodes, {n.node_id: f"10.0.0.{i}" for i, n in enumerate(nodes)}))
    monkeypatch.setattr(hams_ray_members, "start_operator", start_operator)
    monkeypatch.setattr(hams_ray_members, "free_resources", lambda: dict(
        free if free is not None else {n.node_id: n.capacity for n in nodes}))
    link = SimpleNamespace(address="tcp://0.0.0.0:5555", forget=lambda wid: None)
    launcher = hams_ray_members.RayMemberLauncher(
        link, None, None, graph=StatefulGraph.chain(["seq1"], DEMAND),  # type: ignore[arg-type]
        demand=DEMAND, roles=dict, address=None)
    return launcher, started


def spec(role: str, n: int) -> OperatorSpec:
    return OperatorSpec(worker_id=f"g/seq1/{role}-{n}", op="seq1", source="zoo:echo",
                        role=role, ipc_dir="/tmp/ps-hams-x", bind_host="127.0.0.1")


def launch(launcher: Any, roles: list[str]) -> list[Member]:
    async def run() -> list[Member]:
        return [launcher.start(spec(r, i), 0.0) for i, r in enumerate(roles)]
    return asyncio.run(run())


def test_members_go_to_three_nodes_and_backups_listen_on_tcp_at_their_node(monkeypatch
                                                                          ) -> None:
    launcher, started = graph_launcher(monkeypatch, 3)
    primary, backup, spare = launch(launcher, ["primary", "backup", "backup"])
    assert len({s["node_id"] for s in started}) == 3
    for member in (backup, spare):
        node = member.popen.node_id
        assert member.spec.ipc_dir == "" and member.spec.bind_host == f"10.0.0.{node[1]}"
    # the frontend bound to every interface is dialled at the member's node address
    assert started[1]["args"][:2] == ["--connect", f"tcp://10.0.0.{backup.node[1]}:5555"]
    assert launcher.notes == {}


def test_one_node_keeps_the_unix_link_and_says_why_they_share(monkeypatch) -> None:
    launcher, started = graph_launcher(monkeypatch, 1)
    _, backup, _ = launch(launcher, ["primary", "backup", "backup"])
    assert backup.spec.ipc_dir == "/tmp/ps-hams-x" and started[1]["ipc_dir"] == "/tmp/ps-hams-x"
    assert "shares node n0" in launcher.notes["seq1"]


def test_a_replacement_avoids_the_node_where_a_member_was_just_lost(monkeypatch) -> None:
    """Ray still lists the crashed node alive; the lost member's node is the last choice."""
    launcher, started = graph_launcher(monkeypatch, 4)
    primary, backup, spare = launch(launcher, ["primary", "backup", "backup"])
    primary.lost = "timeout"
    primary.popen.returncode = None  # Ray has not reported the actor dead yet
    launcher.forget(primary)
    lost_node = started[0]["node_id"]
    (new,) = launch(launcher, ["backup"])
    assert new.node not in (lost_node, backup.node, spare.node)


def test_a_process_that_exited_under_a_live_actor_casts_no_suspicion(monkeypatch) -> None:
    """A crash or a chaos kill of the operator process alone: its actor, and so its node,
    is alive; replicas and members may still go there."""
    launcher, _ = graph_launcher(monkeypatch, 4)
    primary, _, _ = launch(launcher, ["primary", "backup", "backup"])
    primary.lost = "exit"
    primary.popen.returncode = -9  # the actor's wait_exit said so; no death from Ray
    launcher.forget(primary)
    assert not ray_launcher.SUSPECT_NODES
    backup = launch(launcher, ["backup"])[0]
    backup.lost, backup.popen.death = "exit", "ActorDiedError: node lost"
    launcher.forget(backup)  # its actor died: its node may be gone
    assert backup.node in ray_launcher.SUSPECT_NODES


def test_a_member_lost_by_its_silence_keeps_model_replicas_off_its_node_too(monkeypatch
                                                                          ) -> None:
    """The member's timeout (200 ms) is the first sign of a crashed node, seconds before Ray
    reports a replica's actor there dead: the replicas' launcher avoids the node from then on.
    (Before, a replacement replica was placed on the crashed node and died about 12 s later.)"""
    launcher, started = graph_launcher(monkeypatch, 4)
    primary, _, _ = launch(launcher, ["primary", "backup", "backup"])
    replicas = ray_launcher.RayLauncher.__new__(ray_launcher.RayLauncher)
    replicas.running, replicas.suspects = {}, ray_launcher.SUSPECT_NODES
    nodes = [Node(f"n{i}", Resources(cpu=4)) for i in range(4)]
    monkeypatch.setattr(ray_launcher, "alive_nodes", lambda: nodes)
    assert len(replicas._trusted_nodes()) == 4
    primary.lost = "timeout"
    launcher.forget(primary)
    trusted = {n.node_id for n in replicas._trusted_nodes()}
    assert trusted == {"n0", "n1", "n2", "n3"} - {started[0]["node_id"]}


def test_suspicion_lasts_its_minute_and_a_repeated_report_does_not_extend_it() -> None:
    now = [0.0]
    suspects = ray_launcher.SuspectNodes(clock=lambda: now[0])
    suspects.mark("n1")
    now[0] = 50.0
    suspects.mark("n1", renew=False)  # Ray says again that the actor there died
    assert "n1" in suspects
    now[0] = ray_launcher.SUSPECT_S + 1
    assert "n1" not in suspects and not suspects
    suspects.mark("n2")
    now[0] += 30
    suspects.mark("n2")  # a second loss there: a new minute
    now[0] += 45
    assert suspects.current() == {"n2"}


def test_the_note_stays_while_members_share_even_when_the_newest_is_apart(monkeypatch) -> None:
    launcher, _ = graph_launcher(monkeypatch, 2)
    primary, backup, spare = launch(launcher, ["primary", "backup", "backup"])
    assert "shares node" in launcher.notes["seq1"]  # two nodes for three members
    launcher.forget(backup)  # retired, not lost
    (new,) = launch(launcher, ["backup"])
    assert new.node == backup.node  # apart from the primary and the spare, which still share
    assert "shares node" in launcher.notes["seq1"]


def test_a_demoted_members_node_stays_a_first_choice(monkeypatch) -> None:
    """A primary fenced because its backup took over (HAMS rolling an operator forward) is not
    a machine failure: its node keeps its place, and the new spare goes there when it is the
    one node holding none of the operator's members. (It was kept out for a minute, and on
    four nodes less the crashed one the new spare shared a node with its primary.)"""
    launcher, started = graph_launcher(monkeypatch, 3)
    primary, backup, spare = launch(launcher, ["primary", "backup", "backup"])
    primary.lost = "fenced: demoted: its backup took over"
    launcher.forget(primary)
    (new,) = launch(launcher, ["backup"])
    assert new.node == started[0]["node_id"]
    assert "seq1" not in launcher.notes


def test_a_node_whose_cpus_replicas_hold_gets_no_member(monkeypatch) -> None:
    """Ray says n0's CPUs are all reserved (model replicas): its total (4) is no room. Before,
    the first member went there by the node totals and waited in Ray's queue for good."""
    free = {"n0": Resources(cpu=0), "n1": Resources(cpu=4), "n2": Resources(cpu=4),
            "n3": Resources(cpu=4)}
    launcher, started = graph_launcher(monkeypatch, 4, free)
    launch(launcher, ["primary", "backup", "backup"])
    assert "n0" not in {s["node_id"] for s in started}, started
    assert len({s["node_id"] for s in started}) == 3
