"""The Ray launcher's decisions, with Ray's API replaced by fakes (no cluster, no processes):
which node each actor is pinned to, what it asks Ray for, where its keys go, what happens when
no node has room, and re-placement after a replica's node died. The real cluster is in
tests/integration/test_ray_cluster.py."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest

pytest.importorskip("ray", reason="the Ray launcher needs ray: pip install 'parityserve[ray]'")

from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # noqa: E402

from parityserve.config import parse_config  # noqa: E402
from parityserve.core.placement import Node, Resources  # noqa: E402
from parityserve.runtime.fleet import ray_launcher  # noqa: E402
from parityserve.runtime.workers.keys import ClientKeys  # noqa: E402
from parityserve.runtime.workers.worker import WorkerSpec  # noqa: E402

NODE_IDS = [f"{i + 1:02x}" * 28 for i in range(3)]  # Ray's node ids: 28 bytes of hex
ECHO = {"source": "zoo:echo", "input": {"name": "input", "datatype": "FP32", "shape": [4]}}


class FakeRef:
    def __init__(self, value: Any) -> None:
        self.value = value


class FakeGroup:
    """A placement group as Ray would lay it out on ``nodes``: STRICT_SPREAD on distinct nodes
    (it must have enough), SPREAD round robin."""

    def __init__(self, bundles: list[dict[str, float]], strategy: str, name: str,
                 nodes: list[Node]) -> None:
        self.bundles, self.strategy, self.name = bundles, strategy, name
        ids = [n.node_id for n in nodes if n.capacity.cpu > 0]
        assert strategy != "STRICT_SPREAD" or len(ids) >= len(bundles)
        self.bundle_nodes: list[str | None] = [ids[i % len(ids)] for i in range(len(bundles))]
        self.removed = False
        self.state = "CREATED"  # RESCHEDULING: Ray is moving a dead node's bundles

    def table(self) -> dict[str, Any]:
        """``placement_group_table`` of this group: a bundle being moved has no node."""
        return {"state": self.state, "bundles_to_node_id": {
            i: node for i, node in enumerate(self.bundle_nodes) if node is not None}}


class FakeActor:
    def __init__(self, node_id: str | None) -> None:
        self.node_id = self  # actor.node_id.remote(): where Ray put it
        self._node = node_id

    def remote(self) -> FakeRef:
        return FakeRef(self._node)


class FakeActorClass:
    """Records ``ReplicaActor.options(...).remote(...)`` instead of asking Ray."""

    def __init__(self) -> None:
        self.created: list[tuple[dict[str, Any], tuple[Any, ...]]] = []

    def options(self, **options: Any) -> FakeActorClass:
        self._options = options
        return self

    def remote(self, *args: Any) -> FakeActor:
        self.created.append((self._options, args))
        return FakeActor(_strategy_node(self._options))


class FakeRay:
    def __init__(self, nodes: list[Node]) -> None:
        self.actors, self.nodes, self.groups = FakeActorClass(), nodes, []

    def placement_group(self, bundles: list[dict[str, float]], strategy: str,
                        name: str) -> FakeGroup:
        # as Ray 2.60 does: "Failed to create placement group ... because name ... already
        # exists" (names are unique per namespace while the group lives)
        if any(g.name == name and not g.removed for g in self.groups):
            raise RuntimeError(f"placement group name {name!r} already exists")
        self.groups.append(FakeGroup(bundles, strategy, name, self.nodes))
        return self.groups[-1]


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeActorClass, list[Node]]:
    nodes = [Node(node_id, Resources(cpu=2, memory=2**32)) for node_id in NODE_IDS]
    fake = FakeRay(nodes)
    monkeypatch.setattr(ray_launcher.ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray_launcher.ray.util, "get_node_ip_address", lambda: "10.0.0.1")
    monkeypatch.setattr(ray_launcher.ray, "wait", lambda refs, timeout: (refs, []))
    monkeypatch.setattr(ray_launcher.ray, "get", lambda ref: ref.value)
    monkeypatch.setattr(ray_launcher, "ReplicaActor", fake.actors)
    monkeypatch.setattr(ray_launcher, "alive_nodes", lambda: list(nodes))
    monkeypatch.setattr(ray_launcher, "placement_group", fake.placement_group)
    monkeypatch.setattr(ray_launcher, "remove_placement_group",
                        lambda g: setattr(g, "removed", True))
    monkeypatch.setattr(ray_launcher, "placement_group_table", lambda g: g.table())
    monkeypatch.setattr(ray_launcher.RayReplica, "exit_code", lambda self: self._code)
    fake.actors.ray = fake  # the tests reach the groups through the actor class
    return fake.actors, nodes


def _launch(launcher: ray_launcher.RayLauncher, model: dict[str, Any],
            keys: ClientKeys | None = None) -> list[ray_launcher.RayReplica]:
    dep = parse_config({"models": [{"name": "m", **ECHO, **model}]}).models[0]
    launcher.note_deployment(dep)
    slots = [str(i) for i in range(dep.data_replicas())]
    slots += [f"parity0-{i}" for i in range(dep.parity_replicas())]
    return [launcher.start(WorkerSpec(f"m/v1/{s}#{n}-ab", "m", 1, "zoo:echo"), keys)
            for n, s in enumerate(slots)]


def _strategy_node(options: dict[str, Any]) -> str | None:
    """The node an actor lands on: its pin, its bundle's node, or None (left to Ray)."""
    strategy = options["scheduling_strategy"]
    if strategy == "SPREAD":
        return None
    if isinstance(strategy, PlacementGroupSchedulingStrategy):
        group = strategy.placement_group
        return group.bundle_nodes[strategy.placement_group_bundle_index]
    return strategy.node_id


