"""The serving system: the one object the edges talk to, composed of one part per job.

- ``face.py``: every inference request from every edge (``infer``): application, graph or
  model, decided once;
- ``router.py``: application queries and feedback (application → policy → model paths);
- ``model_infer.py``: V2 requests straight to one model;
- ``supervisor.py``: launching, watching, restarting and reconciling replicas;
- ``inbox.py``: where each worker message goes;
- ``admin_ops.py``: applications, deploys, scaling, redundancy and faults.

It satisfies ``runtime.serving.api.ServingSystem``. Everything here runs on one asyncio loop;
workers are separate processes reached only through ``WorkerLink``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from parityserve.config import (
    Application,
    Deployment,
    FaultConfig,
    Limits,
    ParityConfig,
    RedundancyConfig,
    SchedulerConfig,
    ServingConfig,
)
from parityserve.core.cache import ClockCache
from parityserve.errors import ConfigError, InvalidInput, ModelLoadError, Unavailable, WorkerError
from parityserve.models.extras import check_extras, deployment_needs, needed_extras
from parityserve.models.sources import scrub_paths
from parityserve.runtime.fleet.health import (
    STARTUP_TIMEOUT_S,
    holds_server_readiness,
    live_replicas,
)
from parityserve.runtime.fleet.inbox import Inbox
from parityserve.runtime.fleet.launcher import LocalLauncher, WorkerProcess
from parityserve.runtime.fleet.parallelism import Controllers, SystemApplier, build_policy
from parityserve.runtime.fleet.supervisor import Launcher, Settings, Supervisor
from parityserve.runtime.fleet.zygote import ForkServer, fork_server_for, preload_for
from parityserve.runtime.graphs.registry import Graphs, stateful_models
from parityserve.runtime.modelpath.dispatch import ModelPath, Replica
from parityserve.runtime.modelpath.loop_pressure import LoopPressure
from parityserve.runtime.modelpath.metrics import Metrics
from parityserve.runtime.serving.admin_ops import (
    AppAdmin,
    ModelAdmin,
    check_zoo_sources,
    revalidated,
    slo_for,
)
from parityserve.runtime.serving.api import Answer, InferenceRequest, ModelMetadata, Prediction
from parityserve.runtime.serving.applications import AppRuntime
from parityserve.runtime.serving.client_gate import ClientGate
from parityserve.runtime.serving.expected import expected_accuracy
from parityserve.runtime.serving.face import serve
from parityserve.runtime.serving.lookup import find_model
from parityserve.runtime.serving.model_infer import infer_rows
from parityserve.runtime.serving.router import QueryRouter
from parityserve.runtime.serving.state_store import StateStore, open_store
from parityserve.runtime.workers.commands import Command
from parityserve.runtime.workers.credentials import ReplicaCredentials, server_keys
from parityserve.runtime.workers.keys import ServerKeys
from parityserve.runtime.workers.rpc import RejectLog, WorkerLink

__all__ = ["ServingSystem", "keep_ticking"]

log = logging.getLogger(__name__)

_SUPERVISE_EVERY_S = 0.05


class ServingSystem:
    """Owns applications, model paths, the worker link and the supervisor loop."""

    def __init__(
        self,
        config: ServingConfig,
        *,
        base_dir: Path | None = None,
        data_dir: Path | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        log_dir: Path | None = None,
    ) -> None:
        self._graph_models = stateful_models(config)  # a clash is refused before anything starts
        check_extras(needed_extras(config))  # a missing framework, before any process starts
        for deployment in config.models:  # zoo:nope in the file: now, not in every worker
            if deployment.name not in self._graph_models:
                check_zoo_sources(deployment)
        self.config = config
        self.base_dir = base_dir
        self.data_dir = data_dir
        self.metrics = metrics or Metrics()
        self.clock = clock
        self.log_dir = log_dir
        self.cache: ClockCache[tuple[str, int, bytes], Any] = ClockCache(config.server.cache_bytes)
        # one count per client address over every edge: HTTP and gRPC draw on the same share
        limits = config.server.limits
        self.graph_gate = ClientGate(limits.max_graph_requests_per_address,
                                     limits.max_graph_requests_per_address_shared)
        # Shared by every model's path: there is one event loop to saturate.
        self.loop_pressure = LoopPressure()
        self.metrics.watch_event_loop(lambda: self.loop_pressure.level)
        self.metrics.watch_state(lambda: self)
        self.models: dict[str, ModelPath] = {}
        self.apps: dict[str, AppRuntime] = {
            a.name: AppRuntime.build(a) for a in config.applications}
        self.router = QueryRouter(self.apps, self.models, metrics=self.metrics, clock=clock,
                                  limits=config.server.limits)
        self.app_admin = AppAdmin(self.apps, self.models, lambda: self.router.store)
        self._reject = RejectLog(self.metrics.worker_rejected)
        self._link: WorkerLink | None = None
        self._credentials: ReplicaCredentials | None = None
        self._supervisor: Supervisor | None = None
        self._model_admin: ModelAdmin | None = None
        self._loop_task: asyncio.Task[None] | None = None
        # The parallelism controllers (issue 18): one task per model with a ``scheduler``.
        self.controllers = Controllers(self.models, SystemApplier(
            self.set_parallelism, self.set_threads), self.metrics, clock, base_dir,
            cores=os.cpu_count() or 1)
        self._ray: Any = None  # the RayLauncher, when the config asks for Ray
        # The zygote that local replicas and graph operators are forked from (fleet/zygote.py)
        self._forks: ForkServer | None = None
        self.graphs: Graphs | None = None  # stateful service graphs (HAMS), built at start

    # ---- lifecycle -------------------------------------------------------------------------
    @property
    def rpc_address(self) -> str:
        assert self._link is not None, "start() first"
        return self._link.address

    @property
    def store(self) -> StateStore:
        return self.router.store

    @property
    def supervisor(self) -> Supervisor:
        assert self._supervisor is not None, "start() first"
        return self._supervisor

    @property
    def _keys(self) -> ServerKeys | None:
        """The worker channel's CURVE keys; None while worker authentication is off."""
        return self._credentials.keys if self._credentials else None

    @property
    def _replica_keys(self) -> dict[str, bytes]:
        """Launched replica id -> the public key it must present."""
        return self._credentials.issued if self._credentials else {}

    async def start(
        self, *, wait_ready: bool = True, timeout_s: float = STARTUP_TIMEOUT_S
    ) -> None:
        server = self.config.server
        self.controllers.check(self.config.models)  # a bad scheduler profile fails first
        local = self.config.launcher.kind != "ray"  # Ray: replicas and members are actors
        self._forks = fork_server_for(server.fork_server, self.log_dir, preload_for(
            self.config, local_replicas=local, local_operators=local))
        if self._forks is not None:  # it imports while the rest starts
            self._forks.open()
        # Opened first: an unreachable Redis or unwritable SQLite file fails before any worker.
        self.router.store = await asyncio.to_thread(open_store, server.state_store,
                                                    base_dir=self.base_dir)
        keys = server_keys(server, self.base_dir)
        self._link = WorkerLink(server.host, server.rpc_port, keys=keys, on_reject=self._reject)
        self._credentials = ReplicaCredentials(keys, self._link)
        launcher = await asyncio.to_thread(self._make_launcher, self._link.address)
        self._supervisor = self._make_supervisor(launcher)
        self._model_admin = ModelAdmin(self._supervisor, self.clock)
        self._link.start(Inbox(self._supervisor, self._reject))
        if self._forks is not None:  # so that the first replicas are forked too
            await self._forks.wait_ready()
        for deployment in self.config.models:
            if deployment.name not in self._graph_models:  # a graph runs those itself
                self.models[deployment.name] = self._supervisor.launch_path(deployment)
        self._loop_task = asyncio.get_running_loop().create_task(self._supervise())
        self.controllers.start()
        if wait_ready:
            await self.wait_ready(timeout_s)
        self.graphs = Graphs(self.config, self._infer_outputs, keys=keys, clock=self.clock,
                             log_dir=self.log_dir, metrics=self.metrics, forks=self._forks)
        await self.graphs.start()

    async def _infer_outputs(self, model: str, rows: np.ndarray) -> np.ndarray:
        """A graph's stateless operator batch. Not through the prediction cache: its rows
        are mostly another operator's outputs, which do not repeat, and each filled an entry
        (two per request of the README's graph: the soak's frontend RSS rose 27 MB in 15
        minutes, and entries served by the model routes were evicted for them). Nor shared
        with an identical row in flight: the entry operator's rows, client inputs, may
        repeat, and are computed each time, as any operator's rows are."""
        outputs, _ = await infer_rows(find_model(self.models, model, None), rows, self.clock,
                                      cache=False)
        return outputs

    def _make_launcher(self, address: str) -> Launcher:
        """Local subprocesses, or Ray actors (``launcher: {kind: ray}``; ray loads only then)."""
        spec = self.config.launcher
        if spec.kind == "ray":
            try:
                from parityserve.runtime.fleet.ray_launcher import RayLauncher
            except ImportError as exc:
                raise ConfigError("launcher kind ray needs Ray installed: "
                                  f"pip install 'parityserve[ray]' ({exc})") from exc
            self._ray = RayLauncher(address, spec.address)
            return self._ray
        return LocalLauncher(address, log_dir=self.log_dir, forks=self._forks)

    def _make_supervisor(self, launcher: Launcher) -> Supervisor:
        assert self._credentials is not None
        return Supervisor(
            Settings.from_server(self.config.server, self.base_dir, self.data_dir),
            models=self.models, launcher=launcher,
            keyring=self._credentials, send=self._send_quietly, clock=self.clock,
            metrics=self.metrics, make_path=self._make_path)

    def _make_path(self, deployment: Deployment) -> ModelPath:
        assert self._link is not None, "start() first"
        return ModelPath(
            deployment, link=self._link, metrics=self.metrics, cache=self.cache,
            clock=self.clock, slo_s=slo_for(self.apps, deployment.name, deployment),
            max_queue=self.config.server.max_queue,  # None: derived (core/admission.py)
            expected=expected_accuracy(deployment, self.base_dir),
            saturated=self.loop_pressure.saturated,
        )

    async def _supervise(self) -> None:
        await keep_ticking(self.supervisor.tick, _SUPERVISE_EVERY_S)

    def _send_quietly(self, rid: str, command: Command) -> None:
        if self._link is None:
            return
        with contextlib.suppress(WorkerError):
            self._link.send(rid, command.header())

    async def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Wait until every replica has said hello (or raise Unavailable naming the laggards)."""
        deadline = self.clock() + timeout_s
        while self.clock() < deadline:
            await self._raise_load_error(self.models.values())
            starting = self.supervisor.starting()
            if not starting:
                return
            await asyncio.sleep(0.05)
        raise Unavailable(f"replicas not ready after {timeout_s:.0f}s: {starting}")

    async def _raise_load_error(self, paths: Collection[ModelPath]) -> None:
        """Fail fast when a model cannot load: waiting would only restart it again and again."""
        if any(self.supervisor.load_error(p) is not None for p in paths):
            await asyncio.sleep(0.3)  # a worker's own report may trail its exit code
            for path in paths:
                error = self.supervisor.load_error(path)
                if error is not None:
                    raise ModelLoadError(error)

    async def close(self) -> None:
        """Stop workers in order and answer everything still waiting."""
        await self.controllers.close()
        if self.graphs is not None:
            await self.graphs.close()
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        procs = self._supervisor.shut_down() if self._supervisor is not None else []
        local = [p for p in procs if isinstance(p, WorkerProcess)]
        await asyncio.to_thread(LocalLauncher.stop_all, local)
        if self._ray is not None:
            await asyncio.to_thread(self._ray.stop_all, procs)
        if self._forks is not None:  # after its children: their exit codes come through it
            self._forks.close()
        if self._link is not None:
            await self._link.close()
        self.store.close()

    # ---- queries ---------------------------------------------------------------------------
    @property
    def limits(self) -> Limits:
        return self.config.server.limits

    async def infer(self, request: InferenceRequest) -> Answer:
        """Every edge's inference request: application, graph or model (``face.py``)."""
        return await serve(self, request)

    async def predict(self, app: str, items: Sequence[Any],
                      uid: str | None = None) -> list[Prediction]:
        return await self.router.predict(app, items, uid)

    def has_graph(self, name: str) -> bool:
        return self.graphs is not None and name in self.graphs

    def graph_share(self, address: str, target: str) -> AbstractAsyncContextManager[None]:
        """A graph request waits for a place among its client address's (``ClientGate``),
        whichever edge it came by; anything else goes straight in."""
        if not self.has_graph(target):
            return nullcontext()
        return self.graph_gate.slot(address, self.graph_deadline_s(target), f"graph {target!r}")

    def graph_deadline_s(self, name: str) -> float:
        """How long a client of graph ``name`` waits for its reply (its ``timeout_ms``)."""
        assert self.graphs is not None
        return self.graphs.get(name).ctx.graph.timeout_ms / 1000

    async def predict_graph(self, name: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        if self.graphs is None:
            raise Unavailable("the server is starting")
        return await self.graphs.predict(name, body)

    def set_graph_fault(self, graph: str, operator: str, state_delay_ms: float) -> None:
        if self.graphs is None:
            raise Unavailable("the server is starting")
        self.graphs.get(graph).slow_state(operator, state_delay_ms / 1000)

    async def graph_digests(self, graph: str) -> dict[str, Any]:
        if self.graphs is None:
            raise Unavailable("the server is starting")
        return await self.graphs.get(graph).state_digests()

    async def update(self, app: str, uid: str, item: Any, label: Any,
                     query_id: str | None = None) -> dict[str, Any]:
        return await self.router.update(app, uid, item, label, query_id)

    async def infer_detailed(self, model: str, version: int | None, batch: np.ndarray,
                             timeout_s: float | None = None
                             ) -> tuple[np.ndarray, dict[int, str]]:
        """The outputs, and which rows were rebuilt by decoding (row -> method)."""
        return await infer_rows(find_model(self.models, model, version), batch, self.clock,
                                timeout_s)

    def expected_accuracy(self, model: str, version: int | None, method: str) -> float | None:
        return find_model(self.models, model, version).expected_accuracy(method)

    # ---- metadata and readiness ------------------------------------------------------------
    def model_metadata(self, model: str, version: int | None) -> ModelMetadata:
        if self.has_graph(model) and version in (None, 1):  # a graph serves as one model
            return ModelMetadata(model, ("1",), "parityserve-graph", (), ())
        path = find_model(self.models, model, version)
        inputs = (path.input_spec,) if path.input_spec else ()
        outputs = (path.output_spec,) if path.output_spec else ()
        return ModelMetadata(path.name, (str(path.version),), path.platform, inputs, outputs)

    def is_ready(self) -> bool:
        """KServe's "all models ready", but a model whose load failed is not ready on its own
        routes only (``health.holds_server_readiness``)."""
        graphs_ready = self.graphs.ready() if self.graphs is not None else not self.config.graphs
        return graphs_ready and all(
            self._live(p) for p in self.models.values()
            if holds_server_readiness(p, self._load_error(p)))

    def _load_error(self, path: ModelPath) -> str | None:
        supervisor = self._supervisor
        return supervisor.load_error(path) if supervisor is not None else None

    def model_ready(self, model: str, version: int | None) -> bool:
        if self.graphs is not None and self.has_graph(model):
            return self.graphs.get(model).ready()
        return bool(self._live(find_model(self.models, model, version)))

    def _live(self, path: ModelPath) -> list[Replica]:
        return live_replicas(path, self.clock(), self.config.server.heartbeat_timeout_ms / 1000)

    # ---- admin -----------------------------------------------------------------------------
    async def add_application(self, app: Application) -> None:
        await self.app_admin.add_application(app)

    async def remove_application(self, name: str) -> None:
        await self.app_admin.remove_application(name)

    async def link_models(self, app: str, models: Sequence[str]) -> None:
        await self.app_admin.link_models(app, models)

    @property
    def model_admin(self) -> ModelAdmin:
        assert self._model_admin is not None, "start() first"
        return self._model_admin

    async def deploy(self, deployment: Deployment) -> None:
        try:  # a framework this install lacks: refused now, not in a worker later
            check_extras(deployment_needs(deployment))
        except ConfigError as exc:
            raise InvalidInput(str(exc)) from None
        if deployment.scheduler is not None:  # a bad profile is refused before any launch
            self._checked_policy(deployment, deployment.scheduler)
        await self.model_admin.deploy(deployment)
        if deployment.scheduler is not None:
            self.controllers.set_policy(deployment.name, deployment.scheduler)
        else:  # the new version says nothing about parallelism: nothing changes it any more
            await self.controllers.stop(deployment.name)

    async def set_scheduler(self, model: str, scheduler: SchedulerConfig) -> None:
        """Change (or start) a model's parallelism controller live; nothing changes on a bad
        request (InvalidInput naming the problem)."""
        path = find_model(self.models, model)
        deployment = self._checked_policy(path.deployment, scheduler)
        self.controllers.set_policy(model, scheduler)
        path.deployment = deployment  # kept with the model: a later change is checked against it

    async def remove_scheduler(self, model: str) -> bool:
        """Stop a model's parallelism controller (True if one ran); the configuration it set
        stays, and the model's deployment no longer names a scheduler, so a later change of c
        or threads by hand is not undone."""
        path = find_model(self.models, model)
        stopped = self.controllers.running(model)
        await self.controllers.stop(model)
        path.deployment = revalidated(path.deployment, scheduler=None)
        return stopped

    def _checked_policy(self, deployment: Deployment, scheduler: SchedulerConfig) -> Deployment:
        changed = revalidated(deployment, scheduler=scheduler.model_dump())
        try:
            build_policy(scheduler, deployment, self.base_dir, self.controllers.cores)
        except ConfigError as exc:
            raise InvalidInput(scrub_paths(str(exc))) from None
        return changed

    async def set_replicas(self, model: str, replicas: int) -> None:
        await self.model_admin.set_replicas(model, replicas)

    async def set_parallelism(self, model: str, parallelism: int | None) -> None:
        await self.model_admin.set_parallelism(model, parallelism)

    async def set_threads(self, model: str, threads: int) -> None:
        await self.model_admin.set_threads(model, threads)

    async def set_redundancy(self, model: str, redundancy: RedundancyConfig,
                             parity: ParityConfig | None) -> None:
        await self.model_admin.set_redundancy(model, redundancy, parity)

    async def set_faults(self, model: str, replica: str, faults: FaultConfig) -> None:
        await self.model_admin.set_faults(model, replica, faults)

    def state(self) -> dict[str, Any]:
        return {
            "applications": [
                {**a.config.model_dump(mode="json"), "feedback_stored": len(a.feedback)}
                for a in self.apps.values()
            ],
            "models": [self._model_state(p) for p in self.models.values()],
            "cache": _record(self.cache.statistics()),
            "rpc_address": self._link.address if self._link else None,
            "graphs": self.graphs.state() if self.graphs is not None else {},
            # What the scheduler's busy hold reads (runtime/modelpath/loop_pressure.py), as of the
            # last pump that asked: the loop's smoothed busy share of wall time.
            "event_loop": {"busy": round(self.loop_pressure.level, 3),
                           "saturated": self.loop_pressure.last_verdict},
        }

    def _model_state(self, path: ModelPath) -> dict[str, Any]:
        supervisor = self._supervisor
        error = supervisor.load_error(path) if supervisor is not None else None
        return {
            "name": path.name,
            "version": path.version,
            "source": path.deployment.source,
            "platform": path.platform,
            "slo_ms": path.slo_s * 1000,
            "parallelism": path.deployment.parallelism,
            "scheduler": self.controllers.state(path.name),
            "threads": path.deployment.threads_per_replica,
            "oversubscribe": path.deployment.oversubscribe,
            "emulation": _emulation_state(path),
            "queue": _record(path.queue.statistics()),
            "admission": path.admission_state(),
            "busy_hold_ms": path.machine.busy_hold_s() * 1000,
            "replicas": [_record(s) for s in path.replica_stats()],
            "load_error": None if error is None else scrub_paths(error),
            "failed": supervisor is not None and supervisor.gave_up_on(path),
        }


def _emulation_state(path: ModelPath) -> dict[str, Any] | None:
    """None for real workers; else the emulated accelerator's profile and its label, so that
    nothing read from this server is mistaken for a measurement on real hardware."""
    config = path.deployment.emulation
    if config is None:
        return None
    profile = config.service_profile()
    return {"label": profile.label, "profile": profile.name, "base_ms": profile.base_ms,
            "per_query_ms": profile.per_query_ms, "distribution": profile.distribution,
            "cv": profile.cv, "source": profile.source, "seed": config.seed}


def _record(stats: Any) -> dict[str, Any]:
    return {k: getattr(stats, k) for k in stats.__dataclass_fields__}


async def keep_ticking(tick: Callable[[], None], every_s: float) -> None:
    """Call ``tick`` every ``every_s`` for ever. A tick that raises is logged and the next one
    still runs: one bad round (a launcher call failing on a dead node, say) must not end
    every later restart, which is what the supervision loop is for."""
    failures = 0
    while True:
        await asyncio.sleep(every_s)
        try:
            tick()
        except Exception:  # anything: the loop outlives it, the log keeps the traceback
            failures += 1
            if failures == 1 or failures % 100 == 0:
                log.exception("supervisor round failed (%d so far); the next one runs anyway",
                              failures)
