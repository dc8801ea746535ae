"""The online parallelism controller's pure part (core/parallelism_control.py).

The profile used throughout has interference: with one thread per request, μ_1 = 10/s and
μ_2 = 9/s (two at once slow each other down); one request with two threads runs at 16/s. So at
low load one request using both cores is fastest (c=1, intra=2), and near its capacity of 16/s
two requests side by side (c=2, intra=1, capacity 18/s) win.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parityserve.core import parallelism_control as pc
from parityserve.core.autoscale import QueueLengthConfig
from parityserve.core.parallelism_control import (
    ArrivalMonitor,
    Controller,
    FixedPolicy,
    Hysteresis,
    LatencyWindow,
    Proposal,
    QueueLengthPolicy,
    SerfPolicy,
    SerfProfile,
    Snapshot,
    read_profile,
)
from parityserve.core.queueing import Config, predict_latency

PROFILES = {1: (10.0, 9.0), 2: (16.0,)}
PROFILE = SerfProfile("resnet20", cores=2, oversubscribe=False, profiles=PROFILES)
ONE_WIDE, TWO_NARROW, ONE_NARROW = Config(1, 2), Config(2, 1), Config(1, 1)


def doc(**changes: Any) -> dict[str, Any]:
    base = {"schema": "parityserve.profile/1", "model": "resnet20", "cores": 2,
            "oversubscribe": False, "elapsed_s": 1.0, "measurements": [],
            "profiles": {"1": [10.0, 9.0], "2": [16.0]}}
    return {**base, **changes}


def test_public_names() -> None:
    assert sorted(pc.__all__) == sorted([
        "ArrivalMonitor", "Controller", "Decision", "FixedPolicy", "Hysteresis",
        "LatencyWindow", "PROFILE_SCHEMA", "Policy", "Proposal", "QueueLengthPolicy",
        "SerfPolicy", "SerfProfile", "Snapshot", "read_profile"])


# ---------------------------------------------------------------- the load monitor


@pytest.mark.parametrize(("times", "now", "window", "start", "rate"), [
    ([], 10.0, 5.0, 0.0, 0.0),
    ([6.0, 7.0, 8.0, 9.0, 10.0], 10.0, 5.0, 0.0, 1.0),  # 5 in (5, 10]
    ([1.0, 2.0, 6.0, 7.0], 10.0, 5.0, 0.0, 0.4),  # the two old ones left the window
    ([5.0], 10.0, 5.0, 0.0, 0.0),  # the window is open at its left edge
    ([0.5, 1.0, 1.5, 2.0], 2.0, 10.0, 0.0, 2.0),  # a young window divides by its age
    ([1.0], 0.0, 10.0, 0.0, 0.0),  # no time has passed
    ([11.0], 10.0, 5.0, 0.0, 0.0),  # a future arrival does not count yet
])
def test_arrival_rate_over_the_window(times: list[float], now: float, window: float,
                                      start: float, rate: float) -> None:
    monitor = ArrivalMonitor(window, start)
    monitor.record(times)
    assert monitor.rate(now) == pytest.approx(rate)


@pytest.mark.parametrize("window", [0.0, -1.0, math.inf, math.nan])
def test_a_window_must_have_width(window: float) -> None:
    with pytest.raises(ValueError, match="window_s must be a finite number > 0"):
        ArrivalMonitor(window, 0.0)


def test_latency_window_means_what_was_answered_recently() -> None:
    seen = LatencyWindow(5.0)
    assert seen.mean(0.0) is None
    seen.record([(1.0, 0.5), (6.0, 0.1), (7.0, 0.3)])
    assert seen.mean(7.0) == pytest.approx(0.2)  # (1.0, 0.5) is older than the window
    assert seen.mean(20.0) is None


# ---------------------------------------------------------------- the profile


def test_a_profile_document_is_read() -> None:
    profile = read_profile(doc(), model="resnet20")
    assert profile.profiles == PROFILES and profile.cores == 2 and not profile.oversubscribe


def test_rates_are_derived_from_measurements_when_profiles_is_absent() -> None:
    measured = [{"c": 1, "intra": 1, "mu": 10.0}, {"c": 2, "intra": 1, "mu": 9.0},
                {"c": 1, "intra": 2, "mu": 16.0}]
    assert read_profile(doc(profiles=None, measurements=measured),
                        model="resnet20").profiles == PROFILES


@pytest.mark.parametrize(("changes", "message"), [
    ({"schema": "other/1"}, "not a parityserve.profile/1 document"),
    ({"model": "mnist"}, "the profile is of model 'mnist', not 'resnet20'"),
    ({"cores": None}, "malformed profile document"),
    ({"profiles": None, "measurements": [{"c": 2, "intra": 1, "mu": 9.0}]},
     r"intra=1: measured c = \[2\], need 1..n with no gap"),
    ({"profiles": {"1": [10.0, -1.0]}}, "must be a finite number > 0"),
    ({"profiles": {"4": [10.0]}}, "no profiled configuration fits"),
])
def test_a_bad_profile_is_refused_naming_the_problem(changes: dict[str, Any],
                                                     message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_profile(doc(**changes), model="resnet20")


def test_each_configurations_overhead_is_read_from_its_measurement() -> None:
    measured = [{"c": 1, "intra": 1, "mu": 10.0, "overhead_s": 0.001},
                {"c": 2, "intra": 1, "mu": 9.0, "overhead_s": 0.004},
                {"c": 1, "intra": 2, "mu": 16.0}]  # an older document: no overhead, 0
    profile = read_profile(doc(measurements=measured), model="resnet20")
    assert profile.overheads == {ONE_NARROW: 0.001, TWO_NARROW: 0.004, ONE_WIDE: 0.0}


@pytest.mark.parametrize(("measurement", "message"), [
    ({"c": 1, "intra": 1, "mu": 10.0, "overhead_s": -0.1}, "overhead_s must be a finite"),
    ({"c": 1, "intra": 1, "mu": 10.0, "overhead_s": "slow"}, "malformed profile measurement"),
    ({"intra": 1, "mu": 10.0}, "malformed profile measurement"),
])
def test_a_bad_overhead_is_refused(measurement: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_profile(doc(measurements=[measurement]), model="resnet20")


def test_not_a_mapping_is_refused() -> None:
    with pytest.raises(ValueError, match="not a parityserve.profile/1 document"):
        read_profile([1, 2], model="resnet20")


# ---------------------------------------------------------------- the policies


def seen(rate: float, current: Config = ONE_WIDE, ongoing: int = 0,
         time_s: float = 0.0) -> Snapshot:
    return Snapshot(time_s, rate, ongoing, current)


@pytest.mark.parametrize(("rate", "current", "target"), [
    (0.0, ONE_WIDE, ONE_WIDE),  # idle: the fastest single request
    (2.0, TWO_NARROW, ONE_WIDE),
    (15.0, ONE_WIDE, TWO_NARROW),  # near 16/s, two side by side queue far less
    (17.0, ONE_WIDE, TWO_NARROW),  # only (2, 1) is stable
    (30.0, ONE_NARROW, TWO_NARROW),  # none is: the one that drains fastest
])
def test_serf_proposes_the_predicted_argmin(rate: float, current: Config,
                                            target: Config) -> None:
    proposal = SerfPolicy(PROFILE, max_c=2).propose(seen(rate, current))
    assert proposal.target == target and proposal.gated
    if current == target:
        assert proposal.gain == 0.0


def test_serf_gain_is_the_relative_drop_in_predicted_latency() -> None:
    proposal = SerfPolicy(PROFILE, max_c=2).propose(seen(2.0, TWO_NARROW))
    before = predict_latency(2.0, [10.0, 9.0]).latency
    after = predict_latency(2.0, [16.0]).latency
    assert proposal.predicted_current_s == pytest.approx(before)
    assert proposal.predicted_target_s == pytest.approx(after)
    assert proposal.gain == pytest.approx((before - after) / before)


@pytest.mark.parametrize(("rate", "current", "gain"), [
    (17.0, ONE_WIDE, 1.0),  # unstable now, stable target: all to win
    (30.0, ONE_NARROW, (18.0 - 10.0) / 18.0),  # both unstable: the throughput gained
    (2.0, Config(2, 2), 1.0),  # running something never profiled
])
def test_serf_gain_when_a_latency_is_infinite_or_unknown(rate: float, current: Config,
                                                         gain: float) -> None:
    proposal = SerfPolicy(PROFILE, max_c=2).propose(seen(rate, current))
    assert proposal.gain == pytest.approx(gain)


def test_serf_ranks_by_the_queue_wait_plus_each_configurations_overhead() -> None:
    """At 13/s two narrow requests side by side win on the queue alone (170 ms against
    198 ms); when running two at once costs 40 ms more outside the queue (a crowded
    frontend core), one wide request is the better choice, and the predicted latencies
    include that time."""
    assert SerfPolicy(PROFILE, max_c=2).propose(seen(13.0, TWO_NARROW)).target == TWO_NARROW
    crowded = SerfProfile("resnet20", 2, False, PROFILES, {TWO_NARROW: 0.040})
    proposal = SerfPolicy(crowded, max_c=2).propose(seen(13.0, TWO_NARROW))
    assert proposal.target == ONE_WIDE
    queue_only = predict_latency(13.0, [10.0, 9.0]).latency
    assert proposal.predicted_current_s == pytest.approx(queue_only + 0.040)
    assert proposal.predicted_target_s == pytest.approx(predict_latency(13.0, [16.0]).latency)


def test_an_unstable_configuration_stays_infinite_whatever_its_overhead() -> None:
    crowded = SerfProfile("resnet20", 2, False, PROFILES, {ONE_WIDE: 0.010})
    assert math.isinf(SerfPolicy(crowded, max_c=2).predict(17.0, ONE_WIDE).latency)


def test_serf_never_proposes_more_at_once_than_there_are_replicas() -> None:
    assert SerfPolicy(PROFILE, max_c=1).propose(seen(15.0)).target.c == 1
    with pytest.raises(ValueError, match=r"no profiled configuration has c <= 0"):
        SerfPolicy(PROFILE, max_c=0)


def test_fixed_and_queue_length_are_not_gated() -> None:
    assert FixedPolicy(TWO_NARROW).propose(seen(0.0)) == Proposal(
        TWO_NARROW, "fixed at c=2, intra=1")
    policy = QueueLengthPolicy(QueueLengthConfig(max_replicas=4, upscale_delay_s=0,
                                                 look_back_period_s=1), intra=1)
    proposal = policy.propose(seen(0.0, ongoing=8, time_s=0.0))
    assert proposal.target == Config(4, 1) and not proposal.gated
    assert "target 2/replica: desired c=4" in proposal.reason


def test_queue_length_waits_out_its_delay() -> None:
    policy = QueueLengthPolicy(QueueLengthConfig(max_replicas=4, upscale_delay_s=2,
                                                 look_back_period_s=1), intra=2)
    targets = [policy.propose(seen(0.0, ongoing=8, time_s=float(t))).target.c
               for t in range(4)]
    assert targets == [1, 1, 4, 4]


# ---------------------------------------------------------------- hysteresis


def want(target: Config, gain: float) -> Proposal:
    return Proposal(target, "", gain=gain, gated=True)


@pytest.mark.parametrize(("steps", "switches"), [
    ([(TWO_NARROW, 0.5)], [False]),  # one period is never enough
    ([(TWO_NARROW, 0.5)] * 2, [False, True]),
    ([(TWO_NARROW, 0.5)] * 4, [False, True, False, True]),  # the streak starts over
    ([(TWO_NARROW, 0.5), (ONE_NARROW, 0.5), (TWO_NARROW, 0.5)], [False] * 3),  # not the same
    ([(TWO_NARROW, 0.5), (TWO_NARROW, 0.1), (TWO_NARROW, 0.5)], [False] * 3),  # at threshold
    ([(TWO_NARROW, 0.5), (ONE_WIDE, 0.0), (TWO_NARROW, 0.5)], [False] * 3),  # stay resets
    ([(TWO_NARROW, 0.11), (TWO_NARROW, 0.9)], [False, True]),
])
def test_hysteresis_needs_the_same_gain_two_periods_in_a_row(
        steps: list[tuple[Config, float]], switches: list[bool]) -> None:
    gate = Hysteresis(0.1)
    assert [gate.admit(ONE_WIDE, want(t, g))[0] for t, g in steps] == switches


@pytest.mark.parametrize("threshold", [-0.1, 1.0, math.nan])
def test_a_threshold_outside_0_to_1_is_refused(threshold: float) -> None:
    with pytest.raises(ValueError, match="gain threshold must lie in"):
        Hysteresis(threshold)


def test_hysteresis_says_why_it_waits() -> None:
    gate = Hysteresis(0.1)
    assert gate.admit(ONE_WIDE, want(TWO_NARROW, 0.05)) == (False, "gain 5.0% <= threshold 10%")
    assert gate.admit(ONE_WIDE, want(TWO_NARROW, 0.5)) == (False, "gain 50.0%, period 1 of 2")
    assert gate.admit(ONE_WIDE, want(TWO_NARROW, 0.5)) == (True, "gain 50.0% for 2 periods")


# ---------------------------------------------------------------- the controller


def arrivals(rate: float, start: float, end: float) -> list[float]:
    """Evenly spaced arrivals at ``rate`` in (start, end]."""
    n = round(rate * (end - start))
    return [start + (i + 1) * (end - start) / n for i in range(n)] if n else []


def run(controller: Controller, rates: list[float], current: Config,
        period: float = 1.0) -> list[pc.Decision]:
    """One tick per period at each rate; a switch is applied at once."""
    decisions = []
    for k, rate in enumerate(rates):
        now = (k + 1) * period
        decision = controller.tick(now, current, 0, arrivals(rate, now - period, now))
        current = decision.chosen
        decisions.append(decision)
    return decisions


def serf(threshold: float = 0.1, window_s: float = 3.0) -> Controller:
    return Controller(SerfPolicy(PROFILE, max_c=2), window_s=window_s,
                      gain_threshold=threshold, start_s=0.0)


def test_serf_switches_after_two_periods_and_records_why() -> None:
    controller = serf(window_s=1.0)
    decisions = run(controller, [15.0, 15.0, 15.0], ONE_WIDE)
    assert [d.switched for d in decisions] == [False, True, False]
    assert controller.switches == 1
    first, second = decisions[0], decisions[1]
    assert first.chosen == ONE_WIDE and "period 1 of 2" in first.reason
    assert second.chosen == TWO_NARROW and second.current == ONE_WIDE
    assert second.arrival_rate == pytest.approx(15.0)
    assert second.predicted_chosen_s == pytest.approx(predict_latency(15.0, [10.0, 9.0]).latency)
    assert "best c=2, intra=1; gain" in second.reason
    record = second.to_dict()
    assert record["chosen"] == {"c": 2, "intra": 1} and record["switched"] is True
    assert record["predicted_chosen_ms"] == pytest.approx(second.predicted_chosen_s * 1000)


def test_a_load_step_moves_the_configuration_and_back() -> None:
    decisions = run(serf(window_s=1.0), [1.0] * 3 + [15.0] * 3 + [1.0] * 3, ONE_WIDE)
    assert [(k, d.chosen) for k, d in enumerate(decisions) if d.switched] == [
        (4, TWO_NARROW), (7, ONE_WIDE)]


def test_observed_latency_is_the_mean_over_the_window() -> None:
    controller = serf()
    assert controller.tick(1.0, ONE_WIDE, 0).observed_s is None
    decision = controller.tick(2.0, ONE_WIDE, 0, [1.5], [(1.6, 0.1), (1.9, 0.3)])
    assert decision.observed_s == pytest.approx(0.2)


def test_an_unstable_prediction_shows_as_null_in_the_record() -> None:
    decision = serf(window_s=1.0).tick(1.0, ONE_NARROW, 0, arrivals(30.0, 0.0, 1.0))
    assert decision.to_dict()["predicted_current_ms"] is None


def test_fixed_switches_at_once_and_a_new_policy_starts_without_a_streak() -> None:
    controller = serf(window_s=1.0)
    controller.tick(1.0, ONE_WIDE, 0, arrivals(15.0, 0.0, 1.0))  # period 1 of 2 toward (2, 1)
    controller.set_policy(FixedPolicy(ONE_NARROW), 0.1, window_s=1.0, now=1.0)
    decision = controller.tick(2.0, ONE_WIDE, 0)
    assert decision.switched and decision.chosen == ONE_NARROW and decision.policy == "fixed"
    controller.set_policy(SerfPolicy(PROFILE, max_c=2), 0.1, window_s=1.0, now=2.0)
    assert not controller.tick(3.0, ONE_WIDE, 0, arrivals(15.0, 2.0, 3.0)).switched


def test_a_new_window_width_starts_the_estimate_afresh() -> None:
    controller = serf(window_s=10.0)
    controller.tick(10.0, ONE_WIDE, 0, arrivals(5.0, 0.0, 10.0))
    controller.set_policy(SerfPolicy(PROFILE, max_c=2), 0.1, window_s=10.0, now=10.0)
    assert controller.monitor.rate(10.0) == pytest.approx(5.0)  # same width: kept
    controller.set_policy(SerfPolicy(PROFILE, max_c=2), 0.1, window_s=2.0, now=10.0)
    decision = controller.tick(11.0, ONE_WIDE, 0, arrivals(3.0, 10.0, 11.0))
    assert decision.arrival_rate == pytest.approx(3.0)  # one second old, three arrivals


@settings(max_examples=60, deadline=None)
@given(times=st.lists(st.floats(0.0, 100.0), max_size=300), now=st.floats(0.0, 120.0),
       window=st.floats(0.5, 50.0))
def test_the_sliced_window_counts_within_one_slice_of_exact(
        times: list[float], now: float, window: float) -> None:
    times.sort()
    monitor = ArrivalMonitor(window, 0.0)
    monitor.record(times)
    width = min(window, now)
    if width <= 0:
        return
    slack = window / 200 + 1e-9  # an arrival within a slice of either edge may go either way
    low = sum(1 for t in times if now - window + slack < t <= now - slack)
    high = sum(1 for t in times if now - window - slack < t <= now + slack)
    assert low / width - 1e-9 <= monitor.rate(now) <= high / width + 1e-9


def test_the_queue_length_policy_drives_c_through_the_same_controller() -> None:
    policy = QueueLengthPolicy(QueueLengthConfig(max_replicas=2, upscale_delay_s=0,
                                                 downscale_delay_s=0, look_back_period_s=1),
                               intra=1)
    controller = Controller(policy, window_s=5.0, gain_threshold=0.1, start_s=0.0)
    current, chosen = ONE_NARROW, []
    for t, ongoing in enumerate([0, 6, 6, 6, 0, 0]):
        decision = controller.tick(float(t), current, ongoing)
        current = decision.chosen
        chosen.append(current.c)
    assert chosen == [1, 1, 2, 2, 2, 1]  # a step is seen one observation late, as in Ray
    assert controller.switches == 2


# ---------------------------------------------------------------- properties


@settings(max_examples=60, deadline=None)
@given(rate=st.floats(0.0, 25.0), start=st.sampled_from([ONE_WIDE, TWO_NARROW, ONE_NARROW]),
       threshold=st.floats(0.0, 0.5), window=st.floats(1.0, 10.0))
def test_constant_load_never_switches_more_than_once(rate: float, start: Config,
                                                     threshold: float, window: float) -> None:
    decisions = run(serf(threshold, window), [rate] * 30, start)
    assert sum(d.switched for d in decisions) <= 1
    # Once the window is full, everything after the first switch stays put.
    assert all(d.chosen == decisions[-1].chosen for d in decisions[math.ceil(window) + 3:])


proposals = st.lists(st.tuples(st.sampled_from([ONE_WIDE, TWO_NARROW, ONE_NARROW]),
                               st.floats(0.0, 1.0)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(steps=proposals, threshold=st.floats(0.0, 0.9))
def test_hysteresis_never_switches_on_a_single_period(
        steps: list[tuple[Config, float]], threshold: float) -> None:
    gate, current = Hysteresis(threshold), ONE_WIDE
    history: list[tuple[Config, Config, float]] = []
    for target, gain in steps:
        switched, _ = gate.admit(current, want(target, gain))
        history.append((current, target, gain))
        if switched:
            # This period and the one before wanted the same move, each above the threshold.
            assert len(history) >= 2
            (c0, t0, g0), (c1, t1, g1) = history[-2], history[-1]
            assert (c0, t0) == (c1, t1) and min(g0, g1) > threshold and t1 != c1
            current, history = target, []


@settings(max_examples=60, deadline=None)
@given(rates=st.lists(st.floats(0.0, 25.0), min_size=1, max_size=30))
def test_serf_never_switches_twice_in_a_row(rates: list[float]) -> None:
    decisions = run(serf(window_s=1.0), rates, ONE_WIDE)
    flags = [d.switched for d in decisions]
    assert not any(a and b for a, b in zip(flags, flags[1:], strict=False))
