"""The ``scheduler:`` section of a deployment, and how the runtime builds its policy from it
(runtime/fleet/parallelism.py: the profile file checked against the model, the applier's order)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from parityserve.config import Deployment, parse_config
from parityserve.core.parallelism_control import (
    FixedPolicy,
    QueueLengthPolicy,
    SerfPolicy,
    Snapshot,
)
from parityserve.core.queueing import Config
from parityserve.core.tail_policy import TailAwarePolicy
from parityserve.errors import ConfigError, InvalidInput
from parityserve.runtime.fleet.parallelism import SystemApplier, build_policy, current_config

MODEL = {"name": "resnet20", "source": "zoo:echo", "replicas": 2}
PROFILE = {"schema": "parityserve.profile/1", "model": "resnet20", "cores": 2,
           "oversubscribe": False, "elapsed_s": 1.0, "measurements": [],
           "profiles": {"1": [10.0, 9.0], "2": [16.0]}}


def config(scheduler: Any, **model: Any) -> dict[str, Any]:
    return {"models": [{**MODEL, **model, "scheduler": scheduler}]}


def deployment(scheduler: Any, **model: Any) -> Deployment:
    return parse_config(config(scheduler, **model)).models[0]


@pytest.mark.parametrize(("scheduler", "message"), [
    ({"policy": "serf"}, "scheduler.profile: policy serf needs the profile file"),
    ({"policy": "fixed"}, "scheduler.c: policy fixed needs c"),
    ({"policy": "fixed", "c": 1, "profile": "p.json"},
     "scheduler.profile is only used by policy serf, not fixed"),
    ({"policy": "fixed", "c": 1, "slo_p99_ms": 50},
     "scheduler.slo_p99_ms is only used by policy serf, not fixed"),
    ({"policy": "serf", "profile": "p.json", "slo_p99_ms": 0},
     "slo_p99_ms: Input should be greater than 0"),
    ({"policy": "serf", "profile": "p.json", "c": 2},
     "scheduler.c is only used by policy fixed, not serf"),
    ({"policy": "queue-length", "min_c": 3, "max_c": 2}, r"scheduler.max_c \(2\) is below"),
    ({"policy": "adaptive"}, "models.0.scheduler.policy: Input should be 'serf', 'fixed' or "
     "'queue-length'"),
    ({"policy": "fixed", "c": 1, "perod_s": 1}, "scheduler.perod_s: unknown key"),
    ({"policy": "fixed", "c": 1, "period_s": 0},
     "period_s: Input should be greater than or equal to 0.005"),
    ({"policy": "serf", "profile": "p.json", "gain_threshold": 1.0},
     "gain_threshold: Input should be less than 1"),
])
def test_a_bad_scheduler_section_names_the_field(scheduler: dict[str, Any],
                                                 message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(config(scheduler))


def test_the_scheduler_needs_a_mode_c_applies_to() -> None:
    with pytest.raises(ConfigError, match="scheduler: parallelism cannot be limited under "
                       "redundancy 'replication'"):
        parse_config(config({"policy": "fixed", "c": 1},
                            redundancy={"mode": "replication", "d": 2}))


def test_defaults() -> None:
    scheduler = deployment({"policy": "serf", "profile": "p.json"}).scheduler
    assert scheduler is not None
    assert (scheduler.period_s, scheduler.window_s, scheduler.gain_threshold) == (5.0, 30.0, 0.1)
    assert deployment(None).scheduler is None


def test_each_policy_is_built(tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text(json.dumps(PROFILE))
    serf = build_policy(deployment({"policy": "serf", "profile": "p.json"}).scheduler,
                        deployment(None), tmp_path, 2)
    assert isinstance(serf, SerfPolicy) and serf.max_c == 2
    fixed = build_policy(deployment({"policy": "fixed", "c": 2}).scheduler,
                         deployment(None, threads_per_replica=1), tmp_path, 2)
    assert fixed == FixedPolicy(Config(2, 1))
    ql = build_policy(deployment({"policy": "queue-length", "intra": 2}).scheduler,
                      deployment(None), tmp_path, 4)
    assert isinstance(ql, QueueLengthPolicy) and ql.intra == 2
    assert ql.config.max_replicas == 2 and ql.config.initial_replicas == 2


@pytest.mark.parametrize(("text", "message"), [
    (None, "scheduler.profile 'p.json' cannot be read"),
    ("{not json", "scheduler.profile 'p.json' cannot be read"),
    (json.dumps({**PROFILE, "model": "mnist"}),
     "scheduler.profile 'p.json': the profile is of model 'mnist', not 'resnet20'"),
    (json.dumps({**PROFILE, "profiles": {"1": [0.0]}}), "must be a finite number > 0"),
])
def test_a_profile_that_does_not_fit_the_model_is_a_config_error(
        tmp_path: Path, text: str | None, message: str) -> None:
    if text is not None:
        (tmp_path / "p.json").write_text(text)
    cfg = deployment({"policy": "serf", "profile": "p.json"}).scheduler
    with pytest.raises(ConfigError, match=message):
        build_policy(cfg, deployment(None), tmp_path, 2)


def test_serf_with_a_p99_slo_is_tail_aware_and_needs_the_profiles_table(
        tmp_path: Path) -> None:
    cfg = deployment({"policy": "serf", "profile": "p.json", "slo_p99_ms": 300}).scheduler
    (tmp_path / "p.json").write_text(json.dumps(PROFILE))
    with pytest.raises(ConfigError, match="scheduler.profile 'p.json': the profile has no "
                       "tail-aware table"):
        build_policy(cfg, deployment(None), tmp_path, 2)
    level = {"rate": 5.0, "candidates": [{"c": 1, "intra": 1, "p99_s": 0.2}]}
    (tmp_path / "p.json").write_text(json.dumps(
        {**PROFILE, "tail_aware": {"slo_p99_ms": 300.0, "levels": [level]}}))
    built = build_policy(cfg, deployment(None), tmp_path, 2)
    assert isinstance(built, TailAwarePolicy) and built.name == "serf-tail"
    assert built.propose(Snapshot(0.0, 1.0, 0, Config(2, 1))).target == Config(1, 1)


def test_a_bad_queue_length_setting_is_a_config_error() -> None:
    cfg = deployment({"policy": "queue-length", "min_c": 3}).scheduler
    with pytest.raises(ConfigError, match="max_replicas must be an integer >= min_replicas"):
        build_policy(cfg, deployment(None), None, 4)  # 2 replicas, at least 3 at once


@pytest.mark.parametrize(("scheduler", "model", "message"), [
    ({"policy": "fixed", "c": 2, "intra": 2}, {}, "2 requests at once x 2 threads each = 4"),
    ({"policy": "queue-length", "intra": 2}, {}, "2 requests at once x 2 threads each = 4"),
    ({"policy": "fixed", "c": 2, "intra": 3}, {"oversubscribe": True},
     "2 requests at once x 3 threads each = 6 threads, more than the 4"),
])
def test_a_policy_that_could_choose_more_threads_than_the_cores_is_refused(
        scheduler: dict[str, Any], model: dict[str, Any], message: str) -> None:
    cfg = deployment(scheduler).scheduler
    with pytest.raises(ConfigError, match=f"model 'resnet20': scheduler: {message}"):
        build_policy(cfg, deployment(None, **model), None, 2)


def test_serf_keeps_to_the_threads_the_server_allows(tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text(json.dumps({**PROFILE, "oversubscribe": True,
                                                 "profiles": {"1": [10, 9, 8, 7], "2": [16]}}))
    cfg = deployment({"policy": "serf", "profile": "p.json"}).scheduler
    faithful = build_policy(cfg, deployment(None, replicas=4), tmp_path, 2)
    assert isinstance(faithful, SerfPolicy) and faithful.max_threads == 2
    assert {faithful.propose(Snapshot(0.0, rate, 0, Config(1, 1))).target.c
            for rate in (1.0, 20.0, 30.0)} <= {1, 2}
    over = build_policy(cfg, deployment(None, replicas=4, oversubscribe=True), tmp_path, 2)
    assert isinstance(over, SerfPolicy) and over.max_threads == 4
    assert over.propose(Snapshot(0.0, 26.0, 0, Config(1, 1))).target == Config(4, 1)


def test_the_current_configuration_of_a_deployment() -> None:
    assert current_config(deployment(None)) == Config(2, 1)
    assert current_config(deployment(None, parallelism=1, threads_per_replica=2)) == Config(1, 2)


@pytest.mark.parametrize(("current", "target", "calls"), [
    (Config(2, 1), Config(1, 2), [("c", 1), ("threads", 2)]),  # shrink c first
    (Config(1, 2), Config(2, 1), [("threads", 1), ("c", 2)]),  # shrink threads first
    (Config(1, 1), Config(2, 1), [("c", 2)]),
    (Config(1, 1), Config(1, 2), [("threads", 2)]),
])
def test_the_applier_shrinks_a_knob_before_it_grows_the_other(
        current: Config, target: Config, calls: list[tuple[str, int]]) -> None:
    made: list[tuple[str, int]] = []

    async def set_c(model: str, c: int) -> None:
        made.append(("c", c))

    async def set_threads(model: str, threads: int) -> None:
        made.append(("threads", threads))

    asyncio.run(SystemApplier(set_c, set_threads).apply("m", target, current))
    assert made == calls


class _Path:
    """The three things a controller reads of a model path."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        self.probe: Any = None

    def ongoing(self) -> int:
        return 0


