"""The serving system: applications over model paths, worker lifecycle, and the admin surface.

It satisfies ``runtime.api.ServingSystem`` for the HTTP layer. Everything here runs on one
asyncio loop; workers are separate processes reached only through ``WorkerLink``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from parityserve.config import (
    Application,
    Deployment,
    FaultConfig,
    ParityConfig,
    RedundancyConfig,
    ServingConfig,
)
from parityserve.core.batching import AIMDController
from parityserve.core.cache import ClockCache
from parityserve.core.inputs import scan
from parityserve.core.restarts import RestartPolicy, restart_delay
from parityserve.core.scheduling import parity_index, slot_name
from parityserve.core.selection import DEFAULT_CONTEXT, weight_shares
from parityserve.errors import (
    ConfigError,
    Conflict,
    DeadlineExceeded,
    InvalidInput,
    LimitExceeded,
    ModelLoadError,
    Overloaded,
    PredictError,
    ProtocolError,
    QueueFull,
    ServiceError,
    Unavailable,
    UnknownApplication,
    UnknownModel,
    WorkerError,
)
from parityserve.models.sources import scrub_paths
from parityserve.runtime import messages, wire
from parityserve.runtime.api import ModelMetadata, Prediction
from parityserve.runtime.applications import (
    AppRuntime,
    QueryRecord,
    describe_combined,
    read_state,
)
from parityserve.runtime.dispatch import (
    DATA_POOL,
    ModelPath,
    QueryExpired,
    Replica,
    deployed_parity_pools,
)
from parityserve.runtime.keys import ClientKeys, ServerKeys
from parityserve.runtime.launcher import LocalLauncher
from parityserve.runtime.metrics import Metrics
from parityserve.runtime.rpc import RejectLog, WorkerLink
from parityserve.runtime.state_store import MemoryStore, StateStore, open_store
from parityserve.runtime.worker import WorkerSpec

__all__ = ["ServingSystem"]

log = logging.getLogger(__name__)

_STARTUP_TIMEOUT_S = 120.0  # importing torch and loading weights on a busy 2-core box is slow
_SUPERVISE_EVERY_S = 0.05
_ONE_SHOT_FAULTS = ("crash_after_batches", "hang_after_batches")
_RESTARTS = RestartPolicy()  # back off while a slot keeps failing, give up after a few


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
        self.config = config
        self.base_dir = base_dir
        self.data_dir = data_dir
        self.metrics = metrics or Metrics()
        self.clock = clock
        self.log_dir = log_dir
        self.cache: ClockCache[tuple[str, int, bytes], Any] = ClockCache(config.server.cache_bytes)
        self.models: dict[str, ModelPath] = {}
        self.apps: dict[str, AppRuntime] = {
            a.name: AppRuntime.build(a) for a in config.applications}
        self.store: StateStore = MemoryStore()
        self._rng = np.random.default_rng()
        self._by_rid: dict[str, tuple[ModelPath, Replica]] = {}
        self._retired: list[ModelPath] = []
        self._query_ids = itertools.count(1)
        self._incarnations = itertools.count(1)
        self._link: WorkerLink | None = None
        self._keys: ServerKeys | None = None  # None: worker_auth is off
        self._replica_keys: dict[str, bytes] = {}  # launched replica id -> its public key
        self._reject = RejectLog(self.metrics.worker_rejected)
        self._launcher: LocalLauncher | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._closing = False
        self._load_errors: dict[tuple[str, int], str] = {}  # (model, version) -> why
        # replica slot -> failures in a row; slots given up on until an operator asks again
        self._failures: dict[tuple[str, int, int | str], int] = {}
        self._gave_up: set[tuple[str, int, int | str]] = set()

    # ---- lifecycle -----------------------------------------------------------------------
    @property
    def rpc_address(self) -> str:
        assert self._link is not None, "start() first"
        return self._link.address

    async def start(
        self, *, wait_ready: bool = True, timeout_s: float = _STARTUP_TIMEOUT_S
    ) -> None:
        server = self.config.server
        # Opened first: an unreachable Redis or unwritable SQLite file fails before any worker.
        self.store = await asyncio.to_thread(open_store, server.state_store,
                                             base_dir=self.base_dir)
        self._keys = self._worker_keys()
        self._link = WorkerLink(server.host, server.rpc_port, keys=self._keys,
                                on_reject=self._reject)
        self._link.start(self._on_message)
        self._launcher = LocalLauncher(self._link.address, log_dir=self.log_dir)
        for deployment in self.config.models:
            self._install(deployment)
        self._supervisor = asyncio.get_running_loop().create_task(self._supervise())
        if wait_ready:
            await self.wait_ready(timeout_s)

    def _worker_keys(self) -> ServerKeys | None:
        """The CURVE keys workers must present: from ``worker_keys_dir`` (for workers started
        elsewhere), else made now in memory (local workers get theirs at launch)."""
        server = self.config.server
        if not server.worker_auth:
            return None
        if server.worker_keys_dir is None:
            return ServerKeys.in_memory()
        folder = Path(server.worker_keys_dir)
        if not folder.is_absolute() and self.base_dir is not None:
            folder = self.base_dir / folder
        return ServerKeys.from_dir(folder)

    async def wait_ready(self, timeout_s: float = _STARTUP_TIMEOUT_S) -> None:
        """Wait until every replica has said hello (or raise Unavailable naming the laggards)."""
        deadline = self.clock() + timeout_s
        while self.clock() < deadline:
            await self._raise_load_error(self.models.values())
            starting = [
                r.rid
                for p in self.models.values()
                for r in p.replicas.values()
                if r.state == "starting"
            ]
            if not starting:
                return
            await asyncio.sleep(0.05)
        raise Unavailable(f"replicas not ready after {timeout_s:.0f}s: {starting}")

    async def _raise_load_error(self, paths: Collection[ModelPath]) -> None:
        """Fail fast when a model cannot load: waiting would only restart it again and again."""
        if any((p.name, p.version) in self._load_errors for p in paths):
            await asyncio.sleep(0.3)  # a worker's own report may trail its exit code
            for path in paths:
                error = self._load_errors.get((path.name, path.version))
                if error is not None:
                    raise ModelLoadError(error)

    async def close(self) -> None:
        """Stop workers in order and answer everything still waiting."""
        self._closing = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        paths = [*self.models.values(), *self._retired]
        for path in paths:
            for replica in path.replicas.values():
                if replica.state == "ready":  # a starting worker is not listening; SIGTERM it
                    self._send_quietly(replica, {"t": wire.STOP})
            path.fail_all("server shutting down")
        procs = [r.process for p in paths for r in p.replicas.values() if r.process is not None]
        await asyncio.to_thread(LocalLauncher.stop_all, procs)
        if self._link is not None:
            await self._link.close()
        self.store.close()

    # ---- replicas ------------------------------------------------------------------------
    def _install(self, deployment: Deployment) -> ModelPath:
        assert self._link is not None
        path = ModelPath(
            deployment,
            link=self._link,
            metrics=self.metrics,
            cache=self.cache,
            clock=self.clock,
            slo_s=self._slo_for(deployment.name, deployment),
            max_queue=self.config.server.max_queue,  # None: derived (core/admission.py)
        )
        self.models[deployment.name] = path
        for index in range(deployment.data_replicas()):
            self._launch(path, index, deployment.faults_for(index).model_dump())
        for pool in _parity_pools(deployment):
            for index in range(deployment.parity_replicas()):
                self._launch(path, index, {}, pool)
        return path

    def _slo_for(self, model: str, deployment: Deployment) -> float:
        """AIMD backs off against the tightest SLO of the applications using the model."""
        slos = [a.config.slo_ms for a in self.apps.values() if model in a.config.models]
        return (min(slos) if slos else deployment.timeout_ms) / 1000

    def _launch(self, path: ModelPath, index: int, faults: dict[str, Any],
                pool: str = DATA_POOL) -> Replica:
        assert self._launcher is not None
        dep = path.deployment
        slot = _slot_name(index, pool)
        # The random part makes ids unguessable: nobody can claim a replica's id before it does.
        rid = f"{dep.name}/v{dep.version}/{slot}#{next(self._incarnations)}-{secrets.token_hex(8)}"
        source, weights, options = _pool_model(dep, pool)
        spec = WorkerSpec(
            replica_id=rid,
            model=dep.name,
            version=dep.version,
            source=source,
            weights=weights,
            options=options,
            threads=dep.threads_per_replica,
            base_dir=str(self.base_dir) if self.base_dir else None,
            data_dir=str(self.data_dir) if self.data_dir else None,
            faults=_worker_faults(faults),
            heartbeat_interval_s=self.config.server.heartbeat_interval_ms / 1000,
        )
        process = self._launcher.start(spec, self._client_keys(rid))
        replica = Replica(
            rid,
            index,
            self._aimd(path),
            self.clock(),
            process=process,
            pid=process.pid,
            started_at=self.clock(),
            faults=faults,
            pool=pool,
        )
        path.replicas[rid] = replica
        self._by_rid[rid] = (path, replica)
        self.metrics.set_replica_up(path.name, str(index), False)
        return replica

    def _aimd(self, path: ModelPath) -> AIMDController:
        b = path.deployment.batching
        return AIMDController(
            b.max_batch_size, path.slo_s, additive_step=b.additive_step, backoff=b.backoff
        )

    def _client_keys(self, rid: str) -> ClientKeys | None:
        """A fresh keypair for one launched replica, admitted and bound to its id."""
        if self._keys is None or self._link is None:
            return None
        keys = self._keys.client()
        self._replica_keys[rid] = keys.public
        self._link.expect(rid, keys.public)
        return keys

    def _release(self, rid: str) -> None:
        """A replica left: its id and its key stop being accepted."""
        public = self._replica_keys.pop(rid, None)
        if public is not None and self._keys is not None:
            self._keys.revoke(public)
        if self._link is not None:
            self._link.forget(rid)

    def _on_message(self, rid: str, header: dict[str, Any], buffers: list[Any]) -> None:
        found = self._by_rid.get(rid)
        try:
            message = messages.parse(header, buffers)
        except ProtocolError as exc:
            if found is not None and header.get("t") == wire.RESULT:
                found[0].refuse_batch(found[1], f"malformed result: {exc}")
            self._reject(rid, "malformed", str(exc))
            return
        if found is None:
            if isinstance(message, messages.Hello):
                self._join(rid, message)
            else:
                self._reject(rid, "unknown_replica", f"{type(message).__name__} from no replica")
            return
        path, replica = found
        replica.last_seen = self.clock()
        if isinstance(message, messages.Result):
            refused = path.accept_result(replica, message)
            if refused is not None:
                self._reject(rid, *refused)
        elif isinstance(message, messages.Hello):
            self._ready(path, replica, message)
        elif isinstance(message, messages.Bye):
            self._forget(path, replica)
        elif isinstance(message, messages.Failed):
            self._load_failed(path, replica, message)

    def _load_failed(self, path: ModelPath, replica: Replica, message: messages.Failed) -> None:
        """Only a replica this frontend launched, still starting, can say its model failed to
        load, and only for the model and version it was launched with."""
        if replica.process is None or replica.state != "starting":
            self._reject(replica.rid, "unexpected_failed", f"FAILED while {replica.state}")
            return
        log.error("replica %s could not load its model: %s", replica.rid, message.error)
        self._load_errors[(path.name, path.version)] = message.error

    def _ready(self, path: ModelPath, replica: Replica, hello: messages.Hello) -> None:
        if replica.state == "starting":
            self._sync_faults(replica)
        replica.state = "ready" if replica.state == "starting" else replica.state
        self._load_errors.pop((path.name, path.version), None)
        self._failures.pop((path.name, path.version, _slot_of(replica)), None)
        replica.pid = hello.pid if hello.pid is not None else replica.pid
        path.platform = hello.platform or path.platform
        path.input_spec = path.input_spec or hello.input
        path.output_spec = path.output_spec or hello.output
        self.metrics.set_replica_up(path.name, str(replica.index), True)
        path.pump()

    def _sync_faults(self, replica: Replica) -> None:
        """Faults set while a worker was starting could not reach it: send them now."""
        launched = getattr(getattr(replica.process, "spec", None), "faults", None)
        wanted = _worker_faults(replica.faults)
        if launched is not None and launched != wanted:
            self._send_quietly(replica, {"t": wire.FAULT, "spec": wanted})

    def _join(self, rid: str, hello: messages.Hello) -> None:
        """A worker started elsewhere (``parityserve worker --connect``) joins a model."""
        path = self.models.get(hello.model)
        if path is None or hello.version != path.version:
            self._reject(rid, "unknown_model", f"hello for model {hello.model!r} v{hello.version}")
            # Says what it asked for, never what is served: a stranger learns nothing here.
            error = f"no model {hello.model!r} version {hello.version} here"
            self._send_quietly_rid(rid, {"t": wire.STOP, "error": error})
            return
        replica = Replica(rid, -1, self._aimd(path), self.clock(), started_at=self.clock())
        path.replicas[rid] = replica
        self._by_rid[rid] = (path, replica)
        self._ready(path, replica, hello)

    def _forget(self, path: ModelPath, replica: Replica) -> None:
        path.take_back(replica)
        path.replicas.pop(replica.rid, None)
        self._by_rid.pop(replica.rid, None)
        self._release(replica.rid)
        path.pump()

    async def _supervise(self) -> None:
        while True:
            await asyncio.sleep(_SUPERVISE_EVERY_S)
            for path in [*self.models.values(), *self._retired]:
                self._check_path(path)
            self._reap_retired()

    def _check_path(self, path: ModelPath) -> None:
        now = self.clock()
        timeout = self.config.server.heartbeat_timeout_ms / 1000
        for replica in list(path.replicas.values()):
            reason = _failure(replica, now, timeout)
            if reason is not None:
                self._replace(path, replica, reason)
        path.expire_stale(now)

    def _replace(self, path: ModelPath, replica: Replica, reason: str) -> None:
        """A failed replica: requeue its batch, kill it, and start a fresh one in its place."""
        requeued = path.take_back(replica)
        log.warning(
            "replica %s failed (%s); re-dispatching %d queries", replica.rid, reason, requeued
        )
        path.replicas.pop(replica.rid, None)
        self._by_rid.pop(replica.rid, None)
        self._release(replica.rid)
        if replica.process is not None:
            replica.process.kill()
        self.metrics.set_replica_up(path.name, str(replica.index), False)
        if replica.process is not None and replica.state != "retiring" and not self._closing:
            if replica.state == "starting" and reason.startswith("process exited"):
                self._load_errors.setdefault(
                    (path.name, path.version),
                    f"model {path.name!r} ({path.deployment.source}): the worker {reason} "
                    "before it was ready; see its stderr",
                )
            self.metrics.restart(path.name, str(replica.index))
            faults = {k: v for k, v in replica.faults.items() if k not in _ONE_SHOT_FAULTS}
            self._relaunch_later(path, replica.index, faults, replica.pool)
        path.pump()

    def _relaunch_later(self, path: ModelPath, index: int, faults: dict[str, Any],
                        pool: str = DATA_POOL) -> None:
        """Restart at once after a first failure; back off exponentially while it keeps failing
        without ever becoming ready, and give up after a few (a model that cannot load must
        not spin, nor run a load-time payload again and again)."""
        slot = (path.name, path.version, _slot_name(index, pool))
        failures = self._failures[slot] = self._failures.get(slot, 0) + 1
        delay = restart_delay(failures, _RESTARTS)
        if delay is None:
            self._give_up(path, slot, failures)
            return
        if delay == 0.0:
            self._launch(path, index, faults, pool)
            return
        log.warning("restarting replica %d of %s in %.2fs (%d failures in a row)",
                    index, path.name, delay, failures)
        asyncio.get_running_loop().call_later(delay, self._relaunch, path, index, faults, pool)

    def _give_up(self, path: ModelPath, slot: tuple[str, int, int | str], failures: int) -> None:
        self._gave_up.add(slot)
        error = self._load_errors.setdefault(
            (path.name, path.version),
            f"model {path.name!r}: replica {slot[2]} failed {failures} times in a row")
        log.error("giving up on replica %s of %s v%d after %d failures in a row without "
                  "becoming ready (%s); set its replicas or deploy a new version to try again",
                  slot[2], path.name, path.version, failures, error)

    def _forgive(self, path: ModelPath) -> None:
        """An operator asked again: slots given up on get their full number of tries."""
        for slot in [s for s in self._failures if s[:2] == (path.name, path.version)]:
            del self._failures[slot]
        self._gave_up = {s for s in self._gave_up if s[:2] != (path.name, path.version)}

    def _relaunch(self, path: ModelPath, index: int, faults: dict[str, Any],
                  pool: str = DATA_POOL) -> None:
        live = self.models.get(path.name) is path or path in self._retired
        taken = any(r.index == index and r.pool == pool and r.process is not None
                    for r in path.replicas.values())
        wanted = (path.deployment.data_replicas() if pool == DATA_POOL
                  else path.deployment.parity_replicas())
        if live and not taken and not self._closing and index < wanted:
            self._launch(path, index, faults, pool)

    def _reap_retired(self) -> None:
        for path in list(self._retired):
            if len(path.queue) == 0 and not path.inflight:
                self._stop_replicas(path, list(path.replicas.values()))
                self._retired.remove(path)

    def _stop_replicas(self, path: ModelPath, replicas: list[Replica]) -> None:
        for replica in replicas:
            replica.state = "retiring"
            path.take_back(replica)
            self._send_quietly(replica, {"t": wire.STOP})
            path.replicas.pop(replica.rid, None)
            self._by_rid.pop(replica.rid, None)
            self._release(replica.rid)
            if replica.process is not None:
                asyncio.get_running_loop().run_in_executor(None, replica.process.terminate)
        path.pump()

    def _send_quietly(self, replica: Replica, header: dict[str, Any]) -> None:
        self._send_quietly_rid(replica.rid, header)

    def _send_quietly_rid(self, rid: str, header: dict[str, Any]) -> None:
        if self._link is None:
            return
        with contextlib.suppress(WorkerError):
            self._link.send(rid, header)

    # ---- queries -------------------------------------------------------------------------
    def _app(self, name: str) -> AppRuntime:
        try:
            return self.apps[name]
        except KeyError:
            raise UnknownApplication(
                f"unknown application {name!r}; deployed: {sorted(self.apps) or 'none'}"
            ) from None

    def _model(self, name: str, version: int | None = None) -> ModelPath:
        path = self.models.get(name)
        if path is None:
            raise UnknownModel(f"unknown model {name!r}; deployed: {sorted(self.models) or 'none'}")
        if version is not None and version != path.version:
            raise UnknownModel(
                f"model {name!r} has no version {version}; serving version {path.version}"
            )
        return path

    async def predict(self, app: str, items: Sequence[Any],
                      uid: str | None = None) -> list[Prediction]:
        runtime = self._app(app)
        context = _context(uid)
        paths = {m: self._model(m) for m in runtime.config.models}
        inputs = [self._coerce_for(paths, item) for item in items]  # validated before queueing
        state = await self._read_state(runtime, context)
        deadline = self.clock() + runtime.config.slo_ms / 1000
        _shed_if_all_overloaded(paths.values(), len(inputs), deadline)
        plans = [self._plan(runtime, state, context, paths, x, deadline) for x in inputs]
        pending = [f for _, fs in plans for f, _ in fs.values()
                   if isinstance(f, asyncio.Future) and not f.done()]
        if pending:
            await asyncio.wait(pending, timeout=max(0.0, deadline - self.clock()))
        return [self._answer(runtime, state, context, paths, x, selected, futures)
                for x, (selected, futures) in zip(inputs, plans, strict=True)]

    def _coerce_for(self, paths: dict[str, ModelPath], item: Any) -> dict[str, Any]:
        """The item checked against the request limits, then against each linked model's
        signature (once per distinct one). One pass over the JSON serves both."""
        limits = self.config.server.limits
        # An input counts from depth 3 (body, input_batch, item) however it was sent, so one
        # query may nest max_json_depth - 2 levels in either form.
        leaves = scan(item, max_depth=limits.max_json_depth,
                      max_elements=limits.max_input_elements, depth=3)
        by_spec: dict[Any, Any] = {}
        out = {}
        for name, path in paths.items():
            if path.input_spec not in by_spec:
                by_spec[path.input_spec] = path.coerce(item, leaves)
            out[name] = by_spec[path.input_spec]
        return out

    async def _read_state(self, runtime: AppRuntime, context: str) -> dict[str, Any]:
        try:
            return await read_state(self.store, runtime, context)
        except ServiceError as exc:  # a store outage must not stop predictions
            log.warning("state store unavailable (%s); using fresh policy state", exc)
            return runtime.current_state(None)

    def _plan(self, runtime: AppRuntime, state: dict[str, Any], context: str,
              paths: dict[str, ModelPath], x: dict[str, Any], deadline: float
              ) -> tuple[tuple[str, ...], dict[str, tuple[Any, bool]]]:
        selected = tuple(runtime.policy.select(state, runtime.query_info(context), self._rng))
        futures = {}
        shed: list[Overloaded] = []
        for model in selected:
            self.metrics.selection(runtime.config.name, model)
            path = paths[model]
            futures[model] = (self._submit(path, x[model], deadline, shed)
                              if path.has_capacity() else (_no_replica(path), False))
        if selected and len(shed) == len(selected):
            raise shed[0]  # every model asked refused it: the query is shed (429/503)
        return selected, futures

    def _submit(self, path: ModelPath, item: Any, deadline: float,
                shed: list[Overloaded] | None = None) -> tuple[Any, bool]:
        """Queue one item; a model that sheds it counts as not answering (the reason)."""
        try:
            return path.submit(item, deadline)
        except Overloaded as exc:
            if shed is not None:
                shed.append(exc)
            return f"overloaded: {exc}", False
        except QueueFull:
            path.shed += 1
            return f"queue full: model {path.name!r} has {len(path.queue)} queries waiting", False

    def _answer(self, runtime: AppRuntime, state: dict[str, Any], context: str,
                paths: dict[str, ModelPath], x: dict[str, Any], selected: tuple[str, ...],
                futures: dict[str, tuple[Any, bool]]) -> Prediction:
        app = runtime.config
        qid = str(next(self._query_ids))
        runtime.remember(qid, QueryRecord(app.name, context, x, selected))
        arrived = {m: f.result() for m, (f, _) in futures.items() if _succeeded(f)}
        try:
            combined = runtime.policy.combine(state, runtime.query_info(context, selected),
                                              arrived)
        except PredictError as exc:
            return self._default(app, qid, f"error: {exc}")
        if combined.output is None:
            return self._default(app, qid, self._missing_reason(app, paths, futures))
        extra = describe_combined(combined, selected)
        threshold = app.confidence_threshold
        if threshold is not None and combined.confidence < threshold:
            return self._default(app, qid, f"low confidence: {combined.confidence:.2f} is below "
                                 f"the application's threshold {threshold:g}", extra)
        one = combined.used[0] if len(combined.used) == 1 else None
        cached = all(futures[m][1] for m in combined.used)
        rebuilt = {m: how for m in combined.used
                   if (how := paths[m].reconstruction(futures[m][0])) is not None}
        if rebuilt:  # answered by decoding, not by the model's own prediction
            extra["reconstructed"] = next(iter(rebuilt.values())) if one else rebuilt
        return Prediction(qid, combined.output, model=one,
                          version=paths[one].version if one else None, cached=cached, extra=extra)

    def _default(self, app: Application, qid: str, reason: str,
                 extra: dict[str, Any] | None = None) -> Prediction:
        self.metrics.observe_default(app.name, reason.split(":")[0])
        return Prediction(qid, app.default_output, default=True, default_explanation=reason,
                          extra=extra or {})

    def _missing_reason(self, app: Application, paths: dict[str, ModelPath],
                        futures: dict[str, tuple[Any, bool]]) -> str:
        """Why nothing usable arrived, from the first model that did not answer."""
        model, (future, _) = next(iter(futures.items()))
        path = paths[model]
        if isinstance(future, str):
            return future  # decided before queueing: queue full or no replica
        if future.done():
            if isinstance(future.exception(), QueryExpired):
                return f"deadline: {future.exception()}"
            return f"error: {future.exception()}"
        if not path.has_capacity():
            return _no_replica(path)
        return f"deadline: model {path.name!r} did not answer within the {app.slo_ms:g} ms SLO"

    async def update(self, app: str, uid: str, item: Any, label: Any,
                     query_id: str | None = None) -> dict[str, Any]:
        runtime = self._app(app)
        if not isinstance(uid, str) or not uid:
            raise InvalidInput("feedback needs a non-empty string 'uid'")
        if label is None:
            raise InvalidInput("feedback needs a 'label'")
        paths = {m: self._model(m) for m in runtime.config.models}
        record = runtime.recall(query_id) if query_id is not None else None
        inputs = record.item if record else self._coerce_for(paths, item)
        predictions = await self._predictions_for(paths, inputs)
        losses = runtime.losses(label, predictions)  # a malformed label raises InvalidInput
        query = runtime.query_info(uid, record.selected if record else None)
        state = await self._observe(runtime, uid, query, label, predictions)
        self._record_feedback(runtime, losses, state)
        runtime.feedback.append({"uid": uid, "label": label, "at": time.time()})
        return {"ok": True, "uid": uid, "losses": losses, "weights": weight_shares(state),
                "feedback_stored": len(runtime.feedback)}

    async def _predictions_for(self, paths: dict[str, ModelPath],
                               inputs: dict[str, Any]) -> dict[str, Any]:
        """Each linked model's prediction for the input: from the cache, else recomputed."""
        futures = {}
        for name, path in paths.items():
            if path.has_capacity():
                deadline = self.clock() + path.deployment.timeout_ms / 1000
                future = self._submit(path, inputs[name], deadline)[0]
                if isinstance(future, asyncio.Future):  # not shed
                    futures[name] = future
        waiting = [f for f in futures.values() if not f.done()]
        if waiting:
            timeout = max(p.deployment.timeout_ms for p in paths.values()) / 1000
            await asyncio.wait(waiting, timeout=timeout)
        return {m: f.result() for m, f in futures.items() if _succeeded(f)}

    async def _observe(self, runtime: AppRuntime, context: str, query: Any, label: Any,
                       predictions: dict[str, Any]) -> dict[str, Any]:
        args = (self.store, context, query, label, predictions)
        if self.store.description == "memory":
            return runtime.observe(*args)
        return await asyncio.to_thread(runtime.observe, *args)

    def _record_feedback(self, runtime: AppRuntime, losses: dict[str, float],
                         state: dict[str, Any]) -> None:
        app = runtime.config.name
        for model, value in losses.items():
            self.metrics.loss(app, model, value)
        for model, share in weight_shares(state).items():
            self.metrics.set_weight(app, model, share)

    async def infer(self, model: str, version: int | None, batch: np.ndarray) -> np.ndarray:
        return (await self.infer_detailed(model, version, batch))[0]

    async def infer_detailed(self, model: str, version: int | None, batch: np.ndarray
                             ) -> tuple[np.ndarray, dict[int, str]]:
        """The outputs, and which rows were rebuilt by decoding (row -> method)."""
        path = self._model(model, version)
        if not path.has_capacity():
            raise Unavailable(f"model {model!r} has no running replica")
        if batch.ndim == 0:
            raise InvalidInput(f"model {model!r}: the input tensor is a scalar (shape []); "
                               "its first axis is the batch, so send shape [1, ...]")
        if len(batch) == 0:
            raise InvalidInput(f"model {model!r}: the input tensor has zero rows; send at "
                               "least one")
        _check_finite(batch, path)
        deadline = self.clock() + path.deployment.timeout_ms / 1000
        path.admit(len(batch), deadline)  # all rows or none: a request is shed whole
        futures = [_submit_row(path, row, deadline) for row in batch]
        pending = [f for f in futures if not f.done()]
        if pending:
            await asyncio.wait(pending, timeout=max(0.0, deadline - self.clock()))
        for future in futures:
            _raise_failure(future, path)
        rebuilt = {i: m for i, f in enumerate(futures)
                   if (m := path.reconstruction(f)) is not None}
        return np.stack([np.asarray(f.result()) for f in futures]), rebuilt

    # ---- metadata --------------------------------------------------------------------------
    def model_metadata(self, model: str, version: int | None) -> ModelMetadata:
        path = self._model(model, version)
        inputs = (path.input_spec,) if path.input_spec else ()
        outputs = (path.output_spec,) if path.output_spec else ()
        return ModelMetadata(path.name, (str(path.version),), path.platform, inputs, outputs)

    def is_ready(self) -> bool:
        return all(self._live_replicas(p) for p in self.models.values() if p.deployment.replicas)

    def model_ready(self, model: str, version: int | None) -> bool:
        return bool(self._live_replicas(self._model(model, version)))

    def _live_replicas(self, path: ModelPath) -> list[Replica]:
        """Replicas that can answer now: ready, heartbeating, process alive, and running the
        model itself (a parity model alone cannot answer). Judged at the moment of asking, not
        from the supervisor's last verdict, which trails a kill or a hang."""
        now, timeout = self.clock(), self.config.server.heartbeat_timeout_ms / 1000
        return [r for r in path.ready_replicas()
                if r.pool == DATA_POOL and _failure(r, now, timeout) is None]

    # ---- admin -----------------------------------------------------------------------------
    async def add_application(self, app: Application) -> None:
        if app.name in self.apps:
            raise Conflict(f"application {app.name!r} already exists")
        for model in app.models:
            self._model(model)
        try:
            runtime = AppRuntime.build(app)
        except ConfigError as exc:  # an unknown policy, module or option: the caller's mistake
            raise InvalidInput(f"application {app.name!r}: {exc}") from exc
        self.apps[app.name] = runtime
        self._refresh_slos()

    async def remove_application(self, name: str) -> None:
        self._app(name)
        del self.apps[name]
        self._refresh_slos()
        # A later application of the same name starts learning afresh.
        with contextlib.suppress(ServiceError):
            await asyncio.to_thread(self.store.delete_prefix, f"{name}/")

    async def link_models(self, app: str, models: Sequence[str]) -> None:
        state = self._app(app)
        if not models:
            raise InvalidInput("link needs at least one model")
        for model in models:
            self._model(model)
        state.relink(state.config.model_copy(update={"models": tuple(models)}))
        self._refresh_slos()

    def _refresh_slos(self) -> None:
        for path in self.models.values():
            path.slo_s = self._slo_for(path.name, path.deployment)
            for replica in path.replicas.values():
                replica.aimd.set_slo(path.slo_s)

    async def deploy(self, deployment: Deployment) -> None:
        """Deploy a new model, or roll a model to a newer version with no gap in service."""
        old = self.models.get(deployment.name)
        if old is not None and deployment.version <= old.version:
            raise Conflict(
                f"model {deployment.name!r} already serves version {old.version}; "
                f"deploy version {old.version + 1} or higher"
            )
        self._check_worker_budget(deployment, replacing=None)
        if old is not None:
            del self.models[deployment.name]
        path = self._install(deployment)
        if old is None:
            return
        self.models[deployment.name] = old  # keep serving the old version while the new loads
        await self._await_first_ready(path)
        self.models[deployment.name] = path
        self._retired.append(old)

    async def _await_first_ready(self, path: ModelPath) -> None:
        deadline = self.clock() + _STARTUP_TIMEOUT_S
        while not path.ready_replicas() and path.deployment.replicas:
            error = self._load_errors.get((path.name, path.version))
            if error is not None:
                self._stop_replicas(path, list(path.replicas.values()))
                raise Unavailable(f"version {path.version} of {path.name!r} not deployed: "
                                  f"{scrub_paths(error)}")
            if self.clock() > deadline:
                raise Unavailable(f"new version of {path.name!r} did not start")
            await asyncio.sleep(0.05)

    async def set_replicas(self, model: str, replicas: int) -> None:
        path = self._model(model)
        if not 0 <= replicas <= 256:
            raise InvalidInput("replicas must be between 0 and 256")
        deployment = _revalidated(path.deployment, replicas=replicas)
        self._check_worker_budget(deployment, replacing=path)
        self._forgive(path)
        self._reconcile(path, deployment)

    async def set_redundancy(self, model: str, redundancy: RedundancyConfig,
                             parity: ParityConfig | None) -> None:
        """Switch a model's redundancy mode; groups in flight finish under the old one."""
        path = self._model(model)
        deployment = _revalidated(path.deployment, redundancy=redundancy.model_dump(),
                                  parity=parity.model_dump() if parity else None)
        self._check_worker_budget(deployment, replacing=path)
        old_parity = path.deployment.parity
        if old_parity is not None and deployment.parity != old_parity:
            parity_replicas = [r for r in path.replicas.values() if r.pool != DATA_POOL]
            self._stop_replicas(path, parity_replicas)  # new parity models load afresh
        self._reconcile(path, deployment)
        path.set_redundancy(deployment)

    def _check_worker_budget(self, deployment: Deployment, replacing: ModelPath | None) -> None:
        """Refuse a change that would run more worker processes here than the server allows.

        Why a cap at all: each replica is a process with a model in memory, so one admin
        request asking for hundreds of them could take the host down. Workers that joined
        from other machines (no process of ours) do not count. A rolling deploy counts the
        old version too, since both run until the new one is ready.
        """
        limit = self.config.server.max_local_workers
        running = sum(r.process is not None for p in [*self.models.values(), *self._retired]
                      for r in p.replicas.values())
        freed = 0 if replacing is None else sum(
            r.process is not None for r in replacing.replicas.values())
        wanted = deployment.worker_processes()
        if running - freed + wanted > limit:
            raise LimitExceeded(
                f"model {deployment.name!r} would need {wanted} worker processes and "
                f"{running - freed} already run here: more than server.max_local_workers = "
                f"{limit}. Scale other models down, or raise the limit in the config")

    def _reconcile(self, path: ModelPath, deployment: Deployment) -> None:
        """Start or stop replicas so every pool has the size ``deployment`` asks for."""
        pools = {r.pool for r in path.replicas.values()}
        wanted = {DATA_POOL: deployment.data_replicas(),
                  **dict.fromkeys(_parity_pools(deployment), deployment.parity_replicas())}
        for pool, count in wanted.items():
            managed = sorted((r for r in path.replicas.values()
                              if r.process is not None and r.pool == pool), key=lambda r: r.index)
            for index in range(len(managed), count):
                faults = deployment.faults_for(index).model_dump() if pool == DATA_POOL else {}
                self._launch(path, index, faults, pool)
            self._stop_replicas(path, managed[count:])
        gone = pools - set(wanted)
        self._stop_replicas(path, [r for r in path.replicas.values() if r.pool in gone])
        path.deployment = deployment

    async def set_faults(self, model: str, replica: str, faults: FaultConfig) -> None:
        path = self._model(model)
        targets = [r for r in path.replicas.values() if replica in ("all", _slot_of(r))]
        if not targets:
            raise InvalidInput(
                f"model {model!r} has no replica {replica!r}; replicas are "
                f"{sorted({_slot_of(r) for r in path.replicas.values()})}"
            )
        spec = {} if faults.is_noop else faults.model_dump()
        for target in targets:
            target.faults = spec
            self._send_quietly(target, {"t": wire.FAULT, "spec": spec})

    def state(self) -> dict[str, Any]:
        return {
            "applications": [
                {**a.config.model_dump(mode="json"), "feedback_stored": len(a.feedback)}
                for a in self.apps.values()
            ],
            "models": [self._model_state(p) for p in self.models.values()],
            "cache": _record(self.cache.statistics()),
            "rpc_address": self._link.address if self._link else None,
        }

    def _model_state(self, path: ModelPath) -> dict[str, Any]:
        return {
            "name": path.name,
            "version": path.version,
            "source": path.deployment.source,
            "platform": path.platform,
            "slo_ms": path.slo_s * 1000,
            "queue": _record(path.queue.statistics()),
            "admission": path.admission_state(),
            "replicas": [_record(s) for s in path.replica_stats()],
            "load_error": _scrubbed(self._load_errors.get((path.name, path.version))),
            "failed": any(s[:2] == (path.name, path.version) for s in self._gave_up),
        }