def test_a_parm_group_gets_a_strict_spread_group_with_its_resources(fake_ray) -> None:
    actors, _ = fake_ray
    launcher = ray_launcher.RayLauncher("tcp://10.0.0.1:5555", "auto")
    replicas = _launch(launcher, {"replicas": 2, "parity": {"k": 2},
                                  "resources": {"cpu": 1, "memory_mb": 256}})
    (group,) = actors.ray.groups
    assert group.strategy == "STRICT_SPREAD"
    assert re.fullmatch(r"m/v1/group0#[0-9a-f]{8}-1", group.name)
    assert group.bundles == [{"CPU": 1, "memory": 2**28}] * 3
    strategies = [options["scheduling_strategy"] for options, _ in actors.created]
    assert [(s.placement_group, s.placement_group_bundle_index) for s in strategies] == [
        (group, 0), (group, 1), (group, 2)]  # member i in bundle i
    assert sorted(r.node_id for r in replicas) == NODE_IDS  # where Ray put them: distinct
    for options, _ in actors.created:
        assert (options["num_cpus"], options["num_gpus"], options["memory"]) == (1, 0, 2**28)
        assert options["name"].startswith("m/v1/")


def test_a_models_replicas_share_one_spread_group_removed_at_stop(fake_ray) -> None:
    actors, _ = fake_ray
    launcher = ray_launcher.RayLauncher("tcp://10.0.0.1:5555")
    replicas = _launch(launcher, {"replicas": 3})
    (group,) = actors.ray.groups
    assert (group.strategy, len(group.bundles)) == ("SPREAD", 3)
    assert [r.group for r in replicas] == [group] * 3
    launcher.stop_all([])
    assert group.removed and not launcher.groups


def test_a_coding_group_on_too_few_nodes_is_spread_with_a_warning(fake_ray, caplog) -> None:
    actors, nodes = fake_ray
    del nodes[2]
    with caplog.at_level(logging.WARNING, logger=ray_launcher.__name__):
        _launch(ray_launcher.RayLauncher("tcp://10.0.0.1:5555"),
                {"replicas": 2, "parity": {"k": 2}})
    (group,) = actors.ray.groups
    assert group.strategy == "SPREAD"
    assert "coding group m/v1/group0: 3 members but only 2 of 2 nodes" in caplog.text


def test_two_frontends_on_one_cluster_deploy_the_same_model(fake_ray) -> None:
    """Shards (server.frontends: N) or frontend pods sharing one Ray cluster each launch the
    same model: their placement groups must not collide on Ray's unique names."""
    actors, _ = fake_ray
    for _ in range(2):
        _launch(ray_launcher.RayLauncher("tcp://10.0.0.1:5555"), {"replicas": 1})
    names = [g.name for g in actors.ray.groups]
    assert len(names) == 2 and len(set(names)) == 2
    assert {n.split("#")[0] for n in names} == {"m/v1/spread"}
    assert len(actors.created) == 2


