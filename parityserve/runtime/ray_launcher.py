"""Starts worker replicas as Ray actors on a cluster, each pinned to the node placement chose.

Ray is the control plane only. Each replica is one actor that reserves the deployment's CPUs,
GPUs and memory on its node and runs the ordinary worker (``python -m
parityserve.runtime.worker``) as its child. The worker connects back to the frontend over the
ZeroMQ data plane with its own CURVE keys, exactly as a local one does: queries and outputs
never pass through Ray's object store.

- Placement: ``core/placement.py`` puts the members of each coding group on distinct nodes
  (and spreads a model's replicas) over the nodes Ray reports alive, and the actor is pinned
  there with a hard NodeAffinity. When no node has room the actor is left to Ray's SPREAD
  scheduler, which queues it until resources free up, and the reason is logged.
- Keys: the replica's CURVE secret rides in the actor's constructor arguments (Ray's task
  spec, over Ray's gRPC; turn on Ray's TLS on an untrusted network) and reaches the worker in
  its environment, never its command line. Each key is per replica and revoked when the
  replica goes, so a leaked one admits only that one dead replica.
- Failure and restart: an actor is created with ``max_restarts=0``. When its worker exits,
  the actor dies, or its node dies, ``exit_code`` says so; the supervisor requeues the
  replica's batch and asks for a fresh replica, which placement puts on a surviving node. Ray
  restarting the actor itself would re-place it without knowing its coding group, and without
  the frontend requeuing what it held.

Only this module imports ray: the local launcher, and a plain install, need none.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from parityserve.config import Deployment
from parityserve.core.placement import Member, Node, Placement, Resources, place
from parityserve.runtime.keys import ENV_VAR, ClientKeys
from parityserve.runtime.placement_plan import deployment_members, slot_key
from parityserve.runtime.worker import WorkerSpec

__all__ = ["NAMESPACE", "RayLauncher", "RayReplica", "alive_nodes", "reachable"]

log = logging.getLogger(__name__)

NAMESPACE = "parityserve"
_POLL_EVERY_S = 0.2
SUSPECT_S = 60.0  # how long a node where an actor died unasked gets no new replicas
ACTOR_DIED = -9  # the exit code reported when the actor (or its node) died under the worker


@ray.remote(max_restarts=0)
class ReplicaActor:
    """One worker process on this actor's node. The worker dies with the actor (it asks the
    kernel for SIGTERM when its parent exits), so a killed actor or node leaves no orphan."""

    def __init__(self, connect: str, spec_json: str, env: dict[str, str]) -> None:
        cmd = [sys.executable, "-m", "parityserve.runtime.worker", "--connect", connect,
               "--spec", spec_json, "--die-with-parent", "--parent-pid", str(os.getpid())]
        full_env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
        self.popen = subprocess.Popen(cmd, env={**full_env, **env}, stdin=subprocess.DEVNULL)

    def poll(self) -> int | None:
        return self.popen.poll()

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

    ``exit_code`` never blocks: it keeps one ``poll`` call in flight and looks at it with a
    zero timeout, so the supervisor can ask every tick.
    """

    def __init__(self, spec: WorkerSpec, actor: Any, node_id: str | None) -> None:
        self.spec = spec
        self.actor = actor
        self.node_id = node_id  # where placement pinned it (None: left to Ray)
        self.death: str | None = None
        self._code: int | None = None
        self._poll: Any = None
        self._next_poll = 0.0

    @property
    def pid(self) -> int:
        return 0  # on another host; the worker's hello reports its own pid

    def exit_code(self) -> int | None:
        if self._code is not None:
            return self._code
        now = time.monotonic()
        if self._poll is None and now >= self._next_poll:
            self._poll, self._next_poll = self.actor.poll.remote(), now + _POLL_EVERY_S
        if self._poll is not None and ray.wait([self._poll], timeout=0)[0]:
            self._code, self._poll = self._collect(self._poll), None
        return self._code

    def _collect(self, ref: Any) -> int | None:
        try:
            code: int | None = ray.get(ref)
            return code
        except RayError as exc:  # the actor died: killed, out of memory, or its node is gone
            self.death = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
            log.warning("replica %s: its Ray actor died (%s)", self.spec.replica_id, self.death)
            return ACTOR_DIED

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


def alive_nodes() -> list[Node]:
    """The nodes Ray reports alive, with their total CPU, GPU and memory."""
    nodes = []
    for info in ray.nodes():
        if info.get("Alive"):
            res = info.get("Resources", {})
            nodes.append(Node(info["NodeID"], Resources(
                res.get("CPU", 0.0), res.get("GPU", 0.0), res.get("memory", 0.0))))
    return nodes


