"""The runtime and the simulator drive the same scheduler: on one scripted scenario per
redundancy mode (a slow replica, a dead one, more load than fits the SLO) they must ask for
exactly the same actions, in the same order, at the same times (``scheduler_script.py``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from parityserve.core.scheduling import MODES
from tests.unit.core.scheduling.scheduler_script import (
    ARRIVALS,
    sim_config,
    through_runtime,
    through_simulator,
)

SLOW, DEAD = "0", "1"


@pytest.mark.parametrize("mode", MODES)
def test_both_drivers_ask_for_the_same_actions(mode: str) -> None:
    config = sim_config(mode)
    simulated = through_simulator(config)
    served = through_runtime(config)
    assert simulated == served


@pytest.mark.parametrize("mode", MODES)
def test_the_scenario_has_a_slow_replica_a_dead_one_and_a_deadline_miss(mode: str) -> None:
    config = sim_config(mode)
    trace = through_simulator(config)
    sends = [step for _, step in trace if step[0] == "send"]
    assert any(s[1] == SLOW for s in sends) and any(s[1] == DEAD for s in sends)
    outcomes: Counter[int] = Counter()
    missed = False
    for when, step in trace:
        if step[0] in ("answer", "expire", "fail"):
            outcomes.update(step[1])
            missed |= step[0] != "answer" or any(
                when > ARRIVALS[q] + config.slo_s for q in step[1])
    assert missed  # expired in the queue, or answered after its deadline (the default)
    # Every query got exactly one outcome, the dead replica's included.
    assert outcomes == Counter(range(len(ARRIVALS)))


@pytest.mark.parametrize("mode", ["berrut", "systematic-berrut"])
def test_both_drivers_hold_a_berrut_group_for_its_wait(mode: str) -> None:
    config = replace(sim_config(mode), berrut_group_wait_s=0.003)
    simulated = through_simulator(config)
    assert simulated == through_runtime(config)
    assert simulated != through_simulator(sim_config(mode))  # the wait changed the schedule
    assert any(step[0] == "wake" for _, step in simulated[:2])  # the first query is held