def test_a_group_no_deployment_needs_is_removed_once_its_replicas_are_gone(fake_ray) -> None:
    actors, _ = fake_ray
    launcher = ray_launcher.RayLauncher("tcp://10.0.0.1:5555")
    old = _launch(launcher, {"replicas": 2})
    (first,) = actors.ray.groups
    for r in old:
        r._code = 0  # stopped
    _launch(launcher, {"replicas": 3})  # a new shape: a new group; the old one goes
    assert first.removed and len(actors.ray.groups) == 2 and not actors.ray.groups[1].removed


def test_keys_travel_in_the_workers_environment_not_its_command(fake_ray) -> None:
    actors, _ = fake_ray
    keys = ClientKeys(b"S" * 40, b"P" * 40, b"X" * 40)
    _launch(ray_launcher.RayLauncher("tcp://10.0.0.1:5555"), {"replicas": 1}, keys)
    (_, (connect, spec_json, env)), = actors.created
    assert connect == "tcp://10.0.0.1:5555"
    assert "X" * 40 not in spec_json and env[ray_launcher.ENV_VAR] == keys.to_env()


def test_no_room_leaves_it_to_ray_and_says_why(fake_ray, caplog) -> None:
    actors, _ = fake_ray
    launcher = ray_launcher.RayLauncher("tcp://10.0.0.1:5555")
    with caplog.at_level(logging.WARNING, logger=ray_launcher.__name__):
        replicas = _launch(launcher, {"replicas": 7})  # 7 CPUs asked of 6
    assert [_strategy_node(o) for o, _ in actors.created].count(None) == 1
    assert replicas[-1].node_id is None
    assert "no node has 1 CPU" in caplog.text and "Ray's scheduler" in caplog.text


def test_a_dead_nodes_replica_is_placed_on_a_survivor_and_others_stay(fake_ray) -> None:
    actors, nodes = fake_ray
    launcher = ray_launcher.RayLauncher("tcp://10.0.0.1:5555")
    replicas = _launch(launcher, {"replicas": 2, "parity": {"k": 2}})
    victim = replicas[0]
    nodes.remove(next(n for n in nodes if n.node_id == victim.node_id))
    victim._code = ray_launcher.ACTOR_DIED  # what exit_code reports when its node died
    fresh = launcher.start(WorkerSpec("m/v1/0#9-cd", "m", 1, "zoo:echo"))
    assert fresh.node_id in {n.node_id for n in nodes}
    assert [r.node_id for r in replicas[1:]] == [
        _strategy_node(o) for o, _ in actors.created[1:3]]  # nothing else moved
    assert any("coding group m/v1/group0" in note for note in launcher.placement.notes)
    # two nodes cannot hold the STRICT_SPREAD group again: the replacement is pinned outside
    # it, and the group stays for the two members still running in it
    (group,) = actors.ray.groups
    assert fresh.group is None and fresh.pinned == fresh.node_id and not group.removed


def test_a_replacement_goes_back_into_its_bundle_while_the_group_still_fits(fake_ray) -> None:
    """Four nodes for a group of three: Ray reschedules the dead node's bundle on a survivor,
    so the replacement asks for the same bundle."""
    actors, nodes = fake_ray
    nodes.append(Node("04" * 28, Resources(cpu=2, memory=2**32)))
    launcher = ray_launcher.RayLauncher("tcp://10.0.0.1:5555")
    replicas = _launch(launcher, {"replicas": 2, "parity": {"k": 2}})
    nodes.remove(next(n for n in nodes if n.node_id == replicas[0].node_id))
    replicas[0]._code = ray_launcher.ACTOR_DIED
    launcher.start(WorkerSpec("m/v1/0#9-cd", "m", 1, "zoo:echo"))
    (group,) = actors.ray.groups
    strategy = actors.created[-1][0]["scheduling_strategy"]
    assert (strategy.placement_group, strategy.placement_group_bundle_index) == (group, 0)


def _spread_of_three(fake_ray: Any) -> tuple[ray_launcher.RayLauncher, list[Any], Any]:
    actors, _ = fake_ray
    launcher = ray_launcher.RayLauncher("tcp://10.0.0.1:5555")
    replicas = _launch(launcher, {"replicas": 3})
    (group,) = actors.ray.groups
    return launcher, replicas, group


