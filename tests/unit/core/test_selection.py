"""Model selection policies and losses (parityserve.core.selection).

The bandit tests run on synthetic reward streams from a seeded generator: five models whose
answers are wrong with probability 0.1, 0.2, 0.3, 0.4 and 0.5.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from parityserve.core import selection
from parityserve.core.selection import (
    Combined,
    Exp3Policy,
    Exp4Policy,
    LossFn,
    Policy,
    QueryInfo,
    State,
    abs_error,
    cross_entropy,
    get_loss,
    make_policy,
    predicted_class,
    weight_shares,
    zero_one,
)
from parityserve.errors import ConfigError, InvalidInput, PredictError

MODELS = ("m0", "m1", "m2", "m3", "m4")
ERRORS = (0.1, 0.2, 0.3, 0.4, 0.5)
CE_CAP = -math.log(1e-4)


def test_public_names() -> None:
    assert sorted(selection.__all__) == [
        "Combined", "DEFAULT_CONTEXT", "Exp3Policy", "Exp4Policy", "LOSSES", "LossFn",
        "POLICIES", "Policy", "QueryInfo", "RobustExp4Policy", "SinglePolicy", "State",
        "abs_error", "cross_entropy", "get_loss", "make_policy", "predicted_class",
        "weight_shares", "zero_one",
    ]


# --- losses ---------------------------------------------------------------------------


@pytest.mark.parametrize(("prediction", "label", "expected"), [
    (np.array([0.1, 2.0, -1.0]), 1, 0.0),
    (np.array([0.1, 2.0, -1.0]), 0, 1.0),
    ([[0.2, 0.8]], 1, 0.0),  # a batch-of-one row is squeezed
    (3, 3, 0.0),
    (np.int64(2), 3, 1.0),
    (2.0, 2, 0.0),
    (1, 1.0, 0.0),  # an integral float label from JSON is fine
    (np.array([np.nan, 1.0]), 1, 1.0),  # a NaN output is wrong, not exempt
])
def test_zero_one(prediction: Any, label: Any, expected: float) -> None:
    assert zero_one(prediction, label) == expected


def test_cross_entropy_uses_probabilities_as_they_are() -> None:
    assert cross_entropy(np.array([0.25, 0.75]), 1) == pytest.approx(-math.log(0.75) / CE_CAP)
    assert cross_entropy(np.array([0.0, 1.0]), 1) == 0.0


def test_cross_entropy_softmaxes_raw_scores() -> None:
    scores = np.array([1.0, 2.0, 3.0])
    p = np.exp(scores) / np.exp(scores).sum()
    assert cross_entropy(scores, 0) == pytest.approx(-math.log(p[0]) / CE_CAP)


def test_cross_entropy_is_capped_at_one() -> None:
    assert cross_entropy(np.array([1.0, 0.0]), 1) == 1.0
    assert cross_entropy(np.array([1000.0, -1000.0]), 1) == 1.0
    assert cross_entropy(np.array([np.inf, 0.0]), 0) == 1.0


def test_cross_entropy_of_a_bare_label_is_zero_one() -> None:
    assert cross_entropy(4, 4) == 0.0
    assert cross_entropy(4, 3) == 1.0


@pytest.mark.parametrize(("prediction", "label", "clip", "expected"), [
    (0.5, 0.25, 1.0, 0.25),
    (3.0, 0.0, 1.0, 1.0),
    (3.0, 0.0, 10.0, 0.3),
    (np.array([2.5]), 2, 1.0, 0.5),
    (np.nan, 1.0, 1.0, 1.0),
])
def test_abs_error(prediction: Any, label: Any, clip: float, expected: float) -> None:
    assert abs_error(prediction, label, clip) == pytest.approx(expected)


finite = st.floats(-1e6, 1e6, allow_nan=False)
any_float = st.floats(allow_nan=True, allow_infinity=True)


@given(st.lists(any_float, min_size=2, max_size=12), st.data())
def test_classification_losses_stay_in_unit_interval(scores: list[float], data: Any) -> None:
    label = data.draw(st.integers(0, len(scores) - 1))
    for loss in (zero_one, cross_entropy):
        assert 0.0 <= loss(np.array(scores), label) <= 1.0


@given(any_float, finite, st.floats(1e-6, 1e6))
def test_abs_error_stays_in_unit_interval(prediction: float, label: float, clip: float) -> None:
    assert 0.0 <= abs_error(prediction, label, clip) <= 1.0


@pytest.mark.parametrize(
    "label", ["cat", b"1", float("nan"), float("inf"), 1.5, [1, 2], None, {}, []])
@pytest.mark.parametrize("loss", [zero_one, cross_entropy])
def test_malformed_class_labels_are_invalid_input(loss: LossFn, label: Any) -> None:
    with pytest.raises(InvalidInput, match="label"):
        loss(np.array([0.2, 0.3, 0.5]), label)


@pytest.mark.parametrize("label", [3, -1, 10])
@pytest.mark.parametrize("loss", [zero_one, cross_entropy])
def test_out_of_range_labels_are_invalid_input(loss: LossFn, label: int) -> None:
    with pytest.raises(InvalidInput, match="out of range for a model with 3 classes"):
        loss(np.array([0.2, 0.3, 0.5]), label)


@pytest.mark.parametrize("label", ["1.0", float("nan"), float("inf"), None, [1.0, 2.0]])
def test_malformed_regression_labels_are_invalid_input(label: Any) -> None:
    with pytest.raises(InvalidInput, match="regression label"):
        abs_error(1.0, label)


def test_unusable_outputs_are_predict_errors() -> None:
    with pytest.raises(PredictError, match="scalar prediction"):
        abs_error(np.array([1.0, 2.0]), 1.0)
    with pytest.raises(PredictError, match="not numeric"):
        zero_one("cat", 1)
    with pytest.raises(PredictError):
        zero_one(np.zeros((2, 3)), 1)


def test_get_loss() -> None:
    assert get_loss("zero-one") is zero_one
    assert get_loss("cross-entropy") is cross_entropy
    assert get_loss("abs-error") is abs_error
    with pytest.raises(ConfigError, match="abs-error"):
        get_loss("hinge")


def test_predicted_class() -> None:
    assert predicted_class(np.array([0.1, 0.7, 0.2])) == 1
    assert predicted_class([[3.0, -1.0]]) == 0
    assert predicted_class(np.int32(4)) == 4
    assert type(predicted_class(np.int32(4))) is int
    with pytest.raises(PredictError):
        predicted_class(0.5)
    with pytest.raises(PredictError):
        predicted_class(np.array([np.nan, 1.0]))


# --- registry and options -------------------------------------------------------------


def test_builtins_by_name() -> None:
    for name in ("single", "exp3", "exp4", "robust-exp4"):
        assert make_policy(name).name == name
    assert make_policy("exp3", {"eta": 0.2}).options == {"eta": 0.2, "gamma": 0.05,
                                                          "min_weight": 1e-3}


def test_unknown_policy_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"'exp3', 'exp4', 'robust-exp4', 'single'"):
        make_policy("epsilon-greedy")


@pytest.mark.parametrize(("name", "options", "message"), [
    ("exp3", {"etta": 0.1}, r"no option\(s\) \['etta'\]; valid options"),
    ("single", {"eta": 0.1}, "takes no options"),
    ("exp3", {"eta": -1}, "eta must be > 0"),
    ("exp3", {"gamma": 0}, r"gamma must be in \(0, 1\]"),
    ("exp4", {"eta": "fast"}, "must be a number"),
    ("exp4", {"eta": True}, "must be a number"),
    ("exp4", {"min_weight": 1.0}, "min_weight"),
])
def test_bad_options_are_config_errors(name: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_policy(name, options)


# --- single ---------------------------------------------------------------------------


def test_single_asks_the_first_model_and_passes_its_answer_through() -> None:
    policy = make_policy("single")
    state = policy.init(MODELS)
    query = QueryInfo("global", MODELS)
    assert policy.select(state, query, np.random.default_rng(0)) == ("m0",)
    out = np.array([0.3, 0.7])
    combined = policy.combine(state, query, {"m0": out, "m1": 5})
    assert combined.output is out and combined.confidence == 1.0 and combined.used == ("m0",)
    assert policy.combine(state, query, {"m1": 5}) == Combined(None, 0.0, ())


def test_single_observe_only_counts() -> None:
    policy = make_policy("single")
    state = policy.init(MODELS)
    query = QueryInfo("global", MODELS, ("m0",))
    state = policy.observe(state, query, 1, {"m0": 1}, zero_one)
    state = policy.observe(state, query, 1, {"m0": 0}, zero_one)
    assert state["feedback"]["m0"] == 2 and state["loss_sum"]["m0"] == 1.0
    assert state["rounds"] == 2 and "log_weights" not in state


# --- bandits on synthetic streams -----------------------------------------------------


def _answer(rng: np.random.Generator, error: float) -> int:
    """A model's answer to a query whose true label is 0."""
    return 1 if rng.random() < error else 0