def _shed_if_all_overloaded(paths: Collection[ModelPath], count: int, deadline: float) -> None:
    """Refuse an application's request when every model it links would shed it.

    The rule for applications: a request is shed (Overloaded, 429/503) before anything is
    queued when no linked model can take all its queries, and a query is shed when every
    model the policy asks for it refuses it. A model that refuses while another asked model
    accepts counts as not answering: the policy combines the others, or the default answers.
    (When a later query of a batch is shed, earlier ones already queued are still computed
    and cached, not answered.)
    """
    first: Overloaded | None = None
    for path in paths:
        try:
            path.admit(count, deadline)
        except Overloaded as exc:
            first = first or exc
            continue
        return
    if first is not None:
        raise first


def _submit_row(path: ModelPath, row: Any, deadline: float) -> asyncio.Future[Any]:
    try:
        return path.submit(row, deadline, admitted=True)[0]
    except QueueFull as exc:  # an explicit server.max_queue is full
        path.shed += 1
        raise Overloaded(f"model {path.name!r} is overloaded: {exc}", model=path.name,
                         depth=len(path.queue), retry_after_s=1.0) from exc


def _raise_failure(future: asyncio.Future[Any], path: ModelPath) -> None:
    """The V2 answer for a row that did not succeed: 504 past the deadline, 503 when a
    worker failed, the model's own error otherwise."""
    timeout = path.deployment.timeout_ms
    if not future.done():
        raise DeadlineExceeded(f"model {path.name!r} did not answer within {timeout:g} ms")
    error = future.exception()
    if isinstance(error, QueryExpired):
        raise DeadlineExceeded(f"{error} (timeout {timeout:g} ms)") from error
    if isinstance(error, WorkerError):
        raise Unavailable(f"model {path.name!r}: {error}") from error
    if error is not None:
        raise error


