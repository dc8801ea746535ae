"""The tail-aware controller policy: the fewest cores whose simulated p99 meets the SLO at the
estimated load, read from the profile's table (``core/tail_policy``)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from parityserve.core.parallelism_control import (
    Controller,
    SerfPolicy,
    SerfProfile,
    Snapshot,
)
from parityserve.core.profiling import Measurement
from parityserve.core.queueing import Config
from parityserve.core.tail_choice import tail_table
from parityserve.core.tail_policy import TailAwarePolicy, read_tail_table

PROFILES = {1: (10.0, 9.0), 2: (16.0,)}
SERF = SerfPolicy(SerfProfile("m", 2, False, PROFILES), max_c=2)
ONE_NARROW, TWO_NARROW, ONE_WIDE = Config(1, 1), Config(2, 1), Config(1, 2)


def candidate(config: Config, p99_ms: float | None) -> dict[str, Any]:
    return {"c": config.c, "intra": config.intra, "cores": config.cores,
            "p99_s": None if p99_ms is None else p99_ms / 1000, "mean_s": 0.05, "n": 4500}


# At 5/s every configuration meets 300 ms and one narrow request is the cheapest; at 10/s
# only the two-core ones do, and two narrow requests have the lower p99 of those; at 15/s
# none does.
DOC = {"tail_aware": {"slo_p99_ms": 300.0, "queries": 5000, "levels": [
    {"rate": 10.0, "candidates": [candidate(ONE_NARROW, 900.0), candidate(TWO_NARROW, 200.0),
                                  candidate(ONE_WIDE, 250.0)]},
    {"rate": 5.0, "candidates": [candidate(ONE_NARROW, 280.0), candidate(TWO_NARROW, 150.0),
                                 candidate(ONE_WIDE, 120.0)]},
    {"rate": 15.0, "candidates": [candidate(ONE_NARROW, None), candidate(TWO_NARROW, 400.0),
                                  candidate(ONE_WIDE, 700.0)]}]}}


def policy(doc: dict[str, Any] = DOC, serf: SerfPolicy = SERF) -> TailAwarePolicy:
    return TailAwarePolicy(serf, read_tail_table(doc, slo_p99_ms=300.0))


@pytest.mark.parametrize(("rate", "target"), [
    (0.0, ONE_NARROW),  # idle: the first level, one core meets the SLO
    (5.0, ONE_NARROW),  # on a level: that level
    (5.1, TWO_NARROW),  # rounded up to 10/s, where one core no longer meets it; 2 cores tie
    (10.0, TWO_NARROW),  # on cores, then the lower simulated p99
])
def test_the_fewest_cores_that_meet_the_slo_at_the_next_level_up(rate: float,
                                                                target: Config) -> None:
    proposal = policy().propose(Snapshot(0.0, rate, 0, ONE_WIDE))
    assert proposal.target == target and proposal.gated
    assert "fewest cores meeting p99 <= 300 ms" in proposal.reason
    assert proposal.gain == (0.0 if target == ONE_WIDE else 1.0)


def test_where_nothing_meets_the_slo_it_falls_back_to_serfs_lowest_mean() -> None:
    proposal = policy().propose(Snapshot(0.0, 12.0, 0, ONE_NARROW))
    assert proposal.target == SERF.propose(Snapshot(0.0, 12.0, 0, ONE_NARROW)).target
    assert proposal.reason.startswith("no allowed configuration meets p99 <= 300 ms at 15/s")
    beyond = policy().propose(Snapshot(0.0, 40.0, 0, ONE_NARROW))
    assert beyond.reason.startswith("above the table's last load level")


def test_only_the_configurations_the_server_allows_are_chosen() -> None:
    one_at_once = SerfPolicy(SerfProfile("m", 2, False, PROFILES), max_c=1)
    assert policy(serf=one_at_once).propose(Snapshot(0.0, 10.0, 0, ONE_NARROW)).target == (
        ONE_WIDE)


def test_fewer_cores_wait_out_the_hysteresis_more_cores_go_in_at_once() -> None:
    control = Controller(policy(), window_s=1.0, gain_threshold=0.1, start_s=0.0)
    first = control.tick(1.0, ONE_WIDE, 0, arrivals=[0.5])  # about 1/s: one narrow
    assert not first.switched and "period 1 of 2" in first.reason
    assert control.tick(1.5, ONE_WIDE, 0, arrivals=[1.2]).chosen == ONE_NARROW
    busy = [2.0 + i / 10 for i in range(10)]  # 10/s: one core no longer meets the SLO
    up = control.tick(3.0, ONE_NARROW, 0, arrivals=busy)
    assert up.switched and up.chosen == TWO_NARROW  # in the first period


@pytest.mark.parametrize(("doc", "message"), [
    ({}, r"the profile has no tail-aware table \(write one with `parityserve profile .* "
         r"--slo-p99-ms 300`\)"),
    ({"tail_aware": {**DOC["tail_aware"], "slo_p99_ms": 250.0}},
     "the profile's tail-aware table is for p99 <= 250 ms, not 300 ms"),
    ({"tail_aware": {"slo_p99_ms": 300.0, "levels": [{"rate": 1.0}]}},
     "malformed tail-aware table"),
    ({"tail_aware": {"slo_p99_ms": 300.0, "levels": []}}, "has no load levels"),
])
def test_a_table_that_does_not_fit_is_refused_naming_the_problem(doc: dict[str, Any],
                                                                  message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_tail_table(doc, slo_p99_ms=300.0)


def test_the_profilers_table_reads_back_and_drives_the_policy() -> None:
    """``tail_table`` (what ``parityserve profile --slo-p99-ms`` writes) on deterministic
    service times: 100 ms alone, 111 ms two at once, 62.5 ms with two threads."""
    def m(c: int, intra: int, mean: float) -> Measurement:
        return Measurement(c, intra, 10, mean, 1 / mean, mean, mean, 0, (mean,) * 10)

    measured = [m(1, 1, 0.1), m(2, 1, 1 / 9), m(1, 2, 0.0625)]
    doc = {"tail_aware": tail_table(measured, [2.0, 8.0, 14.0], 0.3, cores=2, queries=2000)}
    table = read_tail_table(doc, slo_p99_ms=300.0)
    assert [row.rate for row in table.rows] == [2.0, 8.0, 14.0]
    assert math.isinf(table.rows[2].p99_s[ONE_NARROW])  # 14/s > 10/s: unstable
    low = TailAwarePolicy(SERF, table).propose(Snapshot(0.0, 1.0, 0, ONE_WIDE))
    assert low.target == ONE_NARROW  # one core suffices at 2/s