def _run(
    policy: Policy, state: State, rng: np.random.Generator, errors: Sequence[float], rounds: int
) -> tuple[State, list[float], list[str]]:
    """``rounds`` of select / answer / observe; m0's weight share and the picks per round."""
    shares: list[float] = []
    picks: list[str] = []
    for _ in range(rounds):
        asked = policy.select(state, QueryInfo("global", MODELS), rng)
        query = QueryInfo("global", MODELS, asked)
        answers = {m: _answer(rng, errors[MODELS.index(m)]) for m in asked}
        state = policy.observe(state, query, 0, answers, zero_one)
        shares.append(weight_shares(state)["m0"])
        picks.extend(asked)
    return state, shares, picks


def _first(shares: Sequence[float], condition: Any) -> int:
    return next(i for i, s in enumerate(shares) if condition(s)) + 1


def test_exp3_converges_to_the_best_arm() -> None:
    policy = make_policy("exp3")
    state, shares, picks = _run(policy, policy.init(MODELS), np.random.default_rng(1),
                                ERRORS, 2000)
    assert shares[-1] > 0.5
    last = picks[-500:]
    assert last.count("m0") / len(last) > 0.6  # at most gamma (5%) goes to exploration


def test_exp4_converges_to_the_best_arm() -> None:
    policy = make_policy("exp4")
    state, shares, _ = _run(policy, policy.init(MODELS), np.random.default_rng(1), ERRORS, 300)
    assert shares[-1] > 0.95
    assert max(weight_shares(state), key=weight_shares(state).__getitem__) == "m0"