def _check_finite(batch: np.ndarray, path: ModelPath) -> None:
    """NaN and infinity are refused unless the deployment sets ``allow_nonfinite``."""
    if path.deployment.allow_nonfinite or batch.dtype.kind not in "fc":
        return
    if not np.isfinite(batch).all():
        bad = int(np.count_nonzero(~np.isfinite(batch)))
        raise InvalidInput(f"model {path.name!r}: the input holds {bad} non-finite values "
                           "(NaN or infinity); set allow_nonfinite: true on the deployment "
                           "to accept them")


def _revalidated(deployment: Deployment, **changes: Any) -> Deployment:
    """The deployment with ``changes``, validated again (a coded mode needs enough replicas
    for one group; parm needs parity models)."""
    try:
        return Deployment.model_validate({**deployment.model_dump(), **changes})
    except ValidationError as exc:
        reasons = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise InvalidInput(reasons) from None


def _scrubbed(error: str | None) -> str | None:
    return None if error is None else scrub_paths(error)


def _slot_name(index: int, pool: str) -> str:
    """How admin calls and replica ids name a replica: "2", or "parity0-1" for parity ones."""
    return slot_name(index, pool)


def _slot_of(replica: Replica) -> str:
    return _slot_name(replica.index, replica.pool)


def _parity_pools(deployment: Deployment) -> list[str]:
    return deployed_parity_pools(deployment)


