"""Starts worker replicas as Ray actors on a cluster, in Ray placement groups.

Ray is the control plane only. Each replica is one actor that reserves the deployment's CPUs,
GPUs and memory on its node and runs the ordinary worker (``python -m
parityserve.runtime.workers.worker``) as its child. The worker connects back to the frontend over
the ZeroMQ data plane with its own CURVE keys, exactly as a local one does: queries and outputs
never pass through Ray's object store.

- Placement: ``core/placement.plan_groups`` gives each coding group (k data + parity
  replicas, or the Berrut workers) a placement group of its own, STRICT_SPREAD (each member on
  a distinct node) when enough nodes could hold one member each, else SPREAD with a logged
  warning; a model's other replicas share one SPREAD group. Member i runs in bundle i
  (``PlacementGroupSchedulingStrategy``). Ray reserves the bundles, so a group that does not
  fit waits in Ray's queue (the actors with it) until resources free up.
- Node failure: Ray reschedules the bundles of a dead node on the survivors, and a replacement
  goes into its slot's bundle. Until Ray has moved it (its health checks take seconds to give
  up on a crashed node, where our heartbeats and the graphs' watch take a fraction of one),
  a replacement whose bundle is on a node where something was just lost (``SUSPECT_NODES``),
  or is being moved, runs outside its group as an *interim* replica: pinned to a trusted node
  with room for it, reserving no CPU or memory (the bundle still holds them), back in its
  bundle at its slot's next restart (never for a GPU replica). A STRICT_SPREAD group whose
  live nodes are now too few cannot be rescheduled (its lost bundle stays pending), so the
  replacement is pinned with a hard NodeAffinity where ``core/placement.place`` puts it (away
  from the rest of its group where there is room), and a warning says so; when no node has
  room it is left to Ray's SPREAD scheduler. The group's survivors keep running in it.
- Keys: the replica's CURVE secret rides in the actor's constructor arguments (Ray's task
  spec, over Ray's gRPC; turn on Ray's TLS on an untrusted network) and reaches the worker in
  its environment, never its command line. Each key is per replica and revoked when the
  replica goes, so a leaked one admits only that one dead replica.
- Failure and restart: an actor is created with ``max_restarts=0``. When its worker exits,
  the actor dies, or its node dies, ``exit_code`` says so; the supervisor requeues the
  replica's batch and asks for a fresh replica. Ray restarting the actor itself would do so
  without the frontend requeuing what it held.
- Groups are removed when the launcher stops, and a group no deployment needs any more once
  none of its replicas runs (removing a group kills the actors in it).

Only this module imports ray: the local launcher, and a plain install, need none.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError
from ray.util.placement_group import (
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from parityserve.config import Deployment
from parityserve.core.placement import (
    STRICT_SPREAD,
    GroupPlan,
    Member,
    Node,
    Placement,
    Resources,
    holds_strictly,
    place,
    plan_groups,
)
from parityserve.runtime.fleet.placement_plan import deployment_members, slot_key
from parityserve.runtime.fleet.processes import niceness_env, wait_child
from parityserve.runtime.workers.keys import ENV_VAR, ClientKeys
from parityserve.runtime.workers.worker import WorkerSpec

__all__ = ["NAMESPACE", "SUSPECT_NODES", "RayLauncher", "RayReplica", "SuspectNodes",
           "actor_exit", "alive_nodes", "connect_ray", "node_of", "ray_bundle", "reachable"]

log = logging.getLogger(__name__)

NAMESPACE = "parityserve"
# A replica's or a member's end is watched by one call kept in flight that returns when the
# process exits or after this long (``ActorExit``): a long-poll, where a poll call every
# 50 ms per graph member cost each member's actor 4-8% of a core, and the frontend as much.
WAIT_EXIT_S = 10.0
ACTOR_THREADS = 3  # an actor's calls: the exit long-poll beside a stop, a signal, a where
SUSPECT_S = 60.0  # how long a node where something of ours was lost unasked is avoided
ACTOR_DIED = -9  # the exit code reported when the actor (or its node) died under the worker


class SuspectNodes:
    """Nodes where a replica or a graph member of this frontend was lost unasked in the last
    ``SUSPECT_S``: a crashed machine stays alive to Ray until its health checks give up on it
    (about 12 s on the test cluster), and what is placed there meanwhile dies with it. One per
    process (``SUSPECT_NODES``), shared by the replicas' launcher and the graphs' member
    launchers: a graph member lost by its silence is the first sign, within the heartbeat
    timeout, and the model replicas' replacements avoid that node too (before, they went
    there and died about 12 s later, when Ray declared the node dead)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._until: dict[str, float] = {}  # node id -> until when it is avoided

    def mark(self, node_id: str, *, renew: bool = True) -> None:
        """``renew`` False: keep an earlier mark's end (a death Ray reports again and again)."""
        until = self.clock() + SUSPECT_S
        self._until[node_id] = until if renew else self._until.get(node_id, until)

    def current(self) -> set[str]:
        now = self.clock()
        self._until = {n: t for n, t in self._until.items() if t > now}
        return set(self._until)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self.current()

    def __bool__(self) -> bool:
        return bool(self.current())

    def clear(self) -> None:
        self._until.clear()