def _tracking_bound(policy: Policy, loss_gap: float) -> float:
    """Rounds for the winner to change, with a 3x margin over the expected value.

    Log-weights are floored at ln(min_weight) below the best, so no model is ever more than
    L = ln(1 / min_weight) behind. Each round the expected loss gap closes that distance by
    eta * gap (Hedge; for exp3 the importance-weighted estimate has the same expectation),
    so the expected time to overtake is L / (eta * gap). Without the floor it would grow
    with how long the old winner had been winning.
    """
    log_range = math.log(1.0 / policy.options["min_weight"])
    return 3.0 * log_range / (policy.options["eta"] * loss_gap)


@pytest.mark.parametrize(("name", "warmup"), [("exp3", 1500), ("exp4", 300)])
def test_bandits_shift_away_from_a_degraded_arm_and_back(name: str, warmup: int) -> None:
    policy = make_policy(name)
    rng = np.random.default_rng(7)
    state, shares, _ = _run(policy, policy.init(MODELS), rng, ERRORS, warmup)
    assert shares[-1] > 0.5

    degraded = (0.9, *ERRORS[1:])  # m1 (0.2) is now best: loss gap 0.9 - 0.2 = 0.7
    state, shares, _ = _run(policy, state, rng, degraded, 600)
    away = _first(shares, lambda s: s < 0.5)
    assert away <= _tracking_bound(policy, 0.7)  # exp3: 296 rounds, exp4: 60
    assert shares[-1] < 0.05

    # Back to 0.1 against m1's 0.2: a loss gap of 0.1, so a slower return.
    state, shares, _ = _run(policy, state, rng, ERRORS, 2500)
    back = _first(shares, lambda s: s > 0.5)
    assert back <= _tracking_bound(policy, 0.1)  # exp3: 2072 rounds, exp4: 414


