"""Stateful graph operators as Ray actors (issue 41): one actor per member, on a chosen node.

The actor only holds the operator process, as ``ray_launcher.ReplicaActor`` holds a replica's
worker: it runs the same command line the local launcher runs (``zygote.command_of(OPERATOR,
...)``) as its child, with the member's CURVE keys in the child's environment, never its command
line. The operator speaks to the frontend and to its backup over ZeroMQ, never through Ray.

``RayOperatorProcess`` is the frontend's handle, with ``ProcessHandle``'s ``poll``/``pid``/
``kill``/``wait`` so that ``hams_members.Member`` and the graph's watchdog use it unchanged. It
never blocks on a live actor: it keeps one ``wait_exit`` long-poll in flight and looks at a
flag Ray's thread sets (``ActorExit``). An actor that dies under it (killed, or its node
lost) fails that call, and the handle reports an exit (``ACTOR_DIED``): detection by Ray's own
report, with the graph's heartbeats as the backstop for a machine Ray has not yet given up on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from parityserve.core.placement import Node, Resources
from parityserve.runtime.fleet.processes import log_file, niceness_env, wait_child, worker_env
from parityserve.runtime.fleet.ray_launcher import (
    ACTOR_DIED,
    ACTOR_THREADS,
    NAMESPACE,
    ActorExit,
    node_of,
)
from parityserve.runtime.fleet.zygote import OPERATOR, command_of
from parityserve.runtime.workers.keys import ENV_VAR

__all__ = ["OperatorActor", "RayOperatorProcess", "free_resources", "live_nodes",
           "start_operator"]

log = logging.getLogger(__name__)


@ray.remote(max_restarts=0, max_concurrency=ACTOR_THREADS)  # type: ignore[call-overload]
class OperatorActor:
    """One operator process on this actor's node. The operator asks the kernel for SIGTERM when
    its parent exits (``hams_worker.main``), so a killed actor or node leaves no orphan."""

    def __init__(self, args: list[str], keys_env: str | None, ipc_dir: str,
                 log_dir: str | None, name: str, frontend_env: dict[str, str]) -> None:
        if ipc_dir:  # the frontend made it on its own host; on another node it is made here
            os.makedirs(ipc_dir, mode=0o700, exist_ok=True)
        env = {**worker_env(1, None), **frontend_env}
        if keys_env is not None:
            env[ENV_VAR] = keys_env
        stderr = None
        with contextlib.suppress(OSError):  # a log folder this node cannot write: inherit
            stderr = log_file(Path(log_dir), name) if log_dir else None
        try:
            self.popen = subprocess.Popen(command_of(OPERATOR, args), env=env,
                                          stdin=subprocess.DEVNULL, stderr=stderr)
        finally:
            if stderr is not None:
                os.close(stderr)

    def wait_exit(self, timeout_s: float) -> int | None:
        """The operator's exit code once it exits, or None after ``timeout_s`` (a long-poll:
        ``ActorExit``)."""
        return wait_child(self.popen, timeout_s)

    def where(self) -> tuple[str, str, int]:
        """(Ray node id, host name, the operator's pid)."""
        return (str(ray.get_runtime_context().get_node_id()), socket.gethostname(),
                self.popen.pid)

    def send_signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)

    def stop(self) -> None:
        """SIGKILL the operator, reap it, and end this actor (Ray counts it an intended exit)."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()
        ray.actor.exit_actor()


class RayOperatorProcess:
    """The frontend's handle on one operator actor (see the module docstring)."""

    def __init__(self, actor: Any, node_id: str | None) -> None:
        self.actor = actor
        self.node_id = node_id  # where it was pinned; where Ray put it once ``where`` says
        self.returncode: int | None = None
        self.death: str | None = None  # why Ray says the actor died, when it did
        self.host: str | None = None
        self._pid = 0
        self._where: Any = actor.where.remote()
        self._exit = ActorExit(actor, f"operator on node {node_id}")

    @property
    def pid(self) -> int:
        """The operator's pid on its node (0 until the actor says)."""
        self._look_where()
        return self._pid

    @pid.setter
    def pid(self, value: int) -> None:  # ProcessHandle declares a plain attribute
        self._pid = value

    @property
    def local(self) -> bool:
        """Whether it runs on this host, where ``/proc`` can tell starved from hung."""
        self._look_where()
        return self.host == socket.gethostname()

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._exit.check()
            self.death = self._exit.death or self.death
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired("operator actor", timeout or 0.0)
            time.sleep(0.01)
        return code

    def send_signal(self, sig: int) -> None:
        if sig == signal.SIGKILL:
            self.kill()
        else:
            with contextlib.suppress(RayError):
                self.actor.send_signal.remote(sig)

    def kill(self) -> None:
        """SIGKILL the operator and end the actor, both done by the actor itself (a demoted
        member must send nothing more, and its own death-with-parent signal is a SIGTERM it
        may take time over). Fire and forget: it runs on the frontend's loop, also for a
        member whose node is gone and cannot answer. (No ``ray.kill`` from a done-callback:
        that runs on Ray's own thread and deadlocked ``ray.shutdown``.) Never raises."""
        self.returncode = ACTOR_DIED if self.returncode is None else self.returncode
        with contextlib.suppress(RayError, ValueError):
            self.actor.stop.remote()

    def _look_where(self) -> None:
        if self._where is None or not ray.wait([self._where], timeout=0)[0]:
            return
        with contextlib.suppress(RayError):
            node, self.host, self._pid = ray.get(self._where)
            self.node_id = self.node_id or node
        self._where = None


