"""The supervisor: launches replicas, watches them, restarts the ones that fail, and keeps each
model at the replica counts its deployment asks for.

- A replica is launched ``starting``; its hello makes it ``ready``. One that never says hello
  within the startup timeout, whose process exits, or whose heartbeats stop (``health.py``) is
  killed, its batch requeued, and a fresh one launched in its slot.
- Restarts back off while a slot keeps failing without ever becoming ready, and stop after a
  few (``core/restarts.py``): the model is marked failed until an operator asks again.
- ``reconcile`` starts and stops replicas so every pool has the size a deployment asks for,
  within the server's worker budget.

It holds no event loop of its own: ``tick()`` does one round of checks and due restarts at the
injected clock's time, and processes come from an injected launcher, so unit tests drive it
with a fake launcher and a fake clock. ``system.py`` calls ``tick`` every 50 ms.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from parityserve.config import Deployment, Server
from parityserve.core.batching import AIMDController
from parityserve.core.restarts import RestartPolicy
from parityserve.core.scheduling import DATA_POOL, ReplicaState
from parityserve.errors import LimitExceeded
from parityserve.runtime.fleet.health import STARTUP_TIMEOUT_S, replica_failure
from parityserve.runtime.fleet.restart_tracker import Restart, RestartTracker, Slot
from parityserve.runtime.fleet.slots import (
    ONE_SHOT_FAULTS,
    emulation_spec,
    pool_model,
    slot_name,
    slot_of,
    worker_faults,
)
from parityserve.runtime.modelpath.dispatch import ModelPath, Replica, deployed_parity_pools
from parityserve.runtime.modelpath.metrics import Metrics
from parityserve.runtime.workers import messages
from parityserve.runtime.workers.commands import Command, SetFaults, SetThreads, Stop
from parityserve.runtime.workers.keys import ClientKeys
from parityserve.runtime.workers.worker import WorkerSpec

__all__ = ["Launcher", "Settings", "Supervisor", "WorkerHandle", "aimd_for"]

log = logging.getLogger(__name__)

class WorkerHandle(Protocol):
    """One launched worker process, as ``launcher.WorkerProcess`` is."""

    @property
    def pid(self) -> int: ...

    def exit_code(self) -> int | None: ...

    def kill(self) -> None:
        """End it now; never raises (it runs inside the supervisor's round)."""

    def terminate(self) -> None: ...


class Launcher(Protocol):
    """Starts worker processes, as ``launcher.LocalLauncher`` does."""

    def start(self, spec: WorkerSpec, keys: ClientKeys | None = None) -> WorkerHandle: ...


class Keyring(Protocol):
    """Keys per launched replica (``credentials.ReplicaCredentials``)."""

    def issue(self, rid: str) -> ClientKeys | None: ...

    def revoke(self, rid: str) -> None: ...


@dataclass(frozen=True)
class Settings:
    heartbeat_interval_s: float = 0.2
    heartbeat_timeout_s: float = 2.0
    max_local_workers: int = 64
    startup_timeout_s: float = STARTUP_TIMEOUT_S
    restarts: RestartPolicy = field(default_factory=RestartPolicy)
    base_dir: Path | None = None
    data_dir: Path | None = None

    @classmethod
    def from_server(cls, server: Server, base_dir: Path | None = None,
                    data_dir: Path | None = None) -> Settings:
        return cls(server.heartbeat_interval_ms / 1000, server.heartbeat_timeout_ms / 1000,
                   server.max_local_workers, base_dir=base_dir, data_dir=data_dir)


def aimd_for(path: ModelPath) -> AIMDController:
    """A fresh batch-size controller for one replica of ``path``."""
    b = path.deployment.batching
    return AIMDController(b.max_batch_size, path.slo_s, additive_step=b.additive_step,
                          backoff=b.backoff)


def _terminate_in_thread(process: WorkerHandle) -> None:
    """SIGTERM waits out a grace period: never on the event loop."""
    asyncio.get_running_loop().run_in_executor(None, process.terminate)


class Supervisor:
    """Launches, watches, restarts and reconciles the replicas of every model path."""

    def __init__(self, settings: Settings, *, models: dict[str, ModelPath],
                 launcher: Launcher, keyring: Keyring, send: Callable[[str, Command], None],
                 clock: Callable[[], float], metrics: Metrics,
                 make_path: Callable[[Deployment], ModelPath],
                 stop_process: Callable[[WorkerHandle], None] = _terminate_in_thread) -> None:
        self.settings = settings
        self.models = models  # the served version of each model, shared with the router
        self.retired: list[ModelPath] = []  # old versions finishing their queries
        self.launcher = launcher
        self.keyring = keyring
        self.send = send  # never raises: a gone worker is the health check's business
        self.clock = clock
        self.metrics = metrics
        self.make_path = make_path
        self.stop_process = stop_process
        self.replicas: dict[str, tuple[ModelPath, Replica]] = {}  # by replica id
        self.load_errors: dict[tuple[str, int], str] = {}  # (model, version) -> why
        self.restarts = RestartTracker(settings.restarts)
        self.closing = False
        # Processes told to stop whose SIGTERM grace may still run in a thread: shutting down
        # must still wait for them, or the server exits with workers (and Popens) unreaped.
        self.stopping: list[WorkerHandle] = []
        self._incarnations = itertools.count(1)

    # ---- launching -------------------------------------------------------------------------
    def launch_path(self, deployment: Deployment) -> ModelPath:
        """A new model path with every replica its deployment asks for launched."""
        path = self.make_path(deployment)
        self.reconcile(path, deployment)
        return path

    def launch(self, path: ModelPath, index: int, faults: dict[str, Any],
               pool: str = DATA_POOL) -> Replica:
        dep = path.deployment
        # The random part makes ids unguessable: nobody can claim a replica's id before it does.
        rid = (f"{dep.name}/v{dep.version}/{slot_name(index, pool)}"
               f"#{next(self._incarnations)}-{secrets.token_hex(8)}")
        process = self.launcher.start(self._spec(dep, rid, faults, pool),
                                      self.keyring.issue(rid))
        now = self.clock()
        replica = Replica(rid, index, aimd_for(path), now, process=process, pid=process.pid,
                          started_at=now, faults=faults, pool=pool)
        path.replicas[rid] = replica
        self.replicas[rid] = (path, replica)
        self.metrics.set_replica_up(path.name, str(index), False)
        return replica

    def _spec(self, dep: Deployment, rid: str, faults: dict[str, Any], pool: str) -> WorkerSpec:
        source, weights, options = pool_model(dep, pool)
        s = self.settings
        return WorkerSpec(
            replica_id=rid, model=dep.name, version=dep.version, source=source,
            weights=weights, options=options, threads=dep.threads_per_replica,
            base_dir=str(s.base_dir) if s.base_dir else None,
            data_dir=str(s.data_dir) if s.data_dir else None,
            faults=worker_faults(faults), heartbeat_interval_s=s.heartbeat_interval_s,
            emulation=emulation_spec(dep),
        )

    # ---- what replicas say -----------------------------------------------------------------
    def find(self, rid: str) -> tuple[ModelPath, Replica] | None:
        return self.replicas.get(rid)

    def ready(self, path: ModelPath, replica: Replica, hello: messages.Hello) -> None:
        """A hello: the replica serves from now on, and its slot's failures are forgiven."""
        if replica.state == ReplicaState.STARTING:
            self._sync_faults(replica)
            self._sync_threads(path, replica)
            replica.state = ReplicaState.READY
        self.load_errors.pop((path.name, path.version), None)
        self.restarts.ready((path.name, path.version, slot_of(replica)))
        replica.pid = hello.pid if hello.pid is not None else replica.pid
        path.platform = hello.platform or path.platform
        path.input_spec = path.input_spec or hello.input
        path.output_spec = path.output_spec or hello.output
        self.metrics.set_replica_up(path.name, str(replica.index), True)
        path.pump()

    def _sync_faults(self, replica: Replica) -> None:
        """Faults set while a worker was starting could not reach it: send them now."""
        launched = getattr(getattr(replica.process, "spec", None), "faults", None)
        wanted = worker_faults(replica.faults)
        if launched is not None and launched != wanted:
            self.send(replica.rid, SetFaults(wanted))

    def _sync_threads(self, path: ModelPath, replica: Replica) -> None:
        """Threads set while a worker was starting could not reach it: send them now."""
        launched = getattr(getattr(replica.process, "spec", None), "threads", None)
        wanted = path.deployment.threads_per_replica
        if launched is not None and launched != wanted:
            self.send(replica.rid, SetThreads(wanted))

    def heartbeat(self, replica: Replica, beat: messages.Heartbeat) -> None:
        """Record what the worker says it runs with (the acknowledgement of set_threads)."""
        if beat.threads is not None:
            replica.threads = beat.threads

    def set_threads(self, path: ModelPath, deployment: Deployment) -> None:
        """Every replica of ``path`` runs its next batches with the deployment's threads; no
        process restarts. Replicas launched later (or restarted) start with them."""
        path.deployment = deployment
        for replica in path.replicas.values():
            if replica.state == ReplicaState.READY:
                self.send(replica.rid, SetThreads(deployment.threads_per_replica))

    def join(self, rid: str, hello: messages.Hello) -> bool:
        """A worker started elsewhere (``parityserve worker --connect``) joins the model it
        names; False (and told to stop) when no such model and version is served."""
        path = self.models.get(hello.model)
        if path is None or hello.version != path.version:
            # Says what it asked for, never what is served: a stranger learns nothing here.
            self.send(rid, Stop(f"no model {hello.model!r} version {hello.version} here"))
            return False
        now = self.clock()
        replica = Replica(rid, -1, aimd_for(path), now, started_at=now)
        path.replicas[rid] = replica
        self.replicas[rid] = (path, replica)
        self.ready(path, replica, hello)
        return True

    def load_failed(self, path: ModelPath, replica: Replica, error: str) -> bool:
        """Only a replica this frontend launched, still starting, can say its model failed to
        load, and only for the model and version it was launched with (False: refused)."""
        if replica.process is None or replica.state != "starting":
            return False
        log.error("replica %s could not load its model: %s", replica.rid, error)
        self.load_errors[(path.name, path.version)] = error
        return True

    def forget(self, path: ModelPath, replica: Replica) -> None:
        """A worker said goodbye: its work goes back to the queue, nothing is restarted."""
        path.take_back(replica)
        self._drop(path, replica)
        path.pump()

    def _drop(self, path: ModelPath, replica: Replica) -> None:
        path.replicas.pop(replica.rid, None)
        self.replicas.pop(replica.rid, None)
        self.keyring.revoke(replica.rid)

    # ---- the periodic round ----------------------------------------------------------------
    def tick(self) -> None:
        """Replace failed replicas, expire stale queries, run due restarts, and stop old
        versions that have finished their work."""
        for path in [*self.models.values(), *self.retired]:
            self._check(path)
        self._run_due_restarts()
        self._reap_retired()

    def _check(self, path: ModelPath) -> None:
        now = self.clock()
        for replica in list(path.replicas.values()):
            reason = replica_failure(replica, now, self.settings.heartbeat_timeout_s,
                                     self.settings.startup_timeout_s)
            if reason is not None:
                self.replace(path, replica, reason)
        path.expire_stale(now)

    def replace(self, path: ModelPath, replica: Replica, reason: str) -> None:
        """A failed replica: requeue its batch, kill it, and start a fresh one in its place."""
        requeued = path.take_back(replica)
        log.warning("replica %s failed (%s); re-dispatching %d queries",
                    replica.rid, reason, requeued)
        self._drop(path, replica)
        if replica.process is not None:
            replica.process.kill()
        self.metrics.set_replica_up(path.name, str(replica.index), False)
        if replica.process is not None and replica.state != "retiring" and not self.closing:
            if replica.state == ReplicaState.STARTING and reason.startswith("process exited"):
                self.load_errors.setdefault(
                    (path.name, path.version),
                    f"model {path.name!r} ({path.deployment.source}): the worker {reason} "
                    "before it was ready; see its stderr")
            self.metrics.restart(path.name, str(replica.index))
            faults = {k: v for k, v in replica.faults.items() if k not in ONE_SHOT_FAULTS}
            self._relaunch_later(path, replica.index, faults, replica.pool)
        path.pump()

    # ---- restarts --------------------------------------------------------------------------
    def _relaunch_later(self, path: ModelPath, index: int, faults: dict[str, Any],
                        pool: str) -> None:
        """Restart at once after a first failure; back off exponentially while it keeps failing
        without ever becoming ready, and give up after a few (a model that cannot load must
        not spin, nor run a load-time payload again and again)."""
        slot = (path.name, path.version, slot_name(index, pool))
        failures, delay = self.restarts.failed(slot)
        if delay is None:
            self._give_up(path, slot, failures)
        elif delay == 0.0:
            self.launch(path, index, faults, pool)
        else:
            log.warning("restarting replica %d of %s in %.2fs (%d failures in a row)",
                        index, path.name, delay, failures)
            self.restarts.wait(Restart(self.clock() + delay, path, index, faults, pool))

    def _give_up(self, path: ModelPath, slot: Slot, failures: int) -> None:
        error = self.load_errors.setdefault(
            (path.name, path.version),
            f"model {path.name!r}: replica {slot[2]} failed {failures} times in a row")
        log.error("giving up on replica %s of %s v%d after %d failures in a row without "
                  "becoming ready (%s); set its replicas or deploy a new version to try again",
                  slot[2], path.name, path.version, failures, error)

    def _run_due_restarts(self) -> None:
        for restart in self.restarts.due(self.clock()):
            self._relaunch(restart)

    def _relaunch(self, restart: Restart) -> None:
        """A delayed restart, unless the slot is no longer wanted or already taken."""
        path, index, pool = restart.path, restart.index, restart.pool
        live = self.models.get(path.name) is path or path in self.retired
        taken = any(r.index == index and r.pool == pool and r.process is not None
                    for r in path.replicas.values())
        wanted = (path.deployment.data_replicas() if pool == DATA_POOL
                  else path.deployment.parity_replicas())
        if live and not taken and not self.closing and index < wanted:
            self.launch(path, index, restart.faults, pool)

    def forgive(self, path: ModelPath) -> None:
        """An operator asked again: slots given up on get their full number of tries."""
        self.restarts.forgive(path.name, path.version)

    def gave_up_on(self, path: ModelPath) -> bool:
        return self.restarts.gave_up_on(path.name, path.version)

    def load_error(self, path: ModelPath) -> str | None:
        return self.load_errors.get((path.name, path.version))

    # ---- desired state ---------------------------------------------------------------------
    def reconcile(self, path: ModelPath, deployment: Deployment) -> None:
        """Start or stop replicas so every pool has the size ``deployment`` asks for."""
        note = getattr(self.launcher, "note_deployment", None)
        if note is not None:  # a cluster launcher places by the deployment's coding groups
            note(deployment)
        pools = {r.pool for r in path.replicas.values()}
        wanted = {DATA_POOL: deployment.data_replicas(),
                  **dict.fromkeys(deployed_parity_pools(deployment), deployment.parity_replicas())}
        for pool, count in wanted.items():
            managed = sorted((r for r in path.replicas.values()
                              if r.process is not None and r.pool == pool), key=lambda r: r.index)
            for index in range(len(managed), count):
                faults = deployment.faults_for(index).model_dump() if pool == DATA_POOL else {}
                self.launch(path, index, faults, pool)
            self.stop_replicas(path, managed[count:])
        gone = pools - set(wanted)
        self.stop_replicas(path, [r for r in path.replicas.values() if r.pool in gone])
        path.deployment = deployment

    def stop_replicas(self, path: ModelPath, replicas: list[Replica]) -> None:
        for replica in replicas:
            replica.state = ReplicaState.RETIRING
            path.take_back(replica)
            self.send(replica.rid, Stop())
            self._drop(path, replica)
            if replica.process is not None:
                self._stop(replica.process)
        path.pump()

    def _stop(self, process: WorkerHandle) -> None:
        self.stopping = [p for p in self.stopping if p.exit_code() is None]
        self.stopping.append(process)
        self.stop_process(process)

    def retire(self, path: ModelPath) -> None:
        """An old version: it keeps its replicas until its queue and batches are done."""
        self.retired.append(path)

    def _reap_retired(self) -> None:
        for path in list(self.retired):
            if len(path.queue) == 0 and not path.inflight:
                self.stop_replicas(path, list(path.replicas.values()))
                self.retired.remove(path)

    def check_worker_budget(self, deployment: Deployment, replacing: ModelPath | None) -> None:
        """Refuse a change that would run more worker processes here than the server allows.

        Why a cap at all: each replica is a process with a model in memory, so one admin
        request asking for hundreds of them could take the host down. Workers that joined
        from other machines (no process of ours) do not count. A rolling deploy counts the
        old version too, since both run until the new one is ready.
        """
        limit = self.settings.max_local_workers
        running = sum(r.process is not None for p in [*self.models.values(), *self.retired]
                      for r in p.replicas.values())
        freed = 0 if replacing is None else sum(
            r.process is not None for r in replacing.replicas.values())
        wanted = deployment.worker_processes()
        if running - freed + wanted > limit:
            raise LimitExceeded(
                f"model {deployment.name!r} would need {wanted} worker processes and "
                f"{running - freed} already run here: more than server.max_local_workers = "
                f"{limit}. Scale other models down, or raise the limit in the config")

    # ---- readiness and shutdown --------------------------------------------------------------
    def starting(self) -> list[str]:
        """Ids of the served replicas that have not said hello yet."""
        return [r.rid for p in self.models.values() for r in p.replicas.values()
                if r.state == ReplicaState.STARTING]

    def shut_down(self) -> list[WorkerHandle]:
        """Tell ready workers to stop, answer everything still waiting, and return the
        processes to end (a starting worker is not listening yet: it gets SIGTERM)."""
        self.closing = True
        paths = [*self.models.values(), *self.retired]
        for path in paths:
            for replica in path.replicas.values():
                if replica.state == ReplicaState.READY:
                    self.send(replica.rid, Stop())
            path.fail_all("server shutting down")
        serving = [r.process for p in paths for r in p.replicas.values() if r.process is not None]
        return [*serving, *(p for p in self.stopping if p.exit_code() is None)]