def test_a_replacement_whose_bundle_is_on_a_suspect_node_runs_interim_elsewhere(
        fake_ray, caplog) -> None:
    """A graph member lost by its silence marks its node (``SUSPECT_NODES``) seconds before
    Ray declares the node dead and moves its bundles: a replacement sent into its bundle there
    died with the node about 12 s later. It runs outside its group meanwhile, reserving
    nothing (the bundle still holds its CPUs), and goes back at its slot's next restart."""
    actors, nodes = fake_ray
    launcher, replicas, group = _spread_of_three(fake_ray)
    # the bundle, not the predecessor, decides: slot 0's bundle moved to the third node
    crashed = group.bundle_nodes[0] = replicas[2].node_id
    ray_launcher.SUSPECT_NODES.mark(crashed)  # what the graph's watch does on a member loss
    with caplog.at_level(logging.WARNING, logger="parityserve.runtime.fleet.ray_launcher"):
        fresh = launcher.start(WorkerSpec("m/v1/0#9-cd", "m", 1, "zoo:echo"))
    options = actors.created[-1][0]
    assert not isinstance(options["scheduling_strategy"], PlacementGroupSchedulingStrategy)
    assert (options["num_cpus"], options["memory"]) == (0, None)
    assert fresh.interim and fresh.group is None
    assert fresh.node_id not in (None, crashed, replicas[0].node_id)
    assert "interim replica" in caplog.text and crashed in caplog.text
    ray_launcher.SUSPECT_NODES.clear()  # trusted again: its next restart is in its bundle
    again = launcher.start(WorkerSpec("m/v1/0#10-cd", "m", 1, "zoo:echo"))
    options = actors.created[-1][0]
    assert options["scheduling_strategy"].placement_group is group
    assert options["num_cpus"] == 1 and not again.interim and again.group is group


def test_a_replacement_whose_bundle_ray_is_moving_runs_interim(fake_ray) -> None:
    """The 14.4 s failover of a quick run: the bundle was off its dead node and not yet on
    another, so it was on no suspect node, and the replacement waited in it."""
    actors, _ = fake_ray
    launcher, replicas, group = _spread_of_three(fake_ray)
    group.state, group.bundle_nodes[1] = "RESCHEDULING", None
    fresh = launcher.start(WorkerSpec("m/v1/1#9-cd", "m", 1, "zoo:echo"))
    assert fresh.interim and fresh.node_id not in (None, replicas[1].node_id)


@pytest.mark.parametrize("case", ["predecessor's node suspect, bundle elsewhere",
                                  "being moved but still placed", "pending, never placed"])
def test_a_safe_bundle_takes_its_replacement(fake_ray, case: str) -> None:
    actors, _ = fake_ray
    launcher, replicas, group = _spread_of_three(fake_ray)
    if case.startswith("predecessor"):
        group.bundle_nodes[0] = replicas[1].node_id
        ray_launcher.SUSPECT_NODES.mark(replicas[0].node_id)
    elif case.startswith("being moved"):
        group.state = "RESCHEDULING"  # another bundle of it is being moved; this one is home
    else:
        group.state, group.bundle_nodes[0] = "PENDING", None  # not a dead node's: it waits
    fresh = launcher.start(WorkerSpec("m/v1/0#9-cd", "m", 1, "zoo:echo"))
    assert not fresh.interim and fresh.group is group
    assert actors.created[-1][0]["scheduling_strategy"].placement_group is group


def test_no_interim_for_a_gpu_replica_or_where_no_trusted_node_has_room(fake_ray) -> None:
    """A GPU would be reserved twice (or the node have none); with no room elsewhere by our
    count, the bundle as before, never an unreserved replica crammed somewhere."""
    actors, nodes = fake_ray
    for i, node in enumerate(nodes):
        nodes[i] = Node(node.node_id, Resources(cpu=2, gpu=2, memory=2**32))
    launcher = ray_launcher.RayLauncher("tcp://10.0.0.1:5555")
    replicas = _launch(launcher, {"replicas": 3, "resources": {"gpu": 1}})
    (group,) = actors.ray.groups
    ray_launcher.SUSPECT_NODES.mark(group.bundle_nodes[0])
    fresh = launcher.start(WorkerSpec("m/v1/0#9-cd", "m", 1, "zoo:echo"))
    assert not fresh.interim and fresh.group is group
    ray_launcher.SUSPECT_NODES.clear()
    full, _ = fake_ray  # a CPU model on three nodes of one CPU each: every node full
    for i, node in enumerate(nodes):
        nodes[i] = Node(node.node_id, Resources(cpu=1, memory=2**32))
    launcher = ray_launcher.RayLauncher("tcp://10.0.0.1:5555")
    _launch(launcher, {"replicas": 3, "resources": {"cpu": 1}})
    group = actors.ray.groups[-1]
    ray_launcher.SUSPECT_NODES.mark(group.bundle_nodes[0])
    fresh = launcher.start(WorkerSpec("m/v1/0#9-cd", "m", 1, "zoo:echo"))
    assert not fresh.interim and fresh.group is group and replicas