SUSPECT_NODES = SuspectNodes()


@ray.remote(max_restarts=0, max_concurrency=ACTOR_THREADS)  # type: ignore[call-overload]
class ReplicaActor:
    """One worker process on this actor's node. The worker dies with the actor (it asks the
    kernel for SIGTERM when its parent exits), so a killed actor or node leaves no orphan."""

    def __init__(self, connect: str, spec_json: str, env: dict[str, str]) -> None:
        cmd = [sys.executable, "-m", "parityserve.runtime.workers.worker", "--connect", connect,
               "--spec", spec_json, "--die-with-parent", "--parent-pid", str(os.getpid()),
               "--no-bye"]
        full_env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
        self.popen = subprocess.Popen(cmd, env={**full_env, **env}, stdin=subprocess.DEVNULL)

    def wait_exit(self, timeout_s: float) -> int | None:
        """The worker's exit code once it exits, or None after ``timeout_s`` (a long-poll)."""
        return wait_child(self.popen, timeout_s)

    def node_id(self) -> str:
        return str(ray.get_runtime_context().get_node_id())

    def stop(self, grace_s: float) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                return self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
        return self.popen.wait()


class RayReplica:
    """A handle on one replica actor, as ``launcher.WorkerProcess`` is on a subprocess.

    ``exit_code`` never blocks: it keeps one ``wait_exit`` long-poll in flight
    (``ActorExit``) and looks at a flag Ray's thread sets, so the supervisor can ask every
    tick.
    """

    def __init__(self, spec: WorkerSpec, actor: Any, node_id: str | None,
                 group: Any = None) -> None:
        self.spec = spec
        self.actor = actor
        self.pinned = node_id  # where placement pinned it (None: a placement group, or Ray)
        self.group = group  # the Ray placement group it runs in, if any
        self._where: Any = None if node_id is not None else actor.node_id.remote()
        self._node_id = node_id
        self.death: str | None = None
        self.interim = False  # outside its group while its bundle is unsafe (no reservation)
        self._code: int | None = None
        self._exit = ActorExit(actor, f"replica {spec.replica_id}")

    @property
    def pid(self) -> int:
        return 0  # on another host; the worker's hello reports its own pid

    @property
    def node_id(self) -> str | None:
        """Its node: where it was pinned, or where Ray put it once the actor says (never
        blocks; None until then)."""
        if self._node_id is None and self._where is not None and ray.wait(
                [self._where], timeout=0)[0]:
            with contextlib.suppress(RayError):
                self._node_id = ray.get(self._where)
            self._where = None
        return self._node_id

    def exit_code(self) -> int | None:
        if self._code is None:
            self._code = self._exit.check()
            self.death = self._exit.death or self.death
        return self._code

    def kill(self) -> None:
        self._code = self._code if self._code is not None else ACTOR_DIED
        # The supervisor kills from its periodic round: an actor already gone with its node
        # must not raise there (it would stop the round, and every later restart with it).
        with contextlib.suppress(RayError, ValueError):
            ray.kill(self.actor, no_restart=True)

    def terminate(self, grace_s: float = 2.0) -> None:
        """SIGTERM to the worker through its actor, then end the actor."""
        # already gone, or its node is: killing the actor below is all that is left
        with contextlib.suppress(RayError, GetTimeoutError):
            ray.get(self.actor.stop.remote(grace_s), timeout=grace_s + 3)
        self.kill()


def reachable(connect: str, node_ip: str) -> str:
    """The address workers on other nodes dial: a frontend bound to every interface
    (0.0.0.0, ::) is reached at this node's IP, as Ray knows it."""
    head, _, port = connect.rpartition(":")
    host = head.removeprefix("tcp://")
    if host in ("0.0.0.0", "*", "::", "[::]"):
        return f"tcp://{node_ip}:{port}"
    return connect


