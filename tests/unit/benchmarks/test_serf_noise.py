"""The rules ``benchmarks.serf_noise`` reports by: which cases, in what order, the oracle
error over pairs of runs, the summaries against issue 18's target, the resume key and the
cold part's plan and curves."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from benchmarks.serf_analysis import Case, build_cases
from benchmarks.serf_noise_analysis import (
    CONFIGS,
    FULL_LEVELS,
    TARGETS,
    case_summary,
    cold_plan,
    drift,
    estimate_seconds,
    fingerprint,
    gap_summary,
    measurement_order,
    meets,
    model_summary,
    oracle_errors,
    parse_configs,
    poisson_seed,
    run_key,
    select_cases,
    spread,
)
from parityserve.core.queueing import Config

# intra -> [mu_1, ..., mu_4], shaped like ResNet-20's profile on this machine
PROFILES = {1: [460.0, 340.0, 245.0, 185.0], 2: [220.0, 175.0]}


def _case(c: int, intra: int, level: int, rate: float = 100.0) -> Case:
    return Case(Config(c, intra), level, rate, 0.5, {"md-interf": 0.004})


def _row(measured_ms: float, rep: int, latencies_us: list[int] | None = None,
         predicted_ms: float = 4.0) -> dict[str, object]:
    return {"config": "c=1,intra=1", "c": 1, "intra": 1, "level": 1, "rate": 100.0,
            "rho": 0.5, "measured_ms": measured_ms, "predicted_ms": predicted_ms, "n": 3,
            "errors": 0, "rep": rep, "latencies_us": latencies_us or []}


def test_oracle_error_covers_every_ordered_pair_of_distinct_runs() -> None:
    errors = oracle_errors([10.0, 11.0, 12.0])
    assert len(errors) == 6
    expected = [1 / 11, 2 / 12, 1 / 10, 1 / 12, 2 / 10, 1 / 11]
    assert sorted(errors) == pytest.approx(sorted(expected))
    assert oracle_errors([5.0, 5.0]) == [0.0, 0.0]
    assert oracle_errors([5.0]) == []  # one run predicts nothing


def test_oracle_error_is_relative_to_the_run_predicted() -> None:
    # run 2 "predicting" run 1: |20 - 10| / 10 = 100%; run 1 predicting run 2: 50%
    assert sorted(oracle_errors([10.0, 20.0])) == pytest.approx([0.5, 1.0])


def test_spread() -> None:
    assert spread([9.0, 10.0, 11.0]) == pytest.approx(0.2)
    assert spread([4.0, 4.0]) == 0.0
    assert math.isnan(spread([math.nan]))


def test_case_summary_pools_runs_and_errs_eq13_against_each() -> None:
    reps = [_row(5.0, 0, [4000, 5000, 6000]), _row(4.0, 1, [3000, 4000, 5000])]
    summary = case_summary(reps)
    assert summary["means_ms"] == [5.0, 4.0]
    assert summary["mean_ms"] == pytest.approx(4.5)
    assert summary["spread"] == pytest.approx(1.0 / 4.5)
    assert sorted(summary["oracle_errors"]) == pytest.approx([0.2, 0.25])
    assert summary["oracle_max"] == pytest.approx(0.25)
    assert summary["eq13_errors"] == pytest.approx([0.2, 0.0])  # 4 ms against 5 and 4
    assert summary["n_pooled"] == 6
    assert summary["p50_ms"] == pytest.approx(5.0)  # "higher" method over 6 samples
    assert summary["n_per_rep"] == [3, 3] and summary["errors"] == 0


def test_model_summary_sets_the_oracle_beside_eq13_and_the_target() -> None:
    cases = [case_summary([_row(m, 0), _row(m * 1.01, 1)]) for m in (5.0, 10.0, 20.0)]
    summary = model_summary(cases)
    assert summary["oracle"]["n"] == 6 and summary["eq13"]["n"] == 6
    assert summary["oracle"]["mean"] == pytest.approx(np.mean([0.01, 0.01 / 1.01]))
    assert summary["oracle_meets"] == {"mean": True, "p90": True, "p95": True}
    assert summary["eq13_meets"] == {"mean": False, "p90": False, "p95": False}
    assert summary["targets"] == TARGETS == {"mean": 0.03, "p90": 0.08, "p95": 0.10}


def test_meets_is_per_statistic_and_says_when_there_is_nothing() -> None:
    assert meets({"mean": 0.02, "p90": 0.09, "p95": 0.10}) == {
        "mean": True, "p90": False, "p95": True}
    assert meets({"mean": math.nan, "p90": math.nan, "p95": math.nan}) == {
        "mean": None, "p90": None, "p95": None}


def test_select_cases_keeps_the_wanted_stable_ones_and_names_the_rest() -> None:
    cases, _ = build_cases(PROFILES, cores=2, oversubscribe=True)
    chosen, missing = select_cases(cases, CONFIGS, FULL_LEVELS)
    assert {c.config for c in chosen} <= set(CONFIGS)
    assert {c.level for c in chosen} <= set(FULL_LEVELS)
    assert all(c.rho <= 0.95 for c in chosen)
    assert [(c.level, c.config) for c in chosen] == sorted((c.level, c.config) for c in chosen)
    # every wanted pair is either chosen or reported missing, never both
    pairs = {(c.config, c.level) for c in chosen}
    gone = {(Config(m["c"], m["intra"]), m["level"]) for m in missing}
    assert not pairs & gone
    assert pairs | gone == {(c, k) for c in CONFIGS for k in FULL_LEVELS}
    # λ_max = 4·185 = 740/s, so λ_9 = 605/s: past c = 1's 460/s, within c = 2's 680/s
    assert (Config(1, 1), 9) in gone and (Config(2, 1), 9) in pairs


def test_select_cases_ignores_other_configurations_and_levels() -> None:
    cases = [_case(1, 1, 1), _case(4, 1, 1), _case(1, 1, 2), _case(2, 1, 3)]
    chosen, missing = select_cases(cases, [Config(1, 1), Config(2, 1)], [1, 3])
    assert [c.key for c in chosen] == ["c1-t1-k1", "c2-t1-k3"]
    assert [(m["c"], m["level"]) for m in missing] == [(1, 3), (2, 1)]


def test_parse_configs() -> None:
    assert parse_configs("1/1, 2/1,1/2") == (Config(1, 1), Config(2, 1), Config(1, 2))
    for bad in ("1x1", "1/", "0/1", ""):
        with pytest.raises(ValueError):
            parse_configs(bad)


def test_measurement_order_interleaves_repetitions_and_shuffles_within() -> None:
    cases = [_case(c, 1, k) for c in (1, 2, 3) for k in (1, 3, 5)]
    order = measurement_order(cases, 3, seed=0)
    assert [rep for rep, _ in order] == [0] * 9 + [1] * 9 + [2] * 9  # repetition outer
    for rep in range(3):
        assert Counter(c.key for r, c in order if r == rep) == Counter(c.key for c in cases)
    orders = [[c.key for r, c in order if r == rep] for rep in range(3)]
    assert orders[0] != orders[1] != orders[2]  # another order each repetition
    assert any(o != [c.key for c in cases] for o in orders)  # shuffled
    assert measurement_order(cases, 3, seed=0) == order  # seeded
    assert measurement_order(cases, 3, seed=1) != order
    # the first repetitions' order does not depend on how many there are
    assert measurement_order(cases, 2, seed=0) == order[:18]


def test_each_repetition_gets_its_own_poisson_seed() -> None:
    case = _case(2, 1, 3)
    seeds = {tuple(poisson_seed(0, case, rep)) for rep in range(3)}
    assert len(seeds) == 3
    assert poisson_seed(0, case, 0) != poisson_seed(0, _case(2, 1, 5), 0)


def test_resume_key_and_fingerprint() -> None:
    assert run_key("c2-t1-k3", 0) == "c2-t1-k3-r0"
    assert run_key("c2-t1-k3", 1) != run_key("c2-t1-k3", 0)
    settings = {"queries": 2000, "levels": 10, "seed": 0, "max_c": 4, "intra": "1,2",
                "profile_requests": 50, "oversubscribe": True, "repeats": 3,
                "models": "resnet20,resnet56", "parts": "repeatability,cold", "quick": False,
                "configs": "1/1,2/1", "pick_levels": "1,3", "gaps_ms": "0,1",
                "cold_calls": 60, "cold_per_visit": 4}
    key = fingerprint("resnet20", settings)
    assert key == {"model": "resnet20", "queries": 2000, "levels": 10, "seed": 0, "max_c": 4,
                   "intra": "1,2", "profile_requests": 50, "oversubscribe": True}
    # more repetitions, another subset or other cold settings reuse the saved runs ...
    assert fingerprint("resnet20", {**settings, "repeats": 5, "pick_levels": "1",
                                    "cold_calls": 10}) == key
    # ... while the run's own settings and the model do not
    assert fingerprint("resnet20", {**settings, "queries": 400}) != key
    assert fingerprint("resnet20", {**settings, "seed": 1}) != key
    assert fingerprint("resnet56", settings) != key


def test_estimate_seconds() -> None:
    cases = [_case(1, 1, 1, rate=100.0), _case(2, 1, 3, rate=400.0)]
    assert estimate_seconds(cases, 2000, 3, 2.0) == pytest.approx(3 * (20 + 5 + 2 * 2))


def test_cold_plan_visits_every_gap_each_round_in_shuffled_order() -> None:
    gaps = [0.0, 0.5, 1.0, 10.0]
    plan = cold_plan(gaps, 10, 4, np.random.default_rng(0))
    assert Counter(plan) == {g: 10 for g in gaps}
    rounds = [plan[:16], plan[16:32], plan[32:]]  # 4 + 4 + 2 calls per visit
    assert [len(r) for r in rounds] == [16, 16, 8]
    for r, per_visit in zip(rounds, (4, 4, 2), strict=True):
        visits = [r[i:i + per_visit] for i in range(0, len(r), per_visit)]
        assert all(len(set(v)) == 1 for v in visits)
        assert sorted(v[0] for v in visits) == gaps
    orders = [tuple(r[::4]) for r in rounds[:2]] + [tuple(rounds[2][::2])]
    assert any(o != tuple(gaps) for o in orders)  # shuffled
    with pytest.raises(ValueError):
        cold_plan(gaps, 0, 4, np.random.default_rng(0))


def test_gap_summary_ratios_are_to_back_to_back() -> None:
    plan = [10.0, 0.0, 10.0, 0.0, 0.0, 10.0]
    times = [0.004, 0.002, 0.005, 0.002, 0.003, 0.006]
    slept = [0.0101, 0.0, 0.0101, 0.0, 0.0, 0.0101]
    rows = gap_summary(plan, times, slept)
    assert [r["gap_ms"] for r in rows] == [0.0, 10.0]
    assert rows[0]["median_ms"] == pytest.approx(2.0)
    assert rows[1]["median_ms"] == pytest.approx(5.0)
    assert rows[1]["median_ratio"] == pytest.approx(2.5)
    assert rows[1]["mean_ratio"] == pytest.approx(5.0 / (7.0 / 3))
    assert rows[0]["median_ratio"] == pytest.approx(1.0)
    assert rows[1]["slept_ms"] == pytest.approx(10.1)
    assert rows[0]["n"] == 3


def test_drift_is_per_visit_of_the_gap() -> None:
    # visits of gap 0: [2, 2] ms, then [3, 3, 4] ms, then [2.5] ms at the very end
    plan = [0.0, 0.0, 5.0, 0.0, 0.0, 0.0, 5.0, 5.0, 0.0]
    times = [0.002, 0.002, 0.009, 0.003, 0.003, 0.004, 0.009, 0.009, 0.0025]
    moved = drift(plan, times)
    assert moved["visits"] == 3
    assert moved["visit_medians_ms"] == pytest.approx([2.0, 3.0, 2.5])
    assert moved["max_over_min"] == pytest.approx(1.5)
    assert drift(plan, times, gap=5.0)["visit_medians_ms"] == pytest.approx([9.0, 9.0])
    assert drift([5.0], [0.009])["visits"] == 0


def test_model_summary_splits_by_utilisation() -> None:
    def case(rho: float, means: tuple[float, float]) -> dict[str, object]:
        rows = [{**_row(m, r), "rho": rho} for r, m in enumerate(means)]
        return case_summary(rows)

    cases = [case(0.2, (5.0, 5.0)), case(0.6, (8.0, 10.0)), case(0.9, (40.0, 80.0))]
    bands = model_summary(cases)["by_rho"]
    assert [(b["lo"], b["hi"], b["cases"]) for b in bands] == [
        (0.0, 0.5, 1), (0.5, 0.8, 1), (0.8, 1.0, 1)]
    assert bands[0]["oracle"]["mean"] == 0.0
    assert bands[1]["oracle"]["mean"] == pytest.approx((0.2 + 0.25) / 2)
    assert bands[2]["oracle"]["mean"] == pytest.approx((0.5 + 1.0) / 2)
    assert bands[2]["eq13"]["n"] == 2


def test_idle_aware_errors_sit_beside_eq13_and_unbounded_predictions_are_counted() -> None:
    def with_idle(measured: float, rep: int, idle_ms: float) -> dict[str, object]:
        return {**_row(measured, rep), "md-interf-idle_ms": idle_ms}

    fitted = case_summary([with_idle(5.0, 0, 4.5), with_idle(4.0, 1, 4.5)])
    assert fitted["idle_errors"] == pytest.approx([0.1, 0.125])
    unbounded = case_summary([with_idle(5.0, 0, math.inf), with_idle(4.0, 1, math.inf)])
    summary = model_summary([fitted, unbounded])
    assert summary["idle"]["n"] == 2 and summary["idle_unstable"] == 2
    assert summary["idle"]["mean"] == pytest.approx(0.1125)
    assert summary["by_rho"][0]["idle"]["n"] == 2  # both are at ρ = 0.5
    assert "idle" not in model_summary([case_summary([_row(5.0, 0), _row(4.0, 1)])])