def test_exp3_samples_by_its_probabilities() -> None:
    policy = make_policy("exp3", {"gamma": 0.2})
    assert isinstance(policy, Exp3Policy)
    state = policy.init(MODELS)
    state["log_weights"]["m0"] = math.log(4.0)  # unnormalised on purpose: only ratios count
    p = policy.probabilities(state, MODELS)
    assert p[0] == pytest.approx(0.8 * 0.5 + 0.04) and p.sum() == pytest.approx(1.0)
    rng = np.random.default_rng(3)
    picks = [policy.select(state, QueryInfo("global", MODELS), rng)[0] for _ in range(4000)]
    assert picks.count("m0") / 4000 == pytest.approx(p[0], abs=0.03)


def test_exp3_updates_only_the_selected_model_importance_weighted() -> None:
    policy = make_policy("exp3")
    state = policy.init(MODELS)
    query = QueryInfo("global", MODELS, ("m2",))
    after = policy.observe(state, query, 0, {"m2": 1}, zero_one)
    logs = after["log_weights"]
    # p(m2) = 1/5 under uniform weights, so its log-weight drops by eta * 1 / 0.2.
    assert logs["m2"] == pytest.approx(-0.1 / 0.2)
    assert all(logs[m] == 0.0 for m in MODELS if m != "m2")


def test_exp3_without_a_selection_falls_back_to_hedge() -> None:
    policy = make_policy("exp3")
    query = QueryInfo("global", MODELS)
    after = policy.observe(policy.init(MODELS), query, 0, {"m0": 0, "m1": 1, "m2": 1}, zero_one)
    assert after["log_weights"] == pytest.approx(
        {"m0": 0.0, "m1": -0.1, "m2": -0.1, "m3": 0.0, "m4": 0.0})
    combined = policy.combine(after, query, {"m1": 7, "m2": 8})
    assert combined == Combined(7, 1.0, ("m1",))


def test_exp3_combine_passes_the_selected_answer_through() -> None:
    policy = make_policy("exp3")
    state = policy.init(MODELS)
    query = QueryInfo("global", MODELS, ("m3",))
    assert policy.combine(state, query, {"m3": 2.5, "m0": 1}) == Combined(2.5, 1.0, ("m3",))
    assert policy.combine(state, query, {"m0": 1}) == Combined(None, 0.0, ())


def test_selection_is_reproducible_from_the_seed() -> None:
    policy = make_policy("exp3")
    state = policy.init(MODELS)
    runs = [[policy.select(state, QueryInfo("u", MODELS), rng) for _ in range(50)]
            for rng in (np.random.default_rng(5), np.random.default_rng(5))]
    assert runs[0] == runs[1]


# --- exp4 combine ---------------------------------------------------------------------


def _weighted_state(policy: Policy, weights: Mapping[str, float]) -> State:
    state = policy.init(list(weights))
    state["log_weights"] = {m: math.log(w) for m, w in weights.items()}
    return state


def test_exp4_weighted_ensemble_of_probabilities() -> None:
    policy = make_policy("exp4")
    state = _weighted_state(policy, {"a": 1.0, "b": 0.5, "c": 0.5})
    query = QueryInfo("global", ("a", "b", "c"), ("a", "b", "c"))
    predictions = {"a": np.array([0.6, 0.4]), "b": np.array([0.0, 1.0]),
                   "c": np.array([0.1, 0.9])}
    combined = policy.combine(state, query, predictions)
    # mixture: (1*0.6 + 0.5*0 + 0.5*0.1) / 2 = 0.325 for class 0, so class 1 wins.
    assert combined.output == 1 and type(combined.output) is int
    assert combined.confidence == pytest.approx(1.0 / 2.0)  # b and c agree: 1 of 2
    assert combined.used == ("a", "b", "c")