class RayLauncher:
    """Starts replicas as Ray actors placed by ``core/placement.py``.

    It connects to ``address`` ('auto', ray://HOST:PORT, or None for a private local Ray)
    unless this process is already connected; it shuts down only a Ray it started itself.
    """

    def __init__(self, connect: str, address: str | None = None) -> None:
        self.started_ray = False
        if not ray.is_initialized():
            ray.init(address=address, namespace=NAMESPACE, include_dashboard=False,
                     log_to_driver=True, configure_logging=False)
            self.started_ray = address is None
        self.connect = reachable(connect, ray.util.get_node_ip_address())
        self.deployments: dict[tuple[str, int], Deployment] = {}
        self.running: dict[str, RayReplica] = {}  # slot key -> its latest replica
        self.placement = Placement()
        self.latest: tuple[str, int] | None = None
        self.suspects: dict[str, float] = {}  # node id -> until when it is not trusted

    def note_deployment(self, deployment: Deployment) -> None:
        """The supervisor is about to launch for ``deployment``: place by its groups."""
        self.deployments[(deployment.name, deployment.version)] = deployment
        self.latest = (deployment.name, deployment.version)

    def start(self, spec: WorkerSpec, keys: ClientKeys | None = None) -> RayReplica:
        key = slot_key(spec.replica_id)
        before = self.running.get(key)  # the replica this one replaces, if any
        members = self._members()
        member = next((m for m in members if m.key == key), Member(key, spec.model))
        node_id = self._place(key, members, before.node_id if before is not None else None)
        env = {"OMP_NUM_THREADS": str(spec.threads), "MKL_NUM_THREADS": str(spec.threads)}
        if keys is not None:
            env[ENV_VAR] = keys.to_env()
        strategy: Any = ("SPREAD" if node_id is None
                         else NodeAffinitySchedulingStrategy(node_id, soft=False))
        actor = ReplicaActor.options(  # type: ignore[attr-defined]
            name=spec.replica_id, namespace=NAMESPACE, num_cpus=member.demand.cpu,
            num_gpus=member.demand.gpu, memory=int(member.demand.memory) or None,
            scheduling_strategy=strategy,
        ).remote(self.connect, spec.to_json(), env)
        replica = RayReplica(spec, actor, node_id)
        self.running[key] = replica
        return replica

    def _members(self) -> list[Member]:
        """Slots of the deployments still running here (and of the one being launched)."""
        live = {(r.spec.model, r.spec.version) for r in self.running.values()
                if r.exit_code() is None}
        self.deployments = {k: d for k, d in self.deployments.items()
                            if k in live or k == self.latest}
        return deployment_members(self.deployments.values())

    def _place(self, key: str, members: list[Member], previous: str | None) -> str | None:
        """The node for slot ``key``: every other running replica keeps its node, and a
        replacement avoids its predecessor's node (Ray may not have noticed yet that it is
        dead: our heartbeats time out sooner than its health checks)."""
        fixed = {k: r.node_id for k, r in self.running.items()
                 if k != key and r.node_id is not None and r.exit_code() is None}
        avoid = {key: previous} if previous is not None else None
        self.placement = place(members, self._trusted_nodes(), fixed, avoid)
        for note in self.placement.notes:
            log.warning("placement: %s", note)
        if key in self.placement.unplaced:
            log.warning("placement: %s; leaving it to Ray's scheduler",
                        self.placement.unplaced[key])
        return self.placement.nodes.get(key)

    def _trusted_nodes(self) -> list[Node]:
        """Live nodes, less those where one of our actors died unasked in the last minute:
        a crashed machine stays 'alive' to Ray until its health checks give up on it."""
        now = time.monotonic()
        for r in self.running.values():
            if r.death is not None and r.node_id is not None:
                self.suspects.setdefault(r.node_id, now + SUSPECT_S)
        self.suspects = {n: t for n, t in self.suspects.items() if t > now}
        nodes = alive_nodes()
        return [n for n in nodes if n.node_id not in self.suspects] or nodes

    def stop_all(self, procs: Iterable[object], grace_s: float = 2.0) -> None:
        """Stop the replicas among ``procs``; shut down Ray if this launcher started it."""
        for proc in procs:
            if isinstance(proc, RayReplica):
                proc.terminate(grace_s)
        self.running.clear()
        if self.started_ray:
            ray.shutdown()
