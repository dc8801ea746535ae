"""The online parallelism controller's I/O: one asyncio task per model that ticks each period,
feeds the pure ``core.parallelism_control.Controller`` what the model path saw, and applies the
configuration it chooses live through one small ``Applier``.

A switch changes c (``ServingSystem.set_parallelism``) and intra (``set_threads``), neither of
which restarts a process or takes back a running batch, so no query is lost or answered twice
across it (``tests/integration/test_parallelism_controller_serving.py`` counts them). Every
decision is kept for ``/admin/state``, exported in ``/metrics``, and each switch is logged on
one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from parityserve.config import Deployment, SchedulerConfig
from parityserve.core.autoscale import QueueLengthConfig
from parityserve.core.parallelism_control import (
    Controller,
    Decision,
    FixedPolicy,
    Policy,
    QueueLengthPolicy,
    SerfPolicy,
    SerfProfile,
    read_profile,
)
from parityserve.core.queueing import Config
from parityserve.core.scheduling.settings import OVERSUBSCRIBE_FACTOR, check_cores
from parityserve.core.tail_policy import TailAwarePolicy, TailTable, read_tail_table
from parityserve.errors import ConfigError, ParityServeError
from parityserve.runtime.modelpath.dispatch import ModelPath
from parityserve.runtime.modelpath.metrics import Metrics

__all__ = ["Applier", "Controllers", "LoadProbe", "SystemApplier", "build_policy",
           "current_config"]

log = logging.getLogger(__name__)


class Applier(Protocol):
    """Puts a configuration into effect for one model (raises ServiceError if refused)."""

    async def apply(self, model: str, config: Config, current: Config) -> None: ...


@dataclass(frozen=True)
class SystemApplier:
    """Through the serving system's live knobs. The knob that shrinks goes first, so that
    c x intra never passes through a value the cores check refuses."""

    set_parallelism: Callable[[str, int], Awaitable[None]]
    set_threads: Callable[[str, int], Awaitable[None]]

    async def apply(self, model: str, config: Config, current: Config) -> None:
        if config.intra < current.intra:
            await self.set_threads(model, config.intra)
        if config.c != current.c:
            await self.set_parallelism(model, config.c)
        if config.intra > current.intra:
            await self.set_threads(model, config.intra)


class LoadProbe:
    """Told of each query a model path takes (``ModelPath.probe``): records its arrival, and
    its latency once answered, straight into the controller's windows (which keep counts per
    slice of the window, so memory stays bounded at any rate and any period)."""

    def __init__(self, clock: Callable[[], float], core: Controller) -> None:
        self.clock = clock
        self.core = core

    def __call__(self, now: float, future: asyncio.Future[Any]) -> None:
        self.core.monitor.record((now,))
        future.add_done_callback(lambda _: self._answered(now))

    def _answered(self, sent: float) -> None:
        done = self.clock()
        self.core.latency.record(((done, done - sent),))


def current_config(deployment: Deployment) -> Config:
    """What the model runs now: c (unlimited means every data replica) and intra."""
    c = deployment.parallelism or max(1, deployment.data_replicas())
    return Config(c, deployment.threads_per_replica)


def _load_profile(cfg: SchedulerConfig, model: str, base_dir: Path | None
                  ) -> tuple[SerfProfile, TailTable | None]:
    """The profile, and its tail-aware table when the policy has a p99 SLO."""
    assert cfg.profile is not None
    path = Path(cfg.profile).expanduser()
    path = path if path.is_absolute() or base_dir is None else base_dir / path
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model {model!r}: scheduler.profile {cfg.profile!r} cannot be "
                          f"read: {exc}") from None
    try:
        profile = read_profile(doc, model=model)
        if cfg.slo_p99_ms is None:
            return profile, None
        return profile, read_tail_table(doc, slo_p99_ms=cfg.slo_p99_ms)
    except ValueError as exc:
        raise ConfigError(f"model {model!r}: scheduler.profile {cfg.profile!r}: {exc}") from None


def build_policy(cfg: SchedulerConfig, deployment: Deployment, base_dir: Path | None,
                 cores: int) -> Policy:
    """The policy ``cfg`` names for ``deployment``; ConfigError naming the field if it cannot
    be built, or if it could choose more threads than the server lets ``cores`` run."""
    try:
        return _build(cfg, deployment, base_dir, cores)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"model {deployment.name!r}: scheduler: {exc}") from None


def _build(cfg: SchedulerConfig, deployment: Deployment, base_dir: Path | None,
           cores: int) -> Policy:
    replicas = max(1, deployment.data_replicas())
    intra = cfg.intra or deployment.threads_per_replica
    over = deployment.oversubscribe
    if cfg.policy == "serf":
        profile, table = _load_profile(cfg, deployment.name, base_dir)
        serf = SerfPolicy(profile, max_c=replicas,
                          max_threads=cores * (OVERSUBSCRIBE_FACTOR if over else 1))
        return serf if table is None else TailAwarePolicy(serf, table)
    if cfg.policy == "fixed":
        assert cfg.c is not None
        check_cores(cfg.c, intra, cores, oversubscribe=over)
        return FixedPolicy(Config(cfg.c, intra))
    top = cfg.max_c or replicas
    check_cores(top, intra, cores, oversubscribe=over)
    start = min(max(cfg.min_c, current_config(deployment).c), top)
    return QueueLengthPolicy(QueueLengthConfig(
        target_ongoing_requests=cfg.target_ongoing_requests, min_replicas=cfg.min_c,
        max_replicas=top, initial_replicas=start, upscale_delay_s=cfg.upscale_delay_s,
        downscale_delay_s=cfg.downscale_delay_s,
        look_back_period_s=cfg.look_back_period_s), intra)


class _ModelControl:
    """One model's controller task and what it last did."""

    def __init__(self, name: str, cfg: SchedulerConfig, policy: Policy, now: float) -> None:
        self.name = name
        self.cfg = cfg
        self.core = Controller(policy, window_s=cfg.window_s,
                               gain_threshold=cfg.gain_threshold, start_s=now)
        self.probe: LoadProbe | None = None
        self.task: asyncio.Task[None] | None = None
        self.error: str | None = None  # the last switch the system refused
        self.switches = 0  # applied (the core counts decided ones; the system may refuse)