def test_exp4_missing_predictions_use_only_present_ones_and_lower_confidence() -> None:
    policy = make_policy("exp4")
    state = _weighted_state(policy, {"a": 1.0, "b": 0.5, "c": 0.5})
    query = QueryInfo("global", ("a", "b", "c"), ("a", "b", "c"))
    full = {"a": np.array([0.1, 0.9]), "b": np.array([0.8, 0.2]), "c": np.array([0.7, 0.3])}
    combined = policy.combine(state, query, full)
    # (1*[0.1, 0.9] + 0.5*[0.8, 0.2] + 0.5*[0.7, 0.3]) / 2 = [0.425, 0.575]
    assert combined.output == 1 and combined.confidence == pytest.approx(0.5)

    partial = policy.combine(state, query, {"b": full["b"], "c": full["c"]})
    assert partial.output == 0 and partial.used == ("b", "c")
    assert partial.confidence == pytest.approx(1.0 / 2.0)  # 0.5 + 0.5 of a total of 2

    alone = policy.combine(state, query, {"a": full["a"]})
    assert alone.output == 1 and alone.confidence == pytest.approx(0.5)
    assert policy.combine(state, query, {}) == Combined(None, 0.0, ())


def test_exp4_softmaxes_logits_but_not_probabilities() -> None:
    policy = make_policy("exp4")
    state = policy.init(("a", "b"))
    query = QueryInfo("global", ("a", "b"))
    # As probabilities, a's [0.55, 0.45] barely favours 0 and b's [0.2, 0.8] wins;
    # the logits [10, 0] are a near-certain 0 that outweighs b.
    assert policy.combine(state, query, {"a": np.array([0.55, 0.45]),
                                         "b": np.array([0.2, 0.8])}).output == 1
    assert policy.combine(state, query, {"a": np.array([10.0, 0.0]),
                                         "b": np.array([0.2, 0.8])}).output == 0


def test_exp4_weighted_vote_over_labels() -> None:
    policy = make_policy("exp4")
    state = _weighted_state(policy, {"a": 1.0, "b": 0.4, "c": 0.4, "d": 0.2})
    query = QueryInfo("global", ("a", "b", "c", "d"))
    combined = policy.combine(state, query, {"a": 3, "b": 5, "c": np.int64(5)})
    assert combined.output == 3  # 1.0 against 0.8
    assert combined.confidence == pytest.approx(1.0 / 2.0)
    # A vector and a label mix: the vector votes for its argmax.
    mixed = policy.combine(state, query, {"a": np.array([0.0, 0.0, 0.0, 0.0, 0.0, 1.0]),
                                          "b": 2})
    assert mixed.output == 5


def test_exp4_regression_is_a_weighted_mean() -> None:
    policy = make_policy("exp4")
    state = _weighted_state(policy, {"a": 1.0, "b": 0.5, "c": 0.5})
    query = QueryInfo("global", ("a", "b", "c"))
    combined = policy.combine(state, query, {"a": 1.0, "b": 4.0})
    assert combined.output == pytest.approx((1.0 + 2.0) / 1.5)
    assert combined.confidence == pytest.approx(1.5 / 2.0)  # weight share present


def test_exp4_treats_a_nan_output_as_missing() -> None:
    policy = make_policy("exp4")
    state = policy.init(("a", "b"))
    query = QueryInfo("global", ("a", "b"))
    combined = policy.combine(state, query, {"a": np.array([np.nan, 1.0]),
                                             "b": np.array([0.9, 0.1])})
    assert combined.output == 0 and combined.used == ("b",) and combined.confidence == 0.5


def test_exp4_refuses_to_mix_scores_and_regression_values() -> None:
    policy = make_policy("exp4")
    query = QueryInfo("global", ("a", "b"))
    with pytest.raises(PredictError, match="cannot combine"):
        policy.combine(policy.init(("a", "b")), query, {"a": np.array([0.5, 0.5]), "b": 0.3})


