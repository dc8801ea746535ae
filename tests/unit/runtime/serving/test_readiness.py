"""Readiness is judged when asked: a replica counts only while it is ready, heartbeating,
alive, and running the model itself. No processes: a fake clock and fake process handles."""

from __future__ import annotations

import pytest

from parityserve.config import Deployment, Server, ServingConfig
from parityserve.core.batching import AIMDController
from parityserve.runtime.modelpath.dispatch import ModelPath, Replica
from parityserve.runtime.modelpath.metrics import Metrics
from parityserve.runtime.serving.system import ServingSystem
from tests.unit.runtime.modelpath.dispatch_fakes import T0, FakeClock, FakeLink

TIMEOUT_S = 0.6


class FakeProcess:
    def __init__(self, code: int | None = None) -> None:
        self.code = code

    def exit_code(self) -> int | None:
        return self.code


def _system(clock: FakeClock, **replica: object) -> ServingSystem:
    """A system holding model "m" with one replica described by ``replica`` (none if empty),
    and model "idle" that asks for no replicas."""
    config = ServingConfig(server=Server(heartbeat_timeout_ms=TIMEOUT_S * 1000))
    system = ServingSystem(config, clock=clock, metrics=Metrics())
    for name, count in (("m", 1), ("idle", 0)):
        dep = Deployment(name=name, source="zoo:noop", replicas=count)
        system.models[name] = ModelPath(dep, link=FakeLink(), metrics=system.metrics,
                                        cache=system.cache, clock=clock, slo_s=1.0,
                                        max_queue=10)
    if replica:
        fields = {"state": "ready", "process": FakeProcess(), **replica}
        r = Replica("m/v1/0#1", 0, AIMDController(8, 1.0), T0, **fields)
        system.models["m"].replicas[r.rid] = r
    return system


@pytest.mark.parametrize(("replica", "age_s", "ready"), [
    ({}, 0.0, False),                                   # no replica at all
    ({"state": "ready"}, 0.0, True),
    ({"state": "ready"}, TIMEOUT_S * 0.9, True),
    ({"state": "ready"}, TIMEOUT_S * 1.1, False),       # hung: heartbeats stopped
    ({"state": "ready", "process": FakeProcess(-9)}, 0.0, False),  # killed, not yet reaped
    ({"state": "ready", "process": None}, 0.0, True),   # joined by itself, heartbeating
    ({"state": "starting"}, 0.0, False),                # still loading
    ({"state": "dead"}, 0.0, False),
    ({"state": "retiring"}, 0.0, False),
    ({"state": "ready", "pool": "parity0"}, 0.0, False),  # a parity model cannot answer alone
])
def test_readiness(replica, age_s, ready) -> None:
    clock = FakeClock()
    system = _system(clock, **replica)
    clock.advance(age_s)
    assert system.model_ready("m", None) is ready
    assert system.is_ready() is ready  # "idle" asks for no replica, so it never holds it back
    assert system.model_ready("idle", None) is False


class _Supervisor:
    """The one thing readiness asks the supervisor: which models failed to load."""

    def __init__(self, errors: dict[str, str]) -> None:
        self.errors = errors

    def load_error(self, path: ModelPath) -> str | None:
        return self.errors.get(path.name)


@pytest.mark.parametrize(("replica", "server_ready"), [
    ({"state": "ready"}, True),  # the broken model does not hold the server back
    ({"state": "starting"}, False),  # a model still starting does
    ({"state": "ready", "process": FakeProcess(-9)}, False),  # and so does one just killed
])
def test_a_model_that_failed_to_load_is_not_ready_itself_but_the_server_is(
        replica, server_ready) -> None:
    clock = FakeClock()
    system = _system(clock, **replica)
    broken = Deployment(name="broken", source="zoo:noop", replicas=1)
    system.models["broken"] = ModelPath(broken, link=FakeLink(), metrics=system.metrics,
                                        cache=system.cache, clock=clock, slo_s=1.0,
                                        max_queue=10)
    assert not system.is_ready()  # starting, no load error yet: the server waits for it
    system._supervisor = _Supervisor({"broken": "RuntimeError: no weights"})  # type: ignore
    assert system.model_ready("broken", None) is False
    assert system.is_ready() is server_ready