class _Refusing:
    def __init__(self) -> None:
        self.calls = 0

    async def apply(self, model: str, config: Config, current: Config) -> None:
        self.calls += 1
        raise InvalidInput("no")


def test_a_refused_switch_is_reported_logged_once_and_retried(
        caplog: pytest.LogCaptureFixture) -> None:
    from parityserve.runtime.fleet.parallelism import Controllers
    from parityserve.runtime.modelpath.metrics import Metrics

    path = _Path(deployment({"policy": "fixed", "c": 1}))
    applier = _Refusing()
    controllers = Controllers({"resnet20": path}, applier,  # type: ignore[dict-item]
                              Metrics(), lambda: 1.0, None, cores=2)

    async def two_ticks() -> dict[str, Any] | None:
        controllers.start()
        for _ in range(2):
            await controllers.tick("resnet20")
        state = controllers.state("resnet20")
        await controllers.close()
        return state

    with caplog.at_level("WARNING", logger="parityserve.runtime.fleet.parallelism"):
        state = asyncio.run(two_ticks())
    assert applier.calls == 2  # tried again next period
    assert state is not None and state["switches"] == 0
    assert state["error"] == "switch to c=1, intra=1 refused: no"
    assert [r.getMessage() for r in caplog.records] == [
        "parallelism resnet20: switch to c=1, intra=1 refused: no"]
    assert state["last_decision"]["chosen"] == {"c": 1, "intra": 1}


def test_a_stopped_controller_leaves_the_path_alone() -> None:
    from parityserve.runtime.fleet.parallelism import Controllers
    from parityserve.runtime.modelpath.metrics import Metrics

    path = _Path(deployment({"policy": "fixed", "c": 1}))
    controllers = Controllers({"resnet20": path}, _Refusing(),  # type: ignore[dict-item]
                              Metrics(), lambda: 1.0, None, cores=2)

    async def start_tick_stop() -> None:
        controllers.start()
        await controllers.tick("resnet20")
        assert path.probe is not None  # watching the path's queries
        await controllers.stop("resnet20")
        await controllers.stop("resnet20")  # stopping twice is harmless

    asyncio.run(start_tick_stop())
    assert path.probe is None and controllers.state("resnet20") is None
