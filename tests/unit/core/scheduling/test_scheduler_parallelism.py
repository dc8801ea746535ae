"""Service parallelism c (issue 18's first knob), driven by plain event sequences.

At most c data replicas hold a batch; the others stay ready but do not pull. Changing c
takes nothing back: lowering it only stops new pulls, raising it sends at once.
"""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from parityserve.config import Deployment
from parityserve.core.scheduling import (
    DATA_POOL,
    ModeSettings,
    ParitySettings,
    Scheduler,
    parity_pool,
)
from parityserve.core.scheduling.settings import Batching
from parityserve.core.simulate import ServiceProfile, SimConfig, simulate
from parityserve.errors import ConfigError
from tests.unit.core.scheduling.scheduler_rig import T0, Rig


def three_ready(parallelism: int | None) -> Rig:
    rig = Rig(ModeSettings(), max_batch=1)
    rig.machine.parallelism = parallelism
    for rid in ("r0", "r1", "r2"):
        rig.add(rid)
    return rig


def in_flight(rig: Rig) -> int:
    return sum(1 for r in rig.machine.replicas.values() if r.batch is not None)


def test_c1_keeps_one_batch_in_flight_and_the_first_replica_pulls() -> None:
    rig = three_ready(1)
    for _ in range(3):
        rig.submit()
    assert rig.lines == ["send r0 data [0]"] and in_flight(rig) == 1
    rig.at(0.01).echo("r0")
    assert rig.lines[-2:] == ["answer [0]", "send r0 data [1]"]  # r1, r2 stay warm
    assert in_flight(rig) == 1


def test_raising_c_sends_at_once() -> None:
    rig = three_ready(1)
    for _ in range(4):
        rig.submit()
    actions = rig.record(rig.machine.set_parallelism(3, rig.now))
    assert len(actions) == 2
    assert rig.lines == ["send r0 data [0]", "send r1 data [1]", "send r2 data [2]"]


def test_lowering_c_lets_running_batches_finish_and_sends_nothing_until_below() -> None:
    rig = three_ready(None)
    for _ in range(5):
        rig.submit()
    assert in_flight(rig) == 3
    assert rig.machine.set_parallelism(1, rig.now) == []  # nothing taken back, nothing sent
    assert in_flight(rig) == 3
    rig.at(0.01).echo("r0")
    assert rig.lines[-1] == "answer [0]"  # 2 still run: above the limit, no pull
    rig.echo("r1")
    assert rig.lines[-1] == "answer [1]"  # 1 runs: at the limit
    rig.echo("r2")
    assert rig.lines[-2:] == ["answer [2]", "send r0 data [3]"]
    rig.echo("r0")
    assert rig.lines[-2:] == ["answer [3]", "send r0 data [4]"]
    assert in_flight(rig) == 1


def test_none_lifts_the_limit() -> None:
    rig = three_ready(1)
    for _ in range(3):
        rig.submit()
    rig.record(rig.machine.set_parallelism(None, rig.now))
    assert in_flight(rig) == 3


def test_a_crashed_replica_frees_its_place_for_a_warm_one() -> None:
    rig = three_ready(1)
    rig.submit()
    rig.submit()
    assert rig.crash("r0") == 1
    assert rig.lines[-1] == "send r1 data [0]" and in_flight(rig) == 1


def test_admission_counts_only_the_replicas_allowed_to_run() -> None:
    rig = three_ready(None)
    assert rig.machine.serving_replicas() == 3
    rig.machine.set_parallelism(2, rig.now)
    assert rig.machine.serving_replicas() == 2
    rig.machine.set_parallelism(5, rig.now)
    assert rig.machine.serving_replicas() == 3


def test_parm_limits_data_replicas_only() -> None:
    rig = Rig(ModeSettings("parm", parity=ParitySettings(k=2)), max_batch=1)
    rig.machine.set_parallelism(1, rig.now)
    for rid, pool in (("d0", DATA_POOL), ("d1", DATA_POOL), ("p0", parity_pool(0))):
        rig.add(rid, pool=pool)
    rig.submit([1.0])
    rig.submit([2.0])
    # One data batch at a time; the group of two still gets its parity, on p0.
    assert [x for x in rig.lines if x.startswith("send d")] == ["send d0 data [0]"]
    rig.at(0.01).echo("d0")
    assert "send d0 data [1]" in rig.lines
    assert sum(1 for r in rig.machine.replicas.values()
               if r.pool == DATA_POOL and r.batch is not None) == 1


@pytest.mark.parametrize("bad", [0, -1])
def test_a_limit_below_one_is_refused_and_changes_nothing(bad: int) -> None:
    rig = three_ready(2)
    with pytest.raises(ValueError, match="parallelism must be a whole number >= 1"):
        rig.machine.set_parallelism(bad, rig.now)
    assert rig.machine.parallelism == 2


@pytest.mark.parametrize("mode", ["replication", "reactive", "berrut", "systematic-berrut"])
def test_modes_that_run_copies_side_by_side_refuse_a_limit(mode: str) -> None:
    settings = ModeSettings(mode, reissue_after_s=0.01)
    with pytest.raises(ValueError, match="cannot be limited under redundancy"):
        Scheduler(Batching(1), settings, slo_s=0.1, max_queue=10, assemble=list, parallelism=2)
    machine = Scheduler(Batching(1), settings, slo_s=0.1, max_queue=10, assemble=list)
    with pytest.raises(ValueError, match="cannot be limited"):
        machine.set_parallelism(1, T0)
    assert machine.set_parallelism(None, T0) == []
    limited = Scheduler(Batching(1), ModeSettings(), slo_s=0.1, max_queue=10, assemble=list,
                        parallelism=1)
    with pytest.raises(ValueError, match="cannot be limited"):
        limited.set_mode(settings, T0)
    assert limited.mode.pools == frozenset({DATA_POOL}) and limited.parallelism == 1


def test_deployment_validates_parallelism() -> None:
    assert Deployment(name="m", source="zoo:noop").parallelism is None
    assert Deployment(name="m", source="zoo:noop", parallelism=2).parallelism == 2
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        Deployment(name="m", source="zoo:noop", parallelism=0)
    with pytest.raises(ValidationError, match="cannot be limited under redundancy"):
        Deployment(name="m", source="zoo:noop", replicas=2, parallelism=1,
                   redundancy={"mode": "replication"})


def test_simulator_honours_the_limit() -> None:
    profile = ServiceProfile("m", {1: [10.0]})
    arrivals = [0.0] * 30

    def last_ms(parallelism: int | None) -> float:
        config = SimConfig(replicas=3, max_batch_size=1, parallelism=parallelism)
        result = simulate(config, profile, arrivals, np.random.default_rng(0))
        assert result.summary()["answered"] == {"direct": 30}
        return float(result.latency_s.max() * 1e3)

    assert last_ms(None) == pytest.approx(100.0, rel=0.05)  # 3 at a time
    assert last_ms(1) == pytest.approx(300.0, rel=0.05)  # one at a time
    with pytest.raises(ConfigError, match="cannot be limited"):
        SimConfig(mode="replication", replicas=3, parallelism=1)