def connect_ray(address: str | None) -> bool:
    """Connect this process to the Ray at ``address`` ('auto', ray://HOST:PORT, or None for a
    private local Ray) in our namespace, unless it is connected already (the graphs' member
    launcher joins the Ray the model launcher connected to). True when this call connected."""
    if ray.is_initialized():
        return False
    ray.init(address=address, namespace=NAMESPACE, include_dashboard=False,
             log_to_driver=True, configure_logging=False)
    return True


def alive_nodes() -> list[Node]:
    """The nodes Ray reports alive, with their total CPU, GPU and memory."""
    return [node_of(info) for info in ray.nodes() if info.get("Alive")]


class ActorExit:
    """An actor's end, watched without ever blocking: one ``wait_exit`` call of the actor
    always in flight (it returns when the actor's process exits, or None after ``wait_s``,
    and is then sent again), looked at through ``done_flag``. The actor's death (killed, or
    its node lost) fails the call in flight as soon as Ray knows. ``check`` is the exit code
    once the actor's process exited, or ``ACTOR_DIED`` once the actor did (then ``death``
    says why); None while it runs. The handles on replica actors (``RayReplica``) and on
    graph members' actors (``ray_operators``) each hold one."""

    def __init__(self, actor: Any, what: str, wait_s: float = WAIT_EXIT_S) -> None:
        self.actor, self.what, self.wait_s = actor, what, wait_s
        self.code: int | None = None
        self.death: str | None = None
        self._poll: Any = None
        self._polled = threading.Event()  # set by Ray's thread when ``_poll`` finished

    def check(self) -> int | None:
        if self.code is not None:
            return self.code
        if self._poll is None:
            self._poll = self.actor.wait_exit.remote(self.wait_s)
            self._polled = done_flag(self._poll)
        if self._polled.is_set():  # (a call is always in flight here)
            ref, self._poll = self._poll, None
            self.code, death = actor_exit(lambda: ray.get(ref), self.what)
            self.death = death or self.death
        return self.code


def done_flag(ref: Any) -> threading.Event:
    """Set once ``ref``'s call has finished (an answer, or the actor's death), by Ray's own
    thread: the caller looks at the flag, never asks Ray. (``ray.wait(timeout=0)`` per member
    every 10 ms, on the frontend's loop, was 45% of that loop's busy samples in the 4-node
    graph test: py-spy, 2026-11-29.) Only a flag is set there: a Ray call from that thread
    deadlocked ``ray.shutdown``."""
    flag = threading.Event()
    ref.future().add_done_callback(lambda _: flag.set())
    return flag


def actor_exit(answer: Callable[[], int | None], what: str) -> tuple[int | None, str | None]:
    """What an actor's ``wait_exit`` call came back with (``answer`` fetches it: ``ray.get`` of the
    call): ``(exit code, None)``, the code None while its process runs; or ``(ACTOR_DIED,
    why)`` when the actor itself died under it (killed, out of memory, or its node gone), with
    a warning naming ``what`` it held. Replicas and graph members alike."""
    try:
        return answer(), None
    except RayError as exc:
        death = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        log.warning("%s: its Ray actor died (%s)", what, death)
        return ACTOR_DIED, death


def node_of(info: dict[str, Any]) -> Node:
    """One record of ``ray.nodes()`` as placement sees it."""
    res = info.get("Resources", {})
    return Node(info["NodeID"], Resources(res.get("CPU", 0.0), res.get("GPU", 0.0),
                                          res.get("memory", 0.0)))


def ray_bundle(demand: Resources) -> dict[str, float]:
    """A bundle of Ray resources. Ray refuses an empty one, so a replica that asks for
    nothing holds its place with a hundredth of a CPU."""
    bundle = {"CPU": demand.cpu, "GPU": demand.gpu, "memory": demand.memory}
    return {k: v for k, v in bundle.items() if v > 0} or {"CPU": 0.01}