def _pool_model(dep: Deployment, pool: str) -> tuple[str, str | None, dict[str, Any]]:
    """(source, weights, options) a replica of ``pool`` loads."""
    if pool == DATA_POOL or dep.parity is None:
        return dep.source, dep.weights, dict(dep.options)
    j = parity_index(pool)
    assert j is not None
    parity = dep.parity
    weights = parity.weight_files[j]
    options = dict(parity.options if parity.options is not None else dep.options)
    return parity.source or dep.source, weights if weights is not None else dep.weights, options


def _context(uid: str | None) -> str:
    """Selection state is per user or session; queries that name none share one context."""
    if uid is None:
        return DEFAULT_CONTEXT
    if not isinstance(uid, str) or not uid:
        raise InvalidInput("'uid' must be a non-empty string")
    return uid


def _succeeded(future: Any) -> bool:
    return isinstance(future, asyncio.Future) and future.done() and future.exception() is None


def _no_replica(path: ModelPath) -> str:
    return f"unavailable: model {path.name!r} has no running replica"


def _failure(replica: Replica, now: float, timeout_s: float) -> str | None:
    """Why a replica counts as failed, or None while it is healthy."""
    if replica.state in ("dead",):
        return "unreachable"
    code = replica.process.exit_code() if replica.process is not None else None
    if code is not None:
        return f"process exited with code {code}"
    if replica.state == "starting":
        return "did not start in time" if now - replica.started_at > _STARTUP_TIMEOUT_S else None
    if now - replica.last_seen > timeout_s:
        return f"no heartbeat for {now - replica.last_seen:.1f}s"
    return None


def _worker_faults(faults: dict[str, Any]) -> dict[str, Any]:
    """The fault spec a worker gets: empty when it injects nothing."""
    return {} if FaultConfig.model_validate(faults).is_noop else faults


def _record(stats: Any) -> dict[str, Any]:
    return {k: getattr(stats, k) for k in stats.__dataclass_fields__}
