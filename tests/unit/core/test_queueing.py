"""SERF's latency model and configuration search (core/queueing.py).

The oracles: textbook closed forms (Pollaczek-Khinchine, Erlang C by the Erlang-B recursion),
the digest's equations evaluated in exact rational arithmetic, the digest's own reference
implementation, hand-computed c = 2 cases, and a discrete-event simulation of the same
M/D_interf/c queue (tests/unit/core/queue_des.py).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parityserve.core import queueing
from parityserve.core.queueing import (
    Config,
    best_config,
    configurations,
    md_c,
    md_interf_c,
    mm_c,
    mm_interf_c,
    predict_latency,
    reference_table,
)
from tests.unit.core.queue_des import fifo_latencies, simulate_mean_latency

MODELS = ("md-interf", "mm-interf", "md", "mm")
rates = st.floats(min_value=1e-2, max_value=1e4)
loads = st.floats(min_value=1e-4, max_value=0.999)  # ρ
FAST = settings(max_examples=60, deadline=None)


def cosmetatos(c: int, rho: float) -> float:
    """½(1 + f(c)·g(ρ)), Eq. 8-10, written out again so the tests do not borrow it."""
    return 0.5 * (1 + (c - 1) * (math.sqrt(4 + 5 * c) - 2) / (16 * c) * (1 - rho) / rho)


def erlang_c_wait(lam: float, mu: float, c: int) -> float:
    """M/M/c W_q = C(c, a)/(cμ - λ), C from the Erlang-B recursion (independent of Eq. 2-7)."""
    a = lam / mu
    blocking = 1.0
    for k in range(1, c + 1):
        blocking = a * blocking / (k + a * blocking)
    rho = a / c
    return blocking / (1 - rho * (1 - blocking)) / (c * mu - lam)


def exact_terms(lam: float, mu: list[float]) -> tuple[Fraction, Fraction, Fraction, Fraction]:
    """(p0, W_q of M/M_interf/c, S, ρ) by Eq. 2-7 and Eq. 12 (p0 restored), literally, in
    exact rationals of the same float inputs."""
    lam_q, mu_q = Fraction(lam), [Fraction(m) for m in mu]
    c = len(mu)
    rho = lam_q / (c * mu_q[-1])
    prod = [Fraction(1)]
    for m in mu_q:
        prod.append(prod[-1] * lam_q / m)  # Π_{i≤k} ρ_i
    h = (sum(prod[k] / math.factorial(k) for k in range(c))
         + prod[c] / (math.factorial(c) * (1 - rho)))  # Eq. 3
    p0 = 1 / h  # Eq. 4
    wait = p0 * prod[c] / (lam_q * math.factorial(c)) * rho / (1 - rho) ** 2  # Eq. 7
    service = (sum(p0 * prod[i - 1] / math.factorial(i - 1) / mu_q[i - 1]
                   for i in range(1, c + 1))
               + p0 * prod[c] / (mu_q[-1] * math.factorial(c) * (1 - rho)))  # Eq. 12
    return p0, wait, service, rho


def digest_reference(lam: float, mu: list[float]) -> float:
    """serf_latency() from the digest (serf-hams-spec.md A2.3), verbatim in substance."""
    c = len(mu)
    rho = lam / (c * mu[-1])
    if rho >= 1:
        return float("inf")
    prod = [1.0]
    for m in mu:
        prod.append(prod[-1] * lam / m)
    h = 1 + sum(prod[k] / math.factorial(k) for k in range(1, c)) + prod[c] / (
        math.factorial(c) * (1 - rho))
    p0 = 1 / h
    p = [p0 * prod[n] / math.factorial(n) for n in range(c)]
    wq_mm = p0 * prod[c] / (lam * math.factorial(c)) * rho / (1 - rho) ** 2
    f = (c - 1) * (math.sqrt(4 + 5 * c) - 2) / (16 * c)
    g = (1 - rho) / rho
    s = sum(p[i - 1] / mu[i - 1] for i in range(1, c + 1)) + p0 * prod[c] / (
        mu[-1] * math.factorial(c) * (1 - rho))
    return s + 0.5 * (1 + f * g) * wq_mm


@st.composite
def interference_profiles(draw: st.DrawFn, max_c: int = 8) -> list[float]:
    """μ_1 ≥ μ_2 ≥ ... ≥ μ_c: running more requests at once never speeds one up."""
    c = draw(st.integers(min_value=1, max_value=max_c))
    return sorted(draw(st.lists(rates, min_size=c, max_size=c)), reverse=True)


def test_public_names() -> None:
    assert sorted(queueing.__all__) == sorted([
        "Choice", "Config", "Prediction", "QueueModel", "TableRow", "best_config",
        "configurations", "md_c", "md_interf_c", "mm_c", "mm_interf_c", "predict_latency",
        "reference_table"])


# ---------------------------------------------------------------- textbook reductions


@FAST
@given(mu=rates, rho=loads)
def test_one_server_is_md1_by_pollaczek_khinchine(mu: float, rho: float) -> None:
    lam = rho * mu
    expected = 1 / mu + rho / (2 * mu * (1 - rho))
    assert md_interf_c(lam, [mu]).latency == pytest.approx(expected, rel=1e-9)
    assert md_c(lam, mu, 1).latency == pytest.approx(expected, rel=1e-9)


@FAST
@given(mu=rates, rho=loads)
def test_one_server_markov_models_are_mm1(mu: float, rho: float) -> None:
    lam = rho * mu
    for model in ("mm-interf", "mm"):
        assert predict_latency(lam, [mu], model).latency == pytest.approx(1 / (mu - lam),
                                                                          rel=1e-9)


@FAST
@given(mu=rates, rho=loads, c=st.integers(min_value=1, max_value=64))
def test_equal_rates_give_service_one_over_mu_and_textbook_waits(mu: float, rho: float,
                                                                 c: int) -> None:
    lam = rho * c * mu
    chain = mm_interf_c(lam, [mu] * c)
    assert chain.service == pytest.approx(1 / mu, rel=1e-12)
    assert chain.wait == pytest.approx(erlang_c_wait(lam, mu, c), rel=1e-9, abs=1e-300)
    assert mm_c(lam, mu, c).latency == pytest.approx(chain.latency, rel=1e-12)
    corrected = md_interf_c(lam, [mu] * c)
    assert corrected.service == pytest.approx(1 / mu, rel=1e-12)
    assert corrected.wait == pytest.approx(cosmetatos(c, rho) * chain.wait, rel=1e-9,
                                           abs=1e-300)
    assert md_c(lam, mu, c).latency == pytest.approx(corrected.latency, rel=1e-12)


@FAST
@given(profile=interference_profiles(), rho=loads, fraction=st.floats(0.0, 1.0))
def test_textbook_ablations_see_only_mu_1(profile: list[float], rho: float,
                                          fraction: float) -> None:
    lam = fraction * rho * len(profile) * profile[0]
    c = len(profile)
    assert predict_latency(lam, profile, "md") == md_c(lam, profile[0], c)
    assert predict_latency(lam, profile, "mm") == mm_c(lam, profile[0], c)


# ---------------------------------------------------------------- the equations themselves


@FAST
@given(profile=interference_profiles(max_c=12), rho=loads)
def test_agrees_with_the_digest_reference_implementation(profile: list[float],
                                                         rho: float) -> None:
    lam = rho * len(profile) * profile[-1]
    assert md_interf_c(lam, profile).latency == pytest.approx(digest_reference(lam, profile),
                                                              rel=1e-9)


@pytest.mark.parametrize("c", [1, 2, 8, 32, 64])
@pytest.mark.parametrize("rho", [1e-6, 0.5, 0.99, 1 - 1e-6, 1 - 1e-9])
def test_matches_exact_rational_equations_up_to_c_64_and_rho_near_1(c: int,
                                                                    rho: float) -> None:
    profile = [100.0 / (1 + 0.05 * i) for i in range(c)]  # 5 % slower per extra request
    lam = rho * c * profile[-1]
    p0, wait_mm, service, rho_q = exact_terms(lam, profile)
    # ρ is rounded once from floats, so 1 - ρ carries a relative error of about 1e-16/(1-ρ).
    tolerance = 1e-12 + 1e-14 / float(1 - rho_q)
    chain = mm_interf_c(lam, profile)
    assert chain.stable
    assert chain.p0 == pytest.approx(float(p0), rel=tolerance, abs=1e-300)
    assert chain.wait == pytest.approx(float(wait_mm), rel=tolerance, abs=1e-300)
    assert chain.service == pytest.approx(float(service), rel=tolerance)
    md = md_interf_c(lam, profile)
    expected_wait = cosmetatos(c, float(rho_q)) * float(wait_mm)
    assert md.wait == pytest.approx(expected_wait, rel=tolerance, abs=1e-300)
    assert md.latency == pytest.approx(float(service) + expected_wait, rel=tolerance)


def test_large_c_at_high_load_stays_finite_and_bounded() -> None:
    # Π ρ_i / c! overflows a float here (ρ_i up to 500, c = 500); the log-space chain does not.
    profile = [10.0 * 0.999**i for i in range(500)]
    lam = 0.999 * 500 * profile[-1]
    prediction = md_interf_c(lam, profile)
    assert prediction.stable and math.isfinite(prediction.latency)
    assert 1 / profile[0] <= prediction.service <= 1 / profile[-1]
    assert 0.0 <= prediction.p0 <= prediction.wait_probability <= 1.0


# c = 2, by hand. ρ_i = λ/μ_i, ρ = λ/(2μ_2); H = 1 + ρ_1 + ρ_1ρ_2/(2(1-ρ)); p0 = 1/H;
# p1 = ρ_1/H; P(wait) = ρ_1ρ_2/(2(1-ρ)H); W_q^MM = P(wait)/(2μ_2(1-ρ));
# S = p0/μ_1 + p1/μ_2 + P(wait)/μ_2; f(2) = (√14 - 2)/32, g = (1-ρ)/ρ.
F2 = (math.sqrt(14) - 2) / 32
HAND_C2 = [
    # μ, λ: p0, P(wait), S, W_q^MM, Cosmetatos ½(1 + f·g)
    # [10, 5] at 6: ρ = 0.6; H = 1 + 0.6 + 0.72/0.8 = 2.5
    ([10.0, 5.0], 6.0, 0.4, 0.36, 0.04 + 0.048 + 0.072, 0.36 / 4, 0.5 * (1 + F2 * 2 / 3)),
    # [10, 10] at 10: ρ = 0.5; H = 1 + 1 + 1 = 3 (M/M/2: C = 1/3)
    ([10.0, 10.0], 10.0, 1 / 3, 1 / 3, 0.1, 1 / 30, 0.5 * (1 + F2)),
    # [10, 8] at 8: ρ = 0.5; H = 1 + 0.8 + 0.8 = 2.6
    ([10.0, 8.0], 8.0, 5 / 13, 4 / 13, 3 / 26, 1 / 26, 0.5 * (1 + F2)),
    # [10, 5] at 1: ρ = 0.1; H = 1 + 0.1 + 0.02/1.8 = 10/9, so p1 = 0.09
    ([10.0, 5.0], 1.0, 0.9, 0.01, 0.09 + 0.018 + 0.002, 0.01 / 9, 0.5 * (1 + F2 * 9)),
]


@pytest.mark.parametrize(("mu", "lam", "p0", "p_wait", "service", "wait_mm", "factor"),
                         HAND_C2)
def test_two_servers_by_hand(mu: list[float], lam: float, p0: float, p_wait: float,
                             service: float, wait_mm: float, factor: float) -> None:
    chain = mm_interf_c(lam, mu)
    assert (chain.p0, chain.wait_probability) == (pytest.approx(p0), pytest.approx(p_wait))
    assert (chain.service, chain.wait) == (pytest.approx(service), pytest.approx(wait_mm))
    md = md_interf_c(lam, mu)
    assert md.wait == pytest.approx(wait_mm * factor)
    assert md.latency == pytest.approx(service + wait_mm * factor)
    assert md.rho == pytest.approx(lam / (2 * mu[1]))


# ---------------------------------------------------------------- load and stability


@FAST
@given(profile=interference_profiles(),
       pair=st.lists(st.floats(0.0, 1.2), min_size=2, max_size=2))
def test_latency_grows_weakly_with_load(profile: list[float], pair: list[float]) -> None:
    low, high = sorted(x * len(profile) * profile[-1] for x in pair)  # x: ρ, past 1 too
    for model in MODELS:
        before = predict_latency(low, profile, model).latency
        after = predict_latency(high, profile, model).latency
        assert before <= after * (1 + 1e-12)


def test_latency_may_fall_with_load_when_concurrency_speeds_requests_up() -> None:
    # Why the monotonicity above needs μ_1 ≥ ... ≥ μ_c: with μ_2 > μ_1, more load means more
    # requests run at the faster pair rate, and S falls faster than W_q rises.
    assert md_interf_c(4.0, [5.0, 9.0]).latency < md_interf_c(0.5, [5.0, 9.0]).latency


@FAST
@given(profile=interference_profiles(), rho=st.floats(0.0, 3.0))
def test_infinite_exactly_when_rho_reaches_one(profile: list[float], rho: float) -> None:
    lam = rho * len(profile) * profile[-1]
    prediction = md_interf_c(lam, profile)
    unstable = lam / (len(profile) * profile[-1]) >= 1
    assert prediction.stable is not unstable
    assert math.isinf(prediction.latency) is unstable
    assert math.isinf(prediction.wait) is unstable


def test_the_stability_edge_is_exact() -> None:
    profile = [10.0, 7.0, 4.0]
    edge = 3 * 4.0
    assert math.isinf(md_interf_c(edge, profile).latency)
    assert math.isfinite(md_interf_c(math.nextafter(edge, 0.0), profile).latency)
    unstable = md_interf_c(edge, profile)
    assert (unstable.service, unstable.p0, unstable.wait_probability) == (0.25, 0.0, 1.0)


@pytest.mark.parametrize("model", MODELS)
def test_zero_load_is_one_request_alone(model: str) -> None:
    prediction = predict_latency(0.0, [8.0, 5.0], model)  # type: ignore[arg-type]
    assert (prediction.latency, prediction.wait, prediction.service) == (0.125, 0.0, 0.125)
    assert (prediction.rho, prediction.p0, prediction.stable) == (0.0, 1.0, True)


# ---------------------------------------------------------------- against a simulation

# Model error budget: Cosmetatos' formula is itself an approximation of M/D/c (about 1 % of
# W here), and Eq. 12 takes the chain's exponential p_n for a deterministic queue; against the
# simulation that costs up to about 3 % at these loads (measured: 2.9 % on [10, 8, 6, 4] at
# ρ = 0.6). So the test allows 4 % of W plus 3 batch-means standard errors of the simulated
# mean (≤ 1 % at ρ = 0.8 with 200,000 arrivals).
MODEL_BUDGET = 0.04
DES_CASES = [
    ([10.0], 0.8),                        # M/D/1
    ([10.0] * 4, 0.8),                    # M/D/4, no interference
    ([10.0, 8.0], 0.6),
    ([10.0, 5.0], 0.8),                   # two at once halve each request's rate
    ([10.0, 9.0, 7.0], 0.6),
    ([10.0, 8.0, 6.0, 4.0], 0.3),
    ([10.0, 8.0, 6.0, 4.0], 0.6),
    ([10.0, 8.0, 6.0, 4.0], 0.8),
    ([10.0, 10 / 2, 10 / 3, 10 / 4], 0.6),  # time-slicing: oversubscribed cores
]


def test_the_simulation_fixes_each_service_time_by_the_concurrency_at_its_start() -> None:
    # c = 2; alone a request takes 0.1, in a pair 0.2. Request 2 waits for request 0 and then
    # runs beside request 1 (0.2); request 1 is not slowed again when request 2 joins.
    arrivals = np.array([0.0, 0.01, 0.02, 1.0])
    assert fifo_latencies(arrivals, [0.1, 0.2]).tolist() == pytest.approx([0.1, 0.2, 0.28, 0.1])


def test_the_simulation_reproduces_md1() -> None:
    simulated = simulate_mean_latency(5.0, [10.0], arrivals=200_000, seed=7)
    exact = 0.1 + 0.5 / (2 * 10 * 0.5)  # Pollaczek-Khinchine
    assert abs(simulated.mean - exact) <= 3.5 * simulated.stderr


@pytest.mark.parametrize(("profile", "rho"), DES_CASES)
def test_agrees_with_a_discrete_event_simulation(profile: list[float], rho: float) -> None:
    lam = rho * len(profile) * profile[-1]
    simulated = simulate_mean_latency(lam, profile, arrivals=200_000, seed=18)
    predicted = md_interf_c(lam, profile).latency
    assert abs(predicted - simulated.mean) <= MODEL_BUDGET * simulated.mean + 3 * simulated.stderr


@pytest.mark.parametrize(("profile", "rho"), [([10.0, 5.0], 0.6), ([10.0, 9.0, 7.0], 0.6),
                                              ([10.0, 8.0, 6.0, 4.0], 0.8)])
def test_the_ablations_miss_the_simulation_by_more(profile: list[float], rho: float) -> None:
    lam = rho * len(profile) * profile[-1]
    simulated = simulate_mean_latency(lam, profile, arrivals=200_000, seed=18).mean
    error = {model: abs(predict_latency(lam, profile, model).latency - simulated) / simulated
             for model in MODELS}
    assert error["md-interf"] < MODEL_BUDGET
    assert min(error["mm-interf"], error["md"], error["mm"]) > 2 * error["md-interf"]


# ---------------------------------------------------------------- input validation


@pytest.mark.parametrize(("lam", "profile", "model", "message"), [
    (-1.0, [10.0], "md-interf", "arrival_rate must be a finite number >= 0"),
    (math.nan, [10.0], "md-interf", "arrival_rate must be a finite number >= 0"),
    (math.inf, [10.0], "md-interf", "arrival_rate must be a finite number >= 0"),
    ("5", [10.0], "md-interf", "arrival_rate must be a number"),
    (True, [10.0], "md-interf", "arrival_rate must be a number"),
    (1.0, [], "md-interf", "service_rates is empty"),
    (1.0, [10.0, 0.0], "md-interf", r"service_rates\[1\] \(μ_2\) must be a finite number > 0"),
    (1.0, [-3.0], "md-interf", r"service_rates\[0\] \(μ_1\) must be a finite number > 0"),
    (1.0, [math.inf], "md-interf", r"\(μ_1\) must be a finite number > 0"),
    (1.0, [10.0], "mgc", "unknown queueing model 'mgc'"),
])
def test_bad_inputs_raise_a_clear_value_error(lam: float, profile: list[float], model: str,
                                              message: str) -> None:
    with pytest.raises(ValueError, match=message):
        predict_latency(lam, profile, model)  # type: ignore[arg-type]


@pytest.mark.parametrize("servers", [0, -1, 1.5, True])
def test_textbook_ablations_need_a_whole_number_of_servers(servers: int) -> None:
    with pytest.raises(ValueError, match="servers must be an integer >= 1"):
        md_c(1.0, 10.0, servers)
    with pytest.raises(ValueError, match="servers must be an integer >= 1"):
        mm_c(1.0, 10.0, servers)


# ---------------------------------------------------------------- configuration search

# A CIFAR-like 2-core profile: one request on 2 threads is fastest alone (17/s against
# 10/s), two requests side by side interfere a little (9.5/s each).
TWO_CORES = {1: [10.0, 9.5], 2: [17.0, 8.0]}


def test_configurations_respect_the_cores_unless_oversubscribed() -> None:
    assert configurations(TWO_CORES, cores=2) == (Config(1, 1), Config(1, 2), Config(2, 1))
    assert configurations(TWO_CORES, cores=2, oversubscribe=True) == (
        Config(1, 1), Config(1, 2), Config(2, 1), Config(2, 2))
    assert Config(2, 2).cores == 4


@pytest.mark.parametrize(("lam", "best"), [
    (0.0, Config(1, 2)),   # alone, the two-thread request is fastest
    (8.0, Config(1, 2)),
    (12.0, Config(1, 2)),
    (14.0, Config(2, 1)),  # high load: two requests side by side win
    (18.0, Config(2, 1)),  # only (2, 1) is still stable (capacity 19)
])
def test_best_config_moves_from_intra_to_service_parallelism(lam: float,
                                                             best: Config) -> None:
    choice = best_config(lam, TWO_CORES, cores=2)
    assert choice.config == best
    assert choice.prediction.stable
    every = [md_interf_c(lam, TWO_CORES[config.intra][:config.c]).latency
             for config in configurations(TWO_CORES, cores=2)]
    assert choice.prediction.latency == min(every)


def test_ties_go_to_the_fewest_cores() -> None:
    same = {1: [10.0, 10.0], 2: [10.0, 10.0]}  # threads buy nothing
    assert best_config(0.0, same, cores=4).config == Config(1, 1)  # all four tie at λ = 0
    assert best_config(5.0, same, cores=4).config == Config(2, 1)  # (2, 1) ties (2, 2)


def test_when_nothing_is_stable_the_largest_capacity_is_least_bad() -> None:
    choice = best_config(100.0, TWO_CORES, cores=2)
    assert choice.config == Config(2, 1)  # c·μ_c: 19 against 17 and 10
    assert not choice.prediction.stable and math.isinf(choice.prediction.latency)


def test_reference_table_has_every_candidate_per_level() -> None:
    levels = [k * 19.0 / 11 for k in range(1, 11)]  # λ_k = k·λ_max/11 (digest A4)
    table = reference_table(levels, TWO_CORES, cores=2)
    assert [row.arrival_rate for row in table] == levels
    for row in table:
        assert [choice.config for choice in row.candidates] == list(
            configurations(TWO_CORES, cores=2))
        assert row.best == best_config(row.arrival_rate, TWO_CORES, cores=2)
    assert {row.best.config for row in table} == {Config(1, 2), Config(2, 1)}


def test_reference_table_for_an_ablation_uses_that_model() -> None:
    (row,) = reference_table([10.0], TWO_CORES, cores=2, oversubscribe=True, model="md")
    assert {choice.prediction.model for choice in row.candidates} == {"md"}
    # Blind to interference, M/D/c thinks (2, 2) runs two requests at 17/s each.
    assert row.best.config == Config(2, 2)
    assert best_config(10.0, TWO_CORES, cores=2, oversubscribe=True).config == Config(1, 2)


@FAST
@given(profiles=st.dictionaries(st.integers(1, 4), interference_profiles(max_c=4),
                                min_size=1, max_size=3),
       lam=st.floats(0.0, 200.0))
def test_best_config_is_the_argmin_with_the_cheapest_tie(profiles: dict[int, list[float]],
                                                        lam: float) -> None:
    choice = best_config(lam, profiles, cores=4, oversubscribe=True)
    candidates = {config: md_interf_c(lam, profiles[config.intra][:config.c]).latency
                  for config in configurations(profiles, cores=4, oversubscribe=True)}
    lowest = min(candidates.values())
    if math.isfinite(lowest):
        assert choice.prediction.latency <= lowest * (1 + 1e-9)
        cheaper_ties = [config for config, latency in candidates.items()
                        if latency <= lowest * (1 + 1e-9) and config.cores < choice.config.cores]
        assert cheaper_ties == []


@pytest.mark.parametrize(("profiles", "kwargs", "message"), [
    ({}, {"cores": 2}, "profiles is empty"),
    ({0: [10.0]}, {"cores": 2}, "intra threads. must be an integer >= 1"),
    ({1: []}, {"cores": 2}, "profile for intra=1: service_rates is empty"),
    ({1: [10.0, -1.0]}, {"cores": 2}, r"profile for intra=1: service_rates\[1\]"),
    ({4: [10.0]}, {"cores": 2}, r"no profiled configuration fits c\*intra <= 2 cores"),
    ({1: [10.0]}, {"cores": 0}, "cores must be an integer >= 1"),
])
def test_bad_profiles_raise_a_clear_value_error(profiles: dict[int, list[float]],
                                                kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        best_config(1.0, profiles, **kwargs)


def test_bad_levels_raise_a_clear_value_error() -> None:
    with pytest.raises(ValueError, match=r"levels\[1\] must be a finite number >= 0"):
        reference_table([1.0, -2.0], TWO_CORES, cores=2)