class RayLauncher:
    """Starts replicas as Ray actors placed by ``core/placement.py``.

    It connects to ``address`` ('auto', ray://HOST:PORT, or None for a private local Ray)
    unless this process is already connected; it shuts down only a Ray it started itself.
    """

    def __init__(self, connect: str, address: str | None = None) -> None:
        self.started_ray = False
        self.groups: dict[str, tuple[GroupPlan, Any]] = {}  # plan name -> (plan, Ray's group)
        self.retired: list[Any] = []  # groups no plan needs, removed once nothing runs in them
        self._generation = 0
        # Ray refuses a second placement group of the same name in a namespace, so each
        # launcher's names carry a tag of their own: other frontends on this cluster (shards,
        # pods) and a restarted frontend whose old groups Ray has not removed yet can all
        # deploy the same model.
        self._tag = secrets.token_hex(4)
        self.started_ray = connect_ray(address) and address is None
        self.connect = reachable(connect, ray.util.get_node_ip_address())
        self.deployments: dict[tuple[str, int], Deployment] = {}
        self.running: dict[str, RayReplica] = {}  # slot key -> its latest replica
        self.placement = Placement()
        self.latest: tuple[str, int] | None = None
        self.suspects = SUSPECT_NODES  # shared with the graphs' member launchers

    def note_deployment(self, deployment: Deployment) -> None:
        """The supervisor is about to launch for ``deployment``: place by its groups."""
        self.deployments[(deployment.name, deployment.version)] = deployment
        self.latest = (deployment.name, deployment.version)

    def start(self, spec: WorkerSpec, keys: ClientKeys | None = None) -> RayReplica:
        key = slot_key(spec.replica_id)
        before = self.running.get(key)  # the replica this one replaces, if any
        members = self._members()
        member = next((m for m in members if m.key == key), Member(key, spec.model))
        nodes = self._trusted_nodes()
        group, bundle = self._group_for(key, members, nodes)
        previous = before.node_id if before is not None else None
        node_id = None
        if before is not None and group is not None and member.demand.gpu == 0:
            node_id = self._interim_node(key, group, bundle, members, nodes, previous)
        interim = node_id is not None
        if group is not None and not interim:
            strategy: Any = PlacementGroupSchedulingStrategy(group, bundle)
        else:
            node_id = node_id or self._place(key, members, nodes, previous)
            strategy = ("SPREAD" if node_id is None
                        else NodeAffinitySchedulingStrategy(node_id, soft=False))
        env = {"OMP_NUM_THREADS": str(spec.threads), "MKL_NUM_THREADS": str(spec.threads),
               **niceness_env()}
        if keys is not None:
            env[ENV_VAR] = keys.to_env()
        actor = ReplicaActor.options(  # type: ignore[attr-defined]
            name=spec.replica_id, namespace=NAMESPACE,
            # an interim replica reserves no CPU or memory: its bundle, moved by Ray in the
            # end, still holds them, and a second reservation took the room the graphs'
            # members were placed into (they waited pending, never apart)
            num_cpus=0 if interim else member.demand.cpu, num_gpus=member.demand.gpu,
            memory=None if interim else int(member.demand.memory) or None,
            scheduling_strategy=strategy,
        ).remote(self.connect, spec.to_json(), env)
        replica = RayReplica(spec, actor, node_id, None if interim else group)
        replica.interim = interim
        self.running[key] = replica
        self._remove_retired()
        return replica

    # ---- placement groups ------------------------------------------------------------------
    def _group_for(self, key: str, members: list[Member], nodes: list[Node]
                   ) -> tuple[Any, int]:
        """The placement group (and bundle) slot ``key`` runs in, created on first need; None
        when its STRICT_SPREAD group has lost a node it cannot do without."""
        plans = plan_groups(members, nodes)
        self._retire_unneeded({p.name for p in plans})
        plan = next((p for p in plans if key in p.members), None)
        if plan is None:
            return None, 0
        held = self.groups.get(plan.name)
        if held is None or (held[0].members, held[0].bundles) != (plan.members, plan.bundles):
            if held is not None:  # the deployment changed shape: a group for the new shape
                self.retired.append(self.groups.pop(plan.name)[1])
            if not plan.fits:
                log.warning("placement: %s; its members are placed one by one", plan.note)
                return None, 0
            held = self.groups[plan.name] = (plan, self._create(plan))
        elif held[0].strategy == STRICT_SPREAD and not holds_strictly(plan.bundles, nodes):
            log.warning("placement group %s: its %d members need distinct nodes but too few "
                        "live nodes can hold one, so Ray cannot bring back its lost bundle; %s "
                        "is placed outside it", plan.name, len(plan.members), key)
            return None, 0
        return held[1], held[0].members.index(key)

    def _interim_node(self, key: str, group: Any, bundle: int, members: list[Member],
                      nodes: list[Node], previous: str | None) -> str | None:
        """The node a replacement for slot ``key`` runs on outside its group, or None: its
        bundle is safe (or the GCS cannot say), or no trusted node has room for it. A bundle
        is unsafe on a node where something was just lost (Ray keeps a crashed node's bundles
        until its health checks give up, and a replacement sent there died with the node
        about 12 s later, the graph's stateless stage with it: failovers of 7, 14 and 17 s
        in quick runs of ``benchmarks.hams_nodes``), or while Ray moves it off a dead node
        (it waits there for as long). One GCS call, for replacements only. GPU replicas are
        never interim: the GPU would be reserved twice, or the node have none."""
        try:
            table = placement_group_table(group)
        except Exception:
            return None
        where = table.get("bundles_to_node_id", {}).get(bundle)
        moving = table.get("state") == "RESCHEDULING" and not where
        if not (moving or where in self.suspects):
            return None
        node_id = self._place(key, members, nodes, previous)  # (trusted nodes only)
        if node_id is None or node_id in self.suspects:
            return None  # no room elsewhere: its bundle, as before
        log.warning("placement: %s's bundle is %s; the replacement runs on node %s outside "
                    "its group meanwhile (an interim replica, which reserves no CPU or "
                    "memory: the bundle still holds them), and goes back into its bundle at "
                    "its slot's next restart", key, "being moved by Ray" if moving else (
                        f"on node {where}, where something was just lost (Ray lists it "
                        "alive until its health checks give up)"), node_id)
        return node_id

    def _create(self, plan: GroupPlan) -> Any:
        if plan.note:
            log.warning("placement: %s", plan.note)
        self._generation += 1
        return placement_group([ray_bundle(b) for b in plan.bundles], strategy=plan.strategy,
                               name=f"{plan.name}#{self._tag}-{self._generation}")

    def _retire_unneeded(self, needed: set[str]) -> None:
        for name in [n for n in self.groups if n not in needed]:
            self.retired.append(self.groups.pop(name)[1])

    def _remove_retired(self) -> None:
        """Remove retired groups none of our running replicas is in (removing one kills the
        actors in it)."""
        in_use = {id(r.group) for r in self.running.values()
                  if r.group is not None and r.exit_code() is None}
        for group in [g for g in self.retired if id(g) not in in_use]:
            self.retired.remove(group)
            with contextlib.suppress(RayError, ValueError):
                remove_placement_group(group)

    def _members(self) -> list[Member]:
        """Slots of the deployments still running here (and of the one being launched)."""
        live = {(r.spec.model, r.spec.version) for r in self.running.values()
                if r.exit_code() is None}
        self.deployments = {k: d for k, d in self.deployments.items()
                            if k in live or k == self.latest}
        return deployment_members(self.deployments.values())

    def _place(self, key: str, members: list[Member], nodes: list[Node],
               previous: str | None) -> str | None:
        """The node for slot ``key``: every other running replica keeps its node, and a
        replacement avoids its predecessor's node (Ray may not have noticed yet that it is
        dead: our heartbeats time out sooner than its health checks)."""
        fixed = {k: r.node_id for k, r in self.running.items()
                 if k != key and r.node_id is not None and r.exit_code() is None}
        avoid = {key: previous} if previous is not None else None
        self.placement = place(members, nodes, fixed, avoid)
        for note in self.placement.notes:
            log.warning("placement: %s", note)
        if key in self.placement.unplaced:
            log.warning("placement: %s; leaving it to Ray's scheduler",
                        self.placement.unplaced[key])
        return self.placement.nodes.get(key)

    def _trusted_nodes(self) -> list[Node]:
        """Live nodes, less those where one of our actors died unasked in the last minute:
        a crashed machine stays 'alive' to Ray until its health checks give up on it."""
        for r in self.running.values():
            if r.death is not None and r.node_id is not None:
                self.suspects.mark(r.node_id, renew=False)
        avoid = self.suspects.current()
        nodes = alive_nodes()
        return [n for n in nodes if n.node_id not in avoid] or nodes

    def stop_all(self, procs: Iterable[object], grace_s: float = 2.0) -> None:
        """Stop the replicas among ``procs``; shut down Ray if this launcher started it."""
        for proc in procs:
            if isinstance(proc, RayReplica):
                proc.terminate(grace_s)
        self.running.clear()
        self._retire_unneeded(set())
        self._remove_retired()
        if self.started_ray:
            ray.shutdown()