class Controllers:
    """The controllers of every model that has a ``scheduler``."""

    def __init__(self, models: dict[str, ModelPath], applier: Applier, metrics: Metrics,
                 clock: Callable[[], float], base_dir: Path | None, cores: int) -> None:
        self.models = models
        self.cores = cores  # what c x intra must fit in (ModelAdmin checks the same)
        self.applier = applier
        self.metrics = metrics
        self.clock = clock
        self.base_dir = base_dir
        self._controls: dict[str, _ModelControl] = {}

    def check(self, deployments: Iterable[Deployment]) -> None:
        """Build every configured policy once, so that a bad profile fails the start (a
        ConfigError naming the field) before any worker is launched."""
        for deployment in deployments:
            if deployment.scheduler is not None:
                build_policy(deployment.scheduler, deployment, self.base_dir, self.cores)

    def start(self) -> None:
        """Build and start the configured controllers."""
        built = {name: (path.deployment.scheduler, self._policy(path, path.deployment.scheduler))
                 for name, path in self.models.items() if path.deployment.scheduler}
        for name, (cfg, policy) in built.items():
            assert cfg is not None
            self._start(name, cfg, policy)

    def _policy(self, path: ModelPath, cfg: SchedulerConfig | None) -> Policy:
        assert cfg is not None
        return build_policy(cfg, path.deployment, self.base_dir, self.cores)

    def _start(self, name: str, cfg: SchedulerConfig, policy: Policy) -> None:
        control = _ModelControl(name, cfg, policy, self.clock())
        self._controls[name] = control
        self._probe(control, self.models[name])  # from now on, not from the first tick
        control.task = asyncio.get_running_loop().create_task(self._run(control))

    def set_policy(self, name: str, cfg: SchedulerConfig) -> None:
        """Change (or start) a model's controller live; ConfigError, changing nothing, if the
        policy cannot be built."""
        path = self.models[name]
        policy = build_policy(cfg, path.deployment, self.base_dir, self.cores)
        control = self._controls.get(name)
        if control is None:
            self._start(name, cfg, policy)
            return
        control.core.set_policy(policy, cfg.gain_threshold, window_s=cfg.window_s,
                                now=self.clock())
        control.cfg = cfg

    def running(self, name: str) -> bool:
        return name in self._controls

    async def stop(self, name: str) -> None:
        """Stop a model's controller (a version deployed without a ``scheduler``); the
        configuration it set stays."""
        control = self._controls.pop(name, None)
        if control is None:
            return
        if control.task is not None:
            control.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await control.task
        path = self.models.get(name)
        if path is not None and path.probe is control.probe:
            path.probe = None

    async def _run(self, control: _ModelControl) -> None:
        while True:
            await asyncio.sleep(control.cfg.period_s)
            try:
                await self.tick(control.name)
            except Exception:  # a controller must outlive one bad tick; say what went wrong
                log.exception("parallelism controller of %s: tick failed", control.name)

    def _probe(self, control: _ModelControl, path: ModelPath) -> LoadProbe:
        # A redeployed model gets a new path: the probe follows it.
        if control.probe is None or path.probe is not control.probe:
            control.probe = LoadProbe(self.clock, control.core)
            path.probe = control.probe
        return control.probe

    async def tick(self, name: str) -> Decision:
        control, path = self._controls[name], self.models[name]
        self._probe(control, path)
        current = current_config(path.deployment)
        decision = control.core.tick(self.clock(), current, path.ongoing())
        applied = decision.switched and await self._switch(control, decision)
        self._export(name, decision, applied)
        return decision

    async def _switch(self, control: _ModelControl, decision: Decision) -> bool:
        try:
            await self.applier.apply(control.name, decision.chosen, decision.current)
        except ParityServeError as exc:
            error = (f"switch to c={decision.chosen.c}, intra={decision.chosen.intra} "
                     f"refused: {exc}")
            if error != control.error:  # a policy retrying each period logs it once
                log.warning("parallelism %s: %s", control.name, error)
            control.error = error
            return False
        control.error = None
        control.switches += 1
        log.info("parallelism %s: c=%d intra=%d -> c=%d intra=%d (%s, lambda=%.3g/s): %s",
                 control.name, decision.current.c, decision.current.intra, decision.chosen.c,
                 decision.chosen.intra, decision.policy, decision.arrival_rate,
                 decision.reason)
        return True

    def _export(self, name: str, decision: Decision, switched: bool) -> None:
        shown = current_config(self.models[name].deployment)  # what runs, even if refused
        self.metrics.parallelism_decision(
            name, decision.policy, c=shown.c, intra=shown.intra,
            arrival_rate=decision.arrival_rate, predicted_s=decision.predicted_chosen_s,
            observed_s=decision.observed_s, switched=switched)

    def state(self, name: str) -> dict[str, Any] | None:
        """For ``/admin/state``: the policy, its settings and the last decision."""
        control = self._controls.get(name)
        if control is None:
            return None
        last = control.core.last
        return {"policy": control.cfg.policy, "settings": control.cfg.model_dump(mode="json"),
                "switches": control.switches, "error": control.error,
                "last_decision": None if last is None else last.to_dict()}

    async def close(self) -> None:
        for name in list(self._controls):
            await self.stop(name)
