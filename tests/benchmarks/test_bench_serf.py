"""The rules ``benchmarks.serf`` reports by: levels, skipped cases, errors and verdicts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.serf import _fingerprint, _route_suffix, build_parser
from benchmarks.serf_analysis import (
    ABLATIONS,
    IDLE_AWARE,
    argmin_verdicts,
    batch_means_halfwidth,
    build_cases,
    capacity,
    dynamic_summary,
    dynamic_verdicts,
    error_summary,
    fixed_policies,
    idle_from_profile,
    lambda_max,
    phase_rates,
    phased_schedule,
    predict_idle,
    relative_error,
)
from parityserve.core.queueing import Config, configurations

# intra -> [mu_1, ..., mu_4]: one thread loses speed past two at once (2 cores), two
# threads are faster alone and lose more when shared.
PROFILES = {1: [400.0, 380.0, 250.0, 190.0], 2: [500.0, 260.0]}


def test_levels_are_k_over_eleven_of_lambda_max() -> None:
    # one profile whose fastest configuration drains at 1,100/s (c = 2 at 550/s each)
    cases, skipped = build_cases({1: [600.0, 550.0]}, cores=2, oversubscribe=False)
    rates = sorted({c.rate for c in cases} | {s["rate"] for s in skipped})
    assert rates == pytest.approx([100.0 * k for k in range(1, 11)])
    four, _ = build_cases({1: [600.0, 550.0]}, cores=2, oversubscribe=False, levels=4)
    assert sorted({c.rate for c in four}) == pytest.approx([220.0, 440.0, 660.0, 880.0])


def test_lambda_max_is_the_fastest_draining_configuration() -> None:
    configs = configurations(PROFILES, cores=2, oversubscribe=True)
    assert capacity(PROFILES, Config(2, 1)) == pytest.approx(760.0)
    assert capacity(PROFILES, Config(4, 1)) == pytest.approx(760.0)
    assert capacity(PROFILES, Config(3, 1)) == pytest.approx(750.0)
    assert lambda_max(PROFILES, configs) == pytest.approx(760.0)
    faithful = configurations(PROFILES, cores=2, oversubscribe=False)
    assert set(faithful) == {Config(1, 1), Config(2, 1), Config(1, 2)}


def test_cases_skip_what_would_be_unstable_and_say_so() -> None:
    cases, skipped = build_cases(PROFILES, cores=2, oversubscribe=False)
    # c=1, intra=1 drains at 400/s: levels above 0.95*400 = 380/s are skipped for it
    single = [c for c in cases if c.config == Config(1, 1)]
    assert max(c.rate for c in single) <= 0.95 * 400.0
    assert all(s["rho"] > 0.95 for s in skipped)
    assert len(cases) + len(skipped) == 3 * 10
    for case in cases:
        assert set(case.predicted_s) == set(ABLATIONS)
        assert all(v > 0 and math.isfinite(v) for v in case.predicted_s.values())
    keys = [c.key for c in cases]
    assert len(set(keys)) == len(keys)


def test_relative_error() -> None:
    assert relative_error(11.0, 10.0) == pytest.approx(0.1)
    assert relative_error(9.0, 10.0) == pytest.approx(0.1)
    assert math.isinf(relative_error(math.inf, 10.0))
    assert math.isnan(relative_error(1.0, math.nan))
    assert math.isnan(relative_error(1.0, 0.0))


def test_error_summary_ignores_what_cannot_be_compared() -> None:
    summary = error_summary([0.01, 0.02, 0.03, math.nan, math.inf])
    assert summary["n"] == 3
    assert summary["mean"] == pytest.approx(0.02)
    assert error_summary([])["n"] == 0


def test_batch_means_halfwidth_shrinks_with_samples_and_refuses_too_few() -> None:
    rng = np.random.default_rng(0)
    small = batch_means_halfwidth(rng.exponential(0.01, 400))
    large = batch_means_halfwidth(rng.exponential(0.01, 40_000))
    assert 0 < large < small
    assert math.isinf(batch_means_halfwidth([0.01] * 10))


def _row(level: int, config: str, predicted: float, measured: float, half: float = 0.1
         ) -> dict[str, object]:
    return {"level": level, "rate": 100.0 * level, "config": config, "predicted_ms": predicted,
            "measured_ms": measured, "halfwidth_ms": half}


@pytest.mark.parametrize(("rows", "found"), [
    # the same configuration wins in prediction and measurement
    ([_row(1, "a", 1.0, 2.0), _row(1, "b", 2.0, 3.0)], True),
    # a different one, but within both runs' spread
    ([_row(1, "a", 1.0, 2.05), _row(1, "b", 2.0, 2.0)], True),
    # a different one, clearly slower when measured
    ([_row(1, "a", 1.0, 3.0), _row(1, "b", 2.0, 2.0)], False),
])
def test_argmin_verdicts(rows: list[dict[str, object]], found: bool) -> None:
    (verdict,) = argmin_verdicts(rows)
    assert verdict["found"] is found
    assert verdict["predicted_best"] == "a"
    assert verdict["candidates"] == 2


def test_argmin_verdicts_per_level_and_without_unmeasured_cases() -> None:
    rows = [_row(1, "a", 1.0, 2.0), _row(2, "a", 1.0, math.nan), _row(2, "b", 2.0, 3.0)]
    verdicts = argmin_verdicts(rows)
    assert [v["level"] for v in verdicts] == [1, 2]
    assert verdicts[1]["predicted_best"] == "b"  # "a" at level 2 was never measured


def test_phase_rates() -> None:
    assert phase_rates(1000.0, [0.6, 0.15, 0.6]) == pytest.approx([600.0, 150.0, 600.0])
    with pytest.raises(ValueError):
        phase_rates(1000.0, [1.2])


def test_phased_schedule_keeps_each_phase_in_its_window_at_its_rate() -> None:
    times, phase = phased_schedule([600.0, 150.0, 600.0], 20.0, np.random.default_rng(1))
    assert np.all(np.diff(times) >= 0)
    for i, rate in enumerate([600.0, 150.0, 600.0]):
        inside = times[phase == i]
        assert np.all((inside >= 20.0 * i) & (inside < 20.0 * (i + 1)))
        assert inside.size == pytest.approx(rate * 20.0, rel=0.1)
    with pytest.raises(ValueError):
        phased_schedule([0.0], 1.0, np.random.default_rng(0))


def test_fixed_policies_are_three_distinct_configurations() -> None:
    lam = lambda_max(PROFILES, configurations(PROFILES, cores=2, oversubscribe=True))
    rates = phase_rates(lam, [0.6, 0.15, 0.6])
    chosen = fixed_policies(PROFILES, 2, rates, oversubscribe=True)
    # alone, two threads are fastest (500/s); at moderate load one thread each wins
    assert chosen["fixed-low"] == Config(1, 2)
    assert chosen["fixed-moderate"].intra == 1 and chosen["fixed-moderate"].c >= 2
    assert len(set(chosen.values())) == len(chosen) == 3


def test_fixed_policies_stay_three_when_one_configuration_is_best_for_both_phases() -> None:
    flat = {1: [400.0, 400.0, 400.0]}  # no interference: c = 3 is best at every load
    chosen = fixed_policies(flat, 4, [300.0, 150.0, 300.0], oversubscribe=False)
    assert set(chosen) == {"fixed-low-and-moderate", "fixed-other", "fixed-other-2"}
    assert len(set(chosen.values())) == 3


def _run(means: list[float], switches: int = 0) -> dict[str, object]:
    return {"switches": switches, "phases": [
        {"mean_ms": m, "p50_ms": m, "p99_ms": 3 * m, "p999_ms": 4 * m, "n": 100} for m in means]}


def test_dynamic_summary_and_verdicts() -> None:
    runs = {"serf": [_run([10.0, 2.0, 10.0], 2), _run([11.4, 2.0, 9.6], 4)],
            "fixed-low": [_run([30.0, 2.0, 30.0])] * 2,
            "fixed-moderate": [_run([10.0, 3.0, 10.0])] * 2}
    summary = dynamic_summary(runs)
    serf = next(r for r in summary if r["policy"] == "serf")
    assert serf["phase0_mean_ms"] == pytest.approx(10.7)
    assert serf["phase0_n"] == 200 and serf["switches"] == 3
    verdict = dynamic_verdicts(summary, phases=3)
    assert verdict["complete"] and verdict["beats_every_fixed_overall"]
    # phase 0: 10.7 ms against the best fixed 10 ms is 7% over: not within 5%
    assert [p["within"] for p in verdict["phases"]] == [False, True, True]
    assert verdict["met"] is False
    assert dynamic_verdicts(summary[1:], phases=3) == {"complete": False}


def test_overhead_outside_the_queue_is_added_to_every_prediction() -> None:
    plain, _ = build_cases(PROFILES, cores=2, oversubscribe=False)
    extra = {Config(1, 1): 0.002, Config(2, 1): 0.001}
    shifted, _ = build_cases(PROFILES, cores=2, oversubscribe=False, overhead=extra)
    for a, b in zip(plain, shifted, strict=True):
        for model in ABLATIONS:
            assert b.predicted_s[model] == pytest.approx(
                a.predicted_s[model] + extra.get(a.config, 0.0))


def test_phased_schedule_lead_in_comes_first_and_is_marked_unmeasured() -> None:
    times, phase = phased_schedule([400.0, 100.0], 10.0, np.random.default_rng(2), lead_in_s=5.0)
    lead = times[phase == -1]
    assert lead.size == pytest.approx(400.0 * 5.0, rel=0.1)
    assert np.all(lead < 5.0)
    assert np.all(times[phase == 0] >= 5.0) and np.all(times[phase == 1] >= 15.0)
    assert np.all(np.diff(times) >= 0)


# The ``idle`` section of a profile, as ``parityserve profile`` writes it, for one thread:
# back to back 2.5 ms (and 2.7 ms with two at once); +2 ms from 10 ms idle on.
IDLE_SECTION = {"1": {"busy_rates": [400.0, 370.0], "overhead_s": 0.0005,
                      "slot_curve": {"gaps_s": [0.0005, 0.01], "extra_s": [0.0002, 0.002]},
                      "overhead_curve": {"gaps_s": [0.003, 0.02], "extra_s": [0.0, 0.0006]}}}


def test_idle_aware_prediction_is_added_where_the_profile_measured_it() -> None:
    idle = idle_from_profile(IDLE_SECTION)
    assert idle is not None and idle_from_profile(None) is None and idle_from_profile({}) is None
    cases, _ = build_cases(PROFILES, cores=2, oversubscribe=False, idle=idle)
    with_idle = [c for c in cases if c.config.intra == 1]
    assert with_idle and all(IDLE_AWARE in c.predicted_s for c in with_idle)
    assert all(IDLE_AWARE not in c.predicted_s for c in cases if c.config.intra == 2)
    # at the lowest level nearly every query starts on an idle slot: close to the whole
    # penalty on top of back-to-back service, beyond Eq. 13's closed-loop prediction
    low = min((c for c in with_idle if c.config == Config(1, 1)), key=lambda c: c.rate)
    assert low.predicted_s[IDLE_AWARE] > low.predicted_s["md-interf"] + 0.001
    assert predict_idle(idle[1], 1.0, 1) == pytest.approx(0.0025 + 0.002 + 0.0005 + 0.0006,
                                                          rel=0.01)


def test_route_and_idle_settings_go_in_the_keys_not_the_fingerprint() -> None:
    """So the 2026-11-24 run (JSON route, no idle part) can still be reported with
    ``--accuracy-route clipper-json --idle-requests 0``, beside a new run in the same file."""
    new = build_parser().parse_args([])
    old = build_parser().parse_args(["--accuracy-route", "clipper-json", "--idle-requests", "0"])
    assert _fingerprint("resnet20", new) == _fingerprint("resnet20", old)
    assert (_route_suffix(new), _route_suffix(old)) == ("-v2-binary", "")


def test_case_row_keeps_the_generators_own_lateness_apart() -> None:
    from collections import Counter

    from benchmarks.serf import _case_row
    from benchmarks.serf_analysis import Case
    from parityserve.bench.loadgen import LoadResult

    n = 100  # the first 10 are dropped; query 50 failed and is not counted
    ok = np.ones(n, dtype=bool)
    ok[50] = False
    result = LoadResult(latencies_s=np.full(n, 0.010), ok=ok, results=[None] * n,
                        errors=Counter({"HTTP 503": 1}), offered_rate=10.0, duration_s=10.0,
                        send_lag_s=np.full(n, 0.002))
    case = Case(Config(1, 1), 1, 10.0, 0.1, {"md-interf": 0.008, IDLE_AWARE: 0.010})
    row = _case_row(case, result, 1.0)
    assert row["n"] == 89 and row["errors"] == 1
    assert row["measured_ms"] == pytest.approx(10.0)
    assert row["send_lag_mean_ms"] == pytest.approx(2.0)
    assert row["from_send_ms"] == pytest.approx(8.0)
    assert row["md-interf_error"] == pytest.approx(0.2)
    assert row["md-interf_error_from_send"] == pytest.approx(0.0)
    assert row[f"{IDLE_AWARE}_error_from_send"] == pytest.approx(0.25)
