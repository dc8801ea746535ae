"""SERF's profiler, the pure parts: the plan, μ from samples, the document, the exhaustive
baseline's bookkeeping, and the deployment the profiler serves."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parityserve.bench.profiler import profile_config
from parityserve.config import parse_config
from parityserve.core.profiling import (
    SCHEMA,
    Cell,
    Cost,
    Measurement,
    ProfileDocument,
    best_with_overhead,
    compare_costs,
    exhaustive_plan,
    load_levels,
    measure,
    measured_best,
    profile_plan,
    profiles_from,
    thread_budget,
)
from parityserve.core.queueing import Config, configurations, reference_table
from parityserve.errors import ConfigError

C = Config


# ---- the plan ------------------------------------------------------------------------------
def test_the_faithful_plan_on_two_cores() -> None:
    assert profile_plan(2) == (C(1, 1), C(2, 1), C(1, 2))


def test_the_oversubscribed_plan_reaches_c_4_on_two_cores() -> None:
    assert profile_plan(2, oversubscribe=True) == (
        C(1, 1), C(2, 1), C(3, 1), C(4, 1), C(1, 2), C(2, 2), C(1, 3), C(1, 4))


def test_intras_and_max_c_narrow_the_plan() -> None:
    assert profile_plan(4, intras=[2, 1], max_c=2) == (C(1, 1), C(2, 1), C(1, 2), C(2, 2))


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"cores": 0}, "cores"), ({"cores": 2, "intras": [3]}, "more than the 2 threads"),
    ({"cores": 2, "intras": []}, "empty"), ({"cores": 2, "intras": [0]}, "intra"),
    ({"cores": 2, "max_c": 0}, "max_c"), ({"cores": True}, "cores")])
def test_a_plan_that_cannot_run_is_refused(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        profile_plan(**kwargs)


@given(st.integers(1, 16), st.booleans(), st.one_of(st.none(), st.integers(1, 8)))
def test_every_tuple_fits_and_each_intra_has_mu_1_to_n(cores, over, max_c) -> None:
    plan = profile_plan(cores, oversubscribe=over, max_c=max_c)
    budget = thread_budget(cores, oversubscribe=over)
    assert all(t.c * t.intra <= budget and (max_c is None or t.c <= max_c) for t in plan)
    for intra in {t.intra for t in plan}:
        assert sorted(t.c for t in plan if t.intra == intra) == list(
            range(1, min(budget // intra, max_c or budget) + 1))
    # and the queueing model can predict every configuration the plan makes possible
    fake = profiles_from(Measurement(t.c, t.intra, 10, 0.01, 100.0, 0.01, 0.01, 0)
                         for t in plan)
    assert set(configurations(fake, cores=cores, oversubscribe=over)) == set(plan)


# ---- mu from samples -----------------------------------------------------------------------
def test_warm_up_is_discarded_and_mu_is_one_over_the_mean() -> None:
    samples = [5.0, 5.0] + [0.01] * 5 + [0.03] * 5
    m = measure(C(2, 1), samples, [True] * 12, warmup=2)
    assert m.n == 10 and m.mean_s == pytest.approx(0.02) and m.mu == pytest.approx(50.0)
    assert m.p50_s == 0.03 and m.p99_s == 0.03 and m.config == C(2, 1)
    assert m.samples_s == tuple(samples[2:])  # kept for the simulator's tails


def test_the_servers_slot_time_is_the_service_and_the_rest_is_overhead() -> None:
    samples = [5.0, 5.0] + [0.010, 0.012, 0.014] * 4  # timed client round trips: 12 ms
    m = measure(C(1, 1), samples, [True] * 14, warmup=2, slot_mean_s=0.009)
    assert m.mean_s == 0.009 and m.mu == pytest.approx(1 / 0.009)
    assert m.overhead_s == pytest.approx(0.003)
    assert m.samples_s == pytest.approx([s - 0.003 for s in samples[2:]])  # spread kept
    with pytest.raises(ValueError, match="slot_mean_s"):
        measure(C(1, 1), samples, [True] * 14, warmup=2, slot_mean_s=0.0)


def test_a_slot_longer_than_the_round_trip_leaves_no_negative_overhead() -> None:
    m = measure(C(1, 1), [0.010] * 10, [True] * 10, warmup=0, slot_mean_s=0.011)
    assert m.overhead_s == 0.0 and m.samples_s == (0.010,) * 10


def test_the_best_configuration_counts_each_ones_overhead() -> None:
    profiles = {1: [100.0, 95.0]}
    (row,) = reference_table([20.0], profiles, cores=2)
    assert row.best.config == C(2, 1)  # by the queue alone, two slots wait less
    config, latency = best_with_overhead(row, {C(1, 1): 0.0, C(2, 1): 0.005})
    w11 = next(ch.prediction.latency for ch in row.candidates if ch.config == C(1, 1))
    assert config == C(1, 1) and latency == pytest.approx(w11)


def test_a_failed_warm_up_request_does_not_matter() -> None:
    assert measure(C(1, 1), [1.0] + [0.01] * 10, [False] + [True] * 10, warmup=1).n == 10


@pytest.mark.parametrize(("samples", "ok", "match"), [
    ([0.01] * 10, [True] * 9 + [False], "1 of 10 timed requests failed"),
    ([0.01] * 9, [True] * 9, "at least 10"),
    ([0.01] * 9 + [0.0], [True] * 10, "finite number > 0"),
    ([0.01] * 9 + [math.inf], [True] * 10, "finite number > 0"),
    ([0.01] * 10, [True] * 9, "outcomes"),
])
def test_samples_that_give_no_honest_rate_are_refused(samples, ok, match) -> None:
    with pytest.raises(ValueError, match=match):
        measure(C(1, 1), samples, ok, warmup=0)


def _m(c: int, intra: int, mu: float) -> Measurement:
    return Measurement(c, intra, 10, 1.0 / mu, mu, 1.0 / mu, 1.0 / mu, 2)


def test_profiles_group_by_intra_in_order_of_i() -> None:
    ms = [_m(2, 1, 80.0), _m(1, 2, 150.0), _m(1, 1, 100.0)]
    assert profiles_from(ms) == {1: [100.0, 80.0], 2: [150.0]}


@pytest.mark.parametrize(("ms", "match"), [
    ([_m(1, 1, 100.0), _m(3, 1, 50.0)], "no gap"),
    ([_m(1, 1, 100.0), _m(1, 1, 90.0)], "twice"),
])
def test_profiles_with_a_gap_or_a_repeat_are_refused(ms, match) -> None:
    with pytest.raises(ValueError, match=match):
        profiles_from(ms)


def test_load_levels_span_the_best_sustainable_throughput() -> None:
    # c·μ_c: (1,1) 100, (2,1) 160, (1,2) 150 -> λ_max = 160
    levels = load_levels({1: [100.0, 80.0], 2: [150.0]}, cores=2, count=10)
    assert levels == pytest.approx([k * 160 / 11 for k in range(1, 11)])


# ---- the document --------------------------------------------------------------------------
def _doc() -> ProfileDocument:
    return ProfileDocument("mlp", 2, False, (_m(1, 1, 100.0), _m(2, 1, 80.0), _m(1, 2, 150.0)),
                           1.5)


def test_the_document_round_trips_through_json() -> None:
    text = json.dumps(_doc().to_dict())
    back = ProfileDocument.from_dict(json.loads(text))
    assert back == _doc() and back.profiles == {1: [100.0, 80.0], 2: [150.0]}
    assert json.loads(text)["schema"] == SCHEMA


def vars_of(m: Measurement) -> dict:
    return {k: getattr(m, k) for k in m.__slots__}


@pytest.mark.parametrize(("change", "match"), [
    ({"schema": "other/1"}, "not a parityserve.profile/1"),
    ({"profiles": {"1": [1.0]}}, "disagrees"),
    ({"cores": 0}, "cores"),
    ({"measurements": [{"c": 1}]}, "malformed"),
    ({"measurements": [{**vars_of(_m(1, 1, 100.0)), "mu": 5.0}]}, "1 / mean_s"),
    ({"measurements": [{**vars_of(_m(1, 1, 100.0)), "p99_s": -1}]}, "p99_s"),
    ({"measurements": [{**vars_of(_m(1, 1, 100.0)), "c": 0}]}, "c must be"),
    ({"measurements": [{**vars_of(_m(1, 1, 100.0)), "samples_s": [0.01, -1]}]}, "samples_s"),
    ({"measurements": [{**vars_of(_m(1, 1, 100.0)), "overhead_s": -0.1}]}, "overhead_s"),
    ({"service_time": "wall"}, "service_time"),
])
def test_a_bad_document_is_refused(change, match) -> None:
    doc = {**_doc().to_dict(), **change}
    if "measurements" in change:
        doc.pop("profiles")
    with pytest.raises(ValueError, match=match):
        ProfileDocument.from_dict(doc)


# ---- the exhaustive baseline ---------------------------------------------------------------
def test_the_exhaustive_plan_is_every_configuration_at_every_level() -> None:
    plan = exhaustive_plan([C(1, 1), C(2, 1)], [10.0, 20.0])
    assert plan == ((C(1, 1), 10.0), (C(1, 1), 20.0), (C(2, 1), 10.0), (C(2, 1), 20.0))


def _cell(config: Config, rate: float, mean: float, errors: int = 0) -> Cell:
    return Cell(config, rate, 100, mean, mean, mean, mean, errors)


def test_measured_best_skips_runs_with_errors_and_breaks_ties_by_cores() -> None:
    cells = [_cell(C(1, 1), 10.0, 0.020), _cell(C(1, 2), 10.0, 0.010, errors=3),
             _cell(C(2, 1), 10.0, 0.015), _cell(C(1, 2), 20.0, 0.030),
             _cell(C(2, 1), 20.0, 0.030), _cell(C(1, 1), 20.0, math.nan)]
    assert measured_best(cells) == {10.0: C(2, 1), 20.0: C(1, 2)}


def test_cost_ratios() -> None:
    ratios = compare_costs(Cost(2.0, 3, 100), Cost(60.0, 30, 6000))
    assert ratios == {"time_ratio": 30.0, "runs_ratio": 10.0, "requests_ratio": 60.0}
    assert compare_costs(Cost(0.0, 0, 0), Cost(1.0, 1, 1))["time_ratio"] == math.inf


# ---- the deployment the profiler serves ----------------------------------------------------
RAW = {"server": {"http_port": 8000, "cache_bytes": 1 << 20, "admin_host": "127.0.0.1",
                  "admin_port": 9000},
       "models": [{"name": "a", "source": "zoo:noop"},
                  {"name": "b", "source": "zoo:echo", "replicas": 3,
                   "batching": {"max_batch_size": 8},
                   "redundancy": {"mode": "replication", "d": 2},
                   "faults": {"all": {"delay_ms": 5}}}],
       "applications": [{"name": "app", "models": ["a", "b"]}]}


def test_the_profiled_deployment_serves_only_the_model_plainly() -> None:
    mapping = profile_config(RAW, "b", replicas=4, oversubscribe=True)
    config = parse_config(mapping)
    (dep,) = config.models
    assert dep.name == "b" and dep.replicas == 4 and dep.parallelism == 1
    assert dep.batching.max_batch_size == 1 and dep.redundancy.mode == "none"
    assert not dep.faults and dep.oversubscribe and dep.threads_per_replica == 1
    assert config.server.cache_bytes == 0 and config.server.http_port == 0
    assert config.server.admin_port is None and not config.applications
    assert profile_config(RAW, "b", replicas=2, oversubscribe=False)["models"][0][
        "replicas"] == 3  # never fewer than the file asks for


def test_profiling_a_model_the_file_does_not_have_says_which_it_has() -> None:
    with pytest.raises(ConfigError, match=r"'nope' is not in the deployment file.*'a', 'b'"):
        profile_config(RAW, "nope", replicas=1, oversubscribe=False)