def start_operator(args: list[str], *, keys_env: str | None, ipc_dir: str,
                   log_dir: Path | None, name: str, node_id: str | None,
                   demand: Resources) -> RayOperatorProcess:
    """An operator actor pinned to ``node_id`` (hard affinity: placement chose it so that one
    node's loss takes at most one member of the operator), or spread by Ray when None."""
    strategy: Any = ("SPREAD" if node_id is None
                     else NodeAffinitySchedulingStrategy(node_id, soft=False))
    actor = OperatorActor.options(  # type: ignore[attr-defined]
        name=name, namespace=NAMESPACE, num_cpus=demand.cpu, num_gpus=demand.gpu,
        memory=int(demand.memory) or None, scheduling_strategy=strategy,
    ).remote(args, keys_env, ipc_dir, str(log_dir) if log_dir else None, name,
             niceness_env())  # the frontend's niceness, not Ray's 15 (``take_niceness``)
    return RayOperatorProcess(actor, node_id)


def live_nodes() -> tuple[list[Node], dict[str, str]]:
    """The nodes Ray reports alive (``ray_launcher.alive_nodes``'s records), and each one's
    address, which its processes bind and are reached at: one call to the GCS, made on the
    frontend's loop for each member started."""
    infos = [n for n in ray.nodes() if n.get("Alive")]
    nodes = [node_of(info) for info in infos]
    return nodes, {n["NodeID"]: n["NodeManagerAddress"] for n in infos}


def free_resources() -> dict[str, Resources]:
    """Node id -> what Ray says is unreserved on it now (replicas, members, placement groups
    all taken off): one GCS call. Empty when Ray cannot say (placement then reads totals)."""
    from ray._private import state  # Ray's own figure; no public per-node form in 2.60

    try:
        per_node = state.available_resources_per_node()
    except Exception as exc:  # an older or newer Ray without it: totals, as before
        log.warning("graph placement: Ray's free resources per node unreadable (%s); "
                    "placing by node totals", exc)
        return {}
    return {node: Resources(res.get("CPU", 0.0), res.get("GPU", 0.0), res.get("memory", 0.0))
            for node, res in per_node.items()}