def test_exp4_observe_is_hedge_over_every_answer() -> None:
    policy = make_policy("exp4")
    assert isinstance(policy, Exp4Policy)
    state = policy.init(("a", "b", "c"))
    query = QueryInfo("global", ("a", "b", "c"), ("a", "b", "c"))
    after = policy.observe(state, query, 1, {"a": np.array([0.9, 0.1]), "b": 1}, zero_one)
    assert after["log_weights"] == pytest.approx({"a": -0.5, "b": 0.0, "c": 0.0})


def test_weights_stay_finite_and_floored() -> None:
    policy = make_policy("exp4", {"eta": 5.0})
    state = policy.init(("a", "b"))
    query = QueryInfo("global", ("a", "b"))
    for _ in range(1000):
        state = policy.observe(state, query, 0, {"a": 1, "b": 0}, zero_one)
    assert state["log_weights"] == {"a": pytest.approx(math.log(1e-3)), "b": 0.0}


# --- robust-exp4 ----------------------------------------------------------------------


def test_robust_exp4_confidence_is_the_agreeing_fraction() -> None:
    policy = make_policy("robust-exp4")
    # Weights would make exp4's confidence differ: a alone holds most of the weight.
    state = _weighted_state(policy, {"a": 1.0, "b": 0.1, "c": 0.1, "d": 0.1})
    query = QueryInfo("global", ("a", "b", "c", "d"))
    combined = policy.combine(state, query, {"a": 2, "b": 2, "c": 1, "d": 1})
    assert combined.output == 2 and combined.confidence == pytest.approx(2 / 4)
    missing = policy.combine(state, query, {"a": 2, "c": 1})
    assert missing.output == 2 and missing.confidence == pytest.approx(1 / 4)
    exp4 = make_policy("exp4").combine(state, query, {"a": 2, "b": 2, "c": 1, "d": 1})
    assert exp4.confidence == pytest.approx(1.1 / 1.3)


def test_robust_exp4_learns_like_exp4() -> None:
    robust, plain = make_policy("robust-exp4"), make_policy("exp4")
    query = QueryInfo("global", ("a", "b"))
    args = (query, 0, {"a": 0, "b": 1}, zero_one)
    assert (robust.observe(robust.init(("a", "b")), *args)["log_weights"]
            == plain.observe(plain.init(("a", "b")), *args)["log_weights"])


# --- custom policies ------------------------------------------------------------------


class MyPolicy(Policy):
    """Always asks the last model; doubles regression answers."""

    name = "mine"
    defaults = {"factor": 2.0}

    def select(self, state: State, query: QueryInfo, rng: np.random.Generator) -> tuple[str, ...]:
        return query.models[-1:]

    def combine(self, state: State, query: QueryInfo, predictions: Mapping[str, Any]) -> Combined:
        model = query.models[-1]
        if model not in predictions:
            return Combined(None, 0.0, ())
        return Combined(self.options["factor"] * predictions[model], 1.0, (model,))


class DuckPolicy:
    """Not a Policy subclass, but has the four methods."""

    def init(self, models: Sequence[str]) -> State:
        return {"seen": 0}

    def select(self, state: State, query: QueryInfo, rng: np.random.Generator) -> list[str]:
        return list(query.models)

    def combine(self, state: State, query: QueryInfo, predictions: Mapping[str, Any]) -> Combined:
        return Combined(len(predictions), 1.0, tuple(predictions))

    def observe(self, state: State, query: QueryInfo, label: Any,
                predictions: Mapping[str, Any], loss: LossFn) -> State:
        return {"seen": state["seen"] + 1}


class NotAPolicy:
    def select(self) -> None: ...


@pytest.mark.parametrize("spec", ["test_selection:MyPolicy", "python:test_selection:MyPolicy"])
def test_custom_policy_plugs_in(spec: str) -> None:
    policy = make_policy(spec, {"factor": 3})
    assert isinstance(policy, MyPolicy) and policy.options == {"factor": 3.0}
    query = QueryInfo("global", ("a", "b"))
    assert policy.select(policy.init(("a", "b")), query, np.random.default_rng(0)) == ("b",)
    assert policy.combine({}, query, {"b": 1.5}).output == 4.5
    state = policy.observe(policy.init(("a", "b")), query, 1.0, {"b": 1.5}, abs_error)
    assert state["loss_sum"]["b"] == 0.5