def test_first_starts_and_an_unreadable_table_go_into_the_bundle(fake_ray, monkeypatch) -> None:
    """A first start has no predecessor: its group is new, and its bundles may be unplaced
    for a moment. A GCS that cannot answer leaves the replacement in its bundle, as before."""
    actors, _ = fake_ray
    ray_launcher.SUSPECT_NODES.mark(NODE_IDS[0])
    launcher, replicas, group = _spread_of_three(fake_ray)
    assert not any(r.interim for r in replicas)
    assert all(isinstance(o["scheduling_strategy"], PlacementGroupSchedulingStrategy)
               for o, _ in actors.created)

    def busy(g: Any) -> dict[str, Any]:
        raise TimeoutError("the GCS is busy")

    monkeypatch.setattr(ray_launcher, "placement_group_table", busy)
    fresh = launcher.start(WorkerSpec("m/v1/0#9-cd", "m", 1, "zoo:echo"))
    assert not fresh.interim and fresh.group is group


def test_no_interim_when_every_node_is_suspect(fake_ray) -> None:
    """Nowhere better to go: the bundle, and Ray's own schedule."""
    launcher, replicas, group = _spread_of_three(fake_ray)
    for node in NODE_IDS:
        ray_launcher.SUSPECT_NODES.mark(node)
    fresh = launcher.start(WorkerSpec("m/v1/0#9-cd", "m", 1, "zoo:echo"))
    assert not fresh.interim and fresh.group is group


@pytest.mark.parametrize(("bound", "dialled"), [
    ("tcp://0.0.0.0:5555", "tcp://10.0.0.9:5555"),
    ("tcp://[::]:5555", "tcp://10.0.0.9:5555"),
    ("tcp://10.0.0.1:5555", "tcp://10.0.0.1:5555"),
    ("tcp://127.0.0.1:5555", "tcp://127.0.0.1:5555"),
])
def test_workers_dial_the_frontends_node_ip_when_it_binds_every_interface(
        bound: str, dialled: str) -> None:
    assert ray_launcher.reachable(bound, "10.0.0.9") == dialled


@pytest.fixture(autouse=True)
def _no_suspects_left_over() -> Any:
    """The suspect nodes are one per process: each test starts and ends without any."""
    ray_launcher.SUSPECT_NODES.clear()
    yield
    ray_launcher.SUSPECT_NODES.clear()


def test_a_node_where_an_actor_died_unasked_gets_no_new_replica_for_a_while(fake_ray) -> None:
    """Two replicas lost on one crashed node: the second replacement avoids it too, though
    Ray still lists the node alive and the second slot's own predecessor is long gone."""
    _, nodes = fake_ray
    launcher = ray_launcher.RayLauncher("tcp://10.0.0.1:5555")
    replicas = _launch(launcher, {"replicas": 3})
    crashed = replicas[0]
    crashed._code, crashed.death = ray_launcher.ACTOR_DIED, "ActorDiedError: node died"
    del launcher.running["m/v1/2"]  # a slot whose predecessor is no longer known
    fresh = launcher.start(WorkerSpec("m/v1/2#9-cd", "m", 1, "zoo:echo"))
    assert fresh.node_id != crashed.node_id and crashed.node_id in launcher.suspects
    # a replica stopped on purpose casts no suspicion
    launcher.suspects.clear()
    replicas[1]._code = ray_launcher.ACTOR_DIED  # killed by us: no death recorded
    crashed.death = None
    launcher.start(WorkerSpec("m/v1/1#10-ef", "m", 1, "zoo:echo"))
    assert not launcher.suspects
