"""The admin operations: applications and their links, and what each model runs.

``AppAdmin`` changes applications (it needs no workers). ``ModelAdmin`` deploys, rolls, scales,
switches redundancy and injects faults; the supervisor carries the changes out. Both validate
first and change nothing on a bad request.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import ValidationError

from parityserve.config import (
    Application,
    Deployment,
    FaultConfig,
    ParityConfig,
    RedundancyConfig,
)
from parityserve.core.scheduling import DATA_POOL, parity_pools
from parityserve.core.scheduling.settings import check_cores
from parityserve.errors import (
    ConfigError,
    Conflict,
    InvalidInput,
    ModelLoadError,
    ServiceError,
    Unavailable,
)
from parityserve.models.sources import scrub_paths
from parityserve.models.zoo import check_zoo
from parityserve.runtime.fleet.health import STARTUP_TIMEOUT_S
from parityserve.runtime.fleet.slots import pool_model, slot_of
from parityserve.runtime.fleet.supervisor import Supervisor
from parityserve.runtime.modelpath.dispatch import ModelPath
from parityserve.runtime.serving.applications import AppRuntime
from parityserve.runtime.serving.lookup import find_app, find_model
from parityserve.runtime.serving.state_store import StateStore
from parityserve.runtime.workers.commands import SetFaults

__all__ = ["AppAdmin", "ModelAdmin", "check_zoo_sources", "slo_for"]

_POLL_S = 0.05


def slo_for(apps: dict[str, AppRuntime], model: str, deployment: Deployment) -> float:
    """AIMD backs off against the tightest SLO of the applications using the model."""
    slos = [a.config.slo_ms for a in apps.values() if model in a.config.models]
    return (min(slos) if slos else deployment.timeout_ms) / 1000


class AppAdmin:
    """Adds, removes and relinks applications."""

    def __init__(self, apps: dict[str, AppRuntime], models: dict[str, ModelPath],
                 store: Callable[[], StateStore]) -> None:
        self.apps = apps
        self.models = models
        self.store = store  # the store is opened at start, so it is looked up when needed

    async def add_application(self, app: Application) -> None:
        if app.name in self.apps:
            raise Conflict(f"application {app.name!r} already exists")
        for model in app.models:
            find_model(self.models, model)
        try:
            runtime = AppRuntime.build(app)
        except ConfigError as exc:  # an unknown policy, module or option: the caller's mistake
            raise InvalidInput(f"application {app.name!r}: {exc}") from exc
        self.apps[app.name] = runtime
        self.refresh_slos()

    async def remove_application(self, name: str) -> None:
        find_app(self.apps, name)
        del self.apps[name]
        self.refresh_slos()
        # A later application of the same name starts learning afresh.
        with contextlib.suppress(ServiceError):
            await asyncio.to_thread(self.store().delete_prefix, f"{name}/")

    async def link_models(self, app: str, models: Sequence[str]) -> None:
        state = find_app(self.apps, app)
        if not models:
            raise InvalidInput("link needs at least one model")
        for model in models:
            find_model(self.models, model)
        state.relink(state.config.model_copy(update={"models": tuple(models)}))
        self.refresh_slos()

    def refresh_slos(self) -> None:
        for path in self.models.values():
            path.slo_s = slo_for(self.apps, path.name, path.deployment)
            for replica in path.replicas.values():
                replica.aimd.set_slo(path.slo_s)


class ModelAdmin:
    """Deploys and changes models through the supervisor."""

    def __init__(self, supervisor: Supervisor, clock: Callable[[], float],
                 cores: int | None = None) -> None:
        self.supervisor = supervisor
        self.models = supervisor.models
        self.clock = clock
        self.cores = cores or os.cpu_count() or 1  # what c x intra must fit in

    async def deploy(self, deployment: Deployment) -> None:
        """Deploy a new model, or roll a model to a newer version with no gap in service."""
        check_zoo_sources(deployment)
        old = self.models.get(deployment.name)
        if old is not None and deployment.version <= old.version:
            raise Conflict(
                f"model {deployment.name!r} already serves version {old.version}; "
                f"deploy version {old.version + 1} or higher")
        self.supervisor.check_worker_budget(deployment, replacing=None)
        if old is not None:  # a redeployed model moves to the end of the listing
            del self.models[deployment.name]
        path = self.supervisor.launch_path(deployment)
        if old is None:
            self.models[deployment.name] = path
            return
        self.models[deployment.name] = old  # keep serving the old version while the new loads
        await self._await_first_ready(path)
        self.models[deployment.name] = path
        self.supervisor.retire(old)

    async def _await_first_ready(self, path: ModelPath) -> None:
        deadline = self.clock() + STARTUP_TIMEOUT_S
        while not path.ready_replicas() and path.deployment.replicas:
            error = self.supervisor.load_error(path)
            if error is not None:
                self.supervisor.stop_replicas(path, list(path.replicas.values()))
                raise Unavailable(f"version {path.version} of {path.name!r} not deployed: "
                                  f"{scrub_paths(error)}")
            if self.clock() > deadline:
                raise Unavailable(f"new version of {path.name!r} did not start")
            await asyncio.sleep(_POLL_S)

    async def set_replicas(self, model: str, replicas: int) -> None:
        path = find_model(self.models, model)
        if not 0 <= replicas <= 256:
            raise InvalidInput("replicas must be between 0 and 256")
        deployment = revalidated(path.deployment, replicas=replicas)
        self.supervisor.check_worker_budget(deployment, replacing=path)
        self.supervisor.forgive(path)
        self.supervisor.reconcile(path, deployment)

    async def set_parallelism(self, model: str, parallelism: int | None) -> None:
        """Change how many data replicas run a batch at once; no process starts or stops
        (replicas beyond the limit stay warm), so the supervisor is not involved."""
        path = find_model(self.models, model)
        deployment = revalidated(path.deployment, parallelism=parallelism)
        path.set_parallelism(deployment)

    async def set_threads(self, model: str, threads: int) -> None:
        """Change the intra-op threads of every replica of ``model`` between batches; no
        process restarts. Refused (InvalidInput) when c x threads would not fit the cores."""
        path = find_model(self.models, model)
        deployment = revalidated(path.deployment, threads_per_replica=threads)
        c = deployment.parallelism or max(1, deployment.data_replicas())
        try:
            check_cores(c, threads, self.cores, oversubscribe=deployment.oversubscribe)
        except ValueError as exc:
            raise InvalidInput(f"model {model!r}: {exc}") from None
        self.supervisor.set_threads(path, deployment)

    async def set_redundancy(self, model: str, redundancy: RedundancyConfig,
                             parity: ParityConfig | None) -> None:
        """Switch a model's redundancy mode; groups in flight finish under the old one."""
        path = find_model(self.models, model)
        deployment = revalidated(path.deployment, redundancy=redundancy.model_dump(),
                                 parity=parity.model_dump() if parity else None)
        self.supervisor.check_worker_budget(deployment, replacing=path)
        old_parity = path.deployment.parity
        if old_parity is not None and deployment.parity != old_parity:
            parity_replicas = [r for r in path.replicas.values() if r.pool != DATA_POOL]
            self.supervisor.stop_replicas(path, parity_replicas)  # new parity models load afresh
        self.supervisor.reconcile(path, deployment)
        path.set_redundancy(deployment)

    async def set_faults(self, model: str, replica: str, faults: FaultConfig) -> None:
        path = find_model(self.models, model)
        targets = [r for r in path.replicas.values() if replica in ("all", slot_of(r))]
        if not targets:
            raise InvalidInput(
                f"model {model!r} has no replica {replica!r}; replicas are "
                f"{sorted({slot_of(r) for r in path.replicas.values()})}")
        spec = {} if faults.is_noop else faults.model_dump()
        for target in targets:
            target.faults = spec
            self.supervisor.send(target.rid, SetFaults(spec))


def check_zoo_sources(deployment: Deployment) -> None:
    """Refuse (InvalidInput) a zoo model that every replica would fail to load: an unknown
    name, unknown options or values, weights where none are taken. The zoo says what it
    would refuse without loading anything, so this is a 400 before the 201, not a worker
    that fails after it (other sources are checked where they load: a file must be read)."""
    pools = [DATA_POOL, *parity_pools(deployment.parity.r if deployment.parity else 0)]
    for pool in pools:
        source, weights, options = pool_model(deployment, pool)
        scheme, _, name = source.partition(":")
        if scheme != "zoo":
            continue
        try:
            check_zoo(name, options, weights=weights is not None)
        except ModelLoadError as exc:
            raise InvalidInput(f"model {deployment.name!r}: {exc}") from None


def revalidated(deployment: Deployment, **changes: Any) -> Deployment:
    """The deployment with ``changes``, validated again (a coded mode needs enough replicas
    for one group; parm needs parity models)."""
    try:
        return Deployment.model_validate({**deployment.model_dump(), **changes})
    except ValidationError as exc:
        reasons = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise InvalidInput(reasons) from None