def test_duck_typed_policy_is_adapted() -> None:
    policy = make_policy("python:test_selection:DuckPolicy")
    assert isinstance(policy, Policy)
    query = QueryInfo("global", ("a", "b"))
    state = policy.init(("a", "b"))
    assert policy.select(state, query, np.random.default_rng(0)) == ("a", "b")
    assert policy.combine(state, query, {"a": 1}) == Combined(1, 1.0, ("a",))
    assert policy.observe(state, query, 0, {}, zero_one) == {"seen": 1}
    assert policy.reconcile({"seen": 4}, ("a",)) == {"seen": 4}


@pytest.mark.parametrize(("spec", "options", "message"), [
    ("python:no_such_module_xyz:P", {}, "cannot import 'no_such_module_xyz'"),
    ("test_selection:Missing", {}, "has no 'Missing'"),
    ("python:test_selection", {}, "expected python:pkg.mod:Class"),
    ("test_selection:NotAPolicy", {}, r"lacks the method\(s\) \['init', 'combine', 'observe'\]"),
    ("test_selection:MyPolicy", {"speed": 1}, r"no option\(s\) \['speed'\]"),
    ("test_selection:DuckPolicy", {"x": 1}, "could not be created"),
    ("test_selection:MODELS", {}, "is not a class"),
])
def test_custom_policy_errors_are_config_errors(
    spec: str, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        make_policy(spec, options)


# --- state ----------------------------------------------------------------------------

BUILTINS = ("single", "exp3", "exp4", "robust-exp4")


@pytest.mark.parametrize("name", BUILTINS)
def test_state_is_json_and_observe_never_mutates(name: str) -> None:
    policy = make_policy(name)
    state = policy.init(MODELS)
    rng = np.random.default_rng(11)
    for _ in range(30):
        asked = policy.select(state, QueryInfo("u1", MODELS), rng)
        query = QueryInfo("u1", MODELS, asked)
        answers = {m: rng.random(3) for m in asked}
        before = copy.deepcopy(state)
        new = policy.observe(state, query, 2, answers, cross_entropy)
        assert state == before
        assert json.loads(json.dumps(new)) == new
        state = new
    assert state["rounds"] == 30


@pytest.mark.parametrize("name", BUILTINS)
def test_a_malformed_label_changes_nothing(name: str) -> None:
    policy = make_policy(name)
    state = policy.init(MODELS)
    before = copy.deepcopy(state)
    query = QueryInfo("global", MODELS, MODELS)
    with pytest.raises(InvalidInput):
        policy.observe(state, query, "cat", {m: np.array([0.5, 0.5]) for m in MODELS}, zero_one)
    assert state == before


def test_reconcile_keeps_known_weights_and_starts_new_models_level_with_the_best() -> None:
    policy = make_policy("exp4")
    state = _weighted_state(policy, {"a": 1.0, "b": 0.25, "c": 0.5})
    state["feedback"]["b"] = 7
    before = copy.deepcopy(state)
    new = policy.reconcile(state, ("b", "c", "d"))
    assert state == before
    assert new["models"] == ["b", "c", "d"]
    # a (the best) is gone: weights are re-shifted so c is the new best at 0.
    assert new["log_weights"] == pytest.approx(
        {"b": math.log(0.5), "c": 0.0, "d": 0.0})
    assert new["feedback"] == {"b": 7, "c": 0, "d": 0}
    assert json.loads(json.dumps(new)) == new


def test_reconcile_keeps_counts_for_single() -> None:
    policy = make_policy("single")
    state = policy.observe(policy.init(("a", "b")), QueryInfo("global", ("a", "b")), 1,
                           {"a": 1}, zero_one)
    new = policy.reconcile(state, ("a", "c"))
    assert new["feedback"] == {"a": 1, "c": 0} and new["rounds"] == 1


def test_reconcile_is_idempotent_and_keeps_a_subclass_s_own_keys() -> None:
    policy = make_policy("exp3")
    state = policy.observe(policy.init(MODELS), QueryInfo("global", MODELS, ("m1",)), 0,
                           {"m1": 1}, zero_one)
    state["my_counter"] = 3
    assert policy.reconcile(state, MODELS) == state


@given(st.lists(st.floats(1e-3, 1.0), min_size=1, max_size=6), st.data())
def test_exp4_confidence_is_a_fraction(weights: list[float], data: Any) -> None:
    names = tuple(f"m{i}" for i in range(len(weights)))
    arrived = data.draw(st.lists(st.sampled_from(names), unique=True))
    scores = {m: np.array(data.draw(st.lists(finite, min_size=3, max_size=3))) for m in arrived}
    for name in ("exp4", "robust-exp4"):
        policy = make_policy(name)
        state = _weighted_state(policy, dict(zip(names, weights, strict=True)))
        combined = policy.combine(state, QueryInfo("global", names), scores)
        assert 0.0 <= combined.confidence <= 1.0
        assert set(combined.used) == set(arrived)
        assert (combined.output is None) == (not arrived)


def test_weight_shares() -> None:
    policy = make_policy("exp4")
    shares = weight_shares(_weighted_state(policy, {"a": 3.0, "b": 1.0}))
    assert shares == pytest.approx({"a": 0.75, "b": 0.25})
    assert weight_shares(make_policy("single").init(("a",))) == {}


# --- states read back from a store ------------------------------------------------------


@pytest.mark.parametrize("name", ["single", "exp3", "exp4", "robust-exp4"])
def test_a_fresh_or_learned_state_has_no_problem(name: str) -> None:
    policy = make_policy(name)
    state = policy.init(MODELS[:2])
    query = QueryInfo(context="u", models=MODELS[:2], selected=MODELS[:1])
    learned = policy.observe(state, query, 1, {"m0": 1, "m1": 0}, zero_one)
    assert policy.state_problem(state) is None
    assert policy.state_problem(json.loads(json.dumps(learned))) is None
    assert policy.state_problem({"someone_elses": object()}) is None  # not judged


@pytest.mark.parametrize(("name", "field", "value", "said"), [
    ("exp3", "log_weights", "x", "'log_weights' is 'x', not a number per model"),
    ("exp4", "log_weights", {"m0": "heavy"}, "a number per model"),
    ("exp4", "log_weights", {"m0": None}, "a number per model"),
    ("exp4", "log_weights", {"m0": True}, "a number per model"),
    ("exp4", "log_weights", [0.0], "a number per model"),
    ("single", "feedback", [1], "'feedback' is [1], not a count per model"),
    ("single", "feedback", {"m0": -1}, "a count per model"),
    ("single", "feedback", {"m0": 1.5}, "a count per model"),
    ("exp3", "loss_sum", {"m0": [0.5]}, "a number per model"),
    ("exp3", "rounds", "many", "'rounds' is 'many', not a count"),
    ("exp3", "models", 7, "a list of model names"),
    ("exp3", "models", [1], "a list of model names"),
    ("exp3", "policy", None, "a policy name"),
])
def test_a_mistyped_field_is_a_problem_that_names_it(name: str, field: str, value: Any,
                                                      said: str) -> None:
    policy = make_policy(name)
    state = {**policy.init(MODELS[:2]), field: value}
    assert said in str(policy.state_problem(state))


def test_a_duck_typed_policy_s_state_is_judged_only_if_it_says_how() -> None:
    class Duck:
        def init(self, models: Sequence[str]) -> State:
            return {"rounds": "its own business"}

        def select(self, state: State, query: QueryInfo, rng: Any) -> tuple[str, ...]:
            return query.models[:1]

        def combine(self, state: State, query: QueryInfo, predictions: Any) -> Combined:
            raise NotImplementedError

        def observe(self, *args: Any) -> State:
            raise NotImplementedError

    class Strict(Duck):
        def state_problem(self, state: State) -> str | None:
            return "never good enough"

    assert selection._DuckPolicy(Duck()).state_problem({"rounds": "x"}) is None
    assert selection._DuckPolicy(Strict()).state_problem({}) == "never good enough"
