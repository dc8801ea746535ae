"""The model selection layer, as in Clipper (NSDI'17, section 5).

An application links several models. A *policy* decides, per query, which models to ask
(``select``), how to turn the answers that arrived by the deadline into one answer with a
confidence score (``combine``), and how to learn from feedback (``observe``).

* ``single`` asks the first linked model and passes its answer through.
* ``exp3`` is a bandit: it asks one model, sampled by weight, so it costs one prediction
  per query, and learns from the loss of that model alone (importance-weighted).
* ``exp4`` asks every model and answers with their weighted ensemble; feedback gives a
  loss for every model, so all weights learn at once (Hedge).
* ``robust-exp4`` is exp4 whose confidence is the fraction of models that agree, which the
  runtime compares with the application's ``confidence_threshold`` (section 5.2.1).

Everything here is pure: the random generator is an argument and nothing reads a clock.
A policy object holds only its options; the learned *state* is a plain JSON value (dicts,
lists, floats, strings) that the runtime stores in SQLite or Redis, one per application and
context (a user or session, ``DEFAULT_CONTEXT`` when the query names none). ``observe``
returns a new state and never changes the one it was given, so a failed write-back loses
nothing. What comes back from a store is checked first (``state_problem``): a field of the
wrong type (another writer to the Redis, a bug) would otherwise fail every query of that
context, so the runtime discards such a state and starts the context afresh.

Weights live in log space, shifted so that the best model sits at 0, which keeps them
finite however long a policy runs. They are also floored at ``log(min_weight)`` below the
best: without a floor a model that was bad for a long time needs as long again to win back
its weight after it recovers; with it, no model is ever more than ``ln(1 / min_weight)``
behind, so a policy tracks a change within a bounded number of rounds (in expectation
``ln(1 / min_weight) / (eta * loss gap)`` for exp4).

Losses map a prediction and the true label to [0, 1]. A malformed label is the client's
fault (``InvalidInput``, a 400); an unusable model output is the model's (``PredictError``).
"""

from __future__ import annotations

import copy
import importlib
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from parityserve.errors import ConfigError, InvalidInput, PredictError

__all__ = [
    "DEFAULT_CONTEXT",
    "LOSSES",
    "POLICIES",
    "Combined",
    "Exp3Policy",
    "Exp4Policy",
    "LossFn",
    "Policy",
    "QueryInfo",
    "RobustExp4Policy",
    "SinglePolicy",
    "State",
    "abs_error",
    "cross_entropy",
    "get_loss",
    "make_policy",
    "predicted_class",
    "weight_shares",
    "zero_one",
]

State = dict[str, Any]
LossFn = Callable[[Any, Any], float]
_Floats = npt.NDArray[np.float64]
_Array = npt.NDArray[Any]

DEFAULT_CONTEXT = "global"

# --- losses ---------------------------------------------------------------------------

# Cross-entropy is unbounded as p -> 0; capping it at -log(1e-4) and dividing by the cap
# keeps every loss in [0, 1], which the bandit update rules assume.
_PROB_FLOOR = 1e-4
_CE_CAP = -math.log(_PROB_FLOOR)
# float32 softmax outputs sum to 1 only up to rounding; this tells them from raw scores.
_PROB_SUM_TOLERANCE = 1e-4


def predicted_class(output: Any) -> int:
    """The class a model output names: the argmax of a score vector, or a scalar label."""
    arr = _numeric(output)
    if arr.ndim == 1:
        if not np.all(np.isfinite(arr)):
            raise PredictError("a vector of class scores contains NaN or infinity")
        return int(np.argmax(arr))
    value = arr.item()
    if isinstance(value, float) and not value.is_integer():
        raise PredictError(f"model output {value!r} is not a class label")
    return int(value)


def zero_one(prediction: Any, label: Any) -> float:
    """0.0 when the predicted class (argmax of a score vector) equals ``label``, else 1.0."""
    target = _class_label(label)
    arr = _numeric(prediction)
    if arr.ndim == 1:
        _check_in_range(target, arr.size)
    if not np.all(np.isfinite(arr)):
        return 1.0  # a model that answers NaN is wrong, not exempt
    if arr.ndim == 1:
        return 0.0 if int(np.argmax(arr)) == target else 1.0
    return 0.0 if float(arr.item()) == target else 1.0


def cross_entropy(prediction: Any, label: Any) -> float:
    """-log p[label], capped at -log(1e-4) and scaled by the cap into [0, 1].

    Scores are softmaxed unless they already look like probabilities. A bare label is a
    one-hot distribution, whose cross-entropy is 0 or the cap: the zero-one loss.
    """
    target = _class_label(label)
    arr = _numeric(prediction)
    if arr.ndim == 0:
        return zero_one(arr, target)
    _check_in_range(target, arr.size)
    if not np.all(np.isfinite(arr)):
        return 1.0
    p = float(_probabilities(arr)[target])
    return min(max(-math.log(max(p, _PROB_FLOOR)), 0.0), _CE_CAP) / _CE_CAP


def abs_error(prediction: Any, label: Any, clip: float = 1.0) -> float:
    """min(|prediction - label|, clip) / clip: a regression loss in [0, 1]."""
    if not clip > 0.0:
        raise ConfigError(f"abs-error clip must be > 0, got {clip}")
    target = _real_label(label)
    arr = _numeric(prediction)
    if arr.ndim != 0:
        raise PredictError(f"abs-error needs a scalar prediction, got shape {arr.shape}")
    value = float(arr.item())
    if not math.isfinite(value):
        return 1.0
    return min(abs(value - target), clip) / clip


LOSSES: Mapping[str, LossFn] = {
    "zero-one": zero_one,
    "cross-entropy": cross_entropy,
    "abs-error": abs_error,
}


def get_loss(name: str) -> LossFn:
    """The loss function registered as ``name`` (the application's ``loss`` setting)."""
    try:
        return LOSSES[name]
    except KeyError:
        raise ConfigError(f"unknown loss {name!r}; choose one of {sorted(LOSSES)}") from None


def _numeric(output: Any) -> _Array:
    """A model output as a numeric scalar or vector (size-1 arrays count as scalars)."""
    if isinstance(output, (str, bytes)):
        raise PredictError(f"model output {_short(output)} is not numeric")
    try:
        arr = np.squeeze(np.asarray(output))
    except (ValueError, TypeError) as exc:
        raise PredictError(f"model output {_short(output)} is not an array: {exc}") from exc
    if arr.dtype.kind not in "biuf" or arr.size == 0 or arr.ndim > 1:
        raise PredictError(
            f"expected class scores (a vector) or a number, got {_short(output)} "
            f"(dtype {arr.dtype}, shape {arr.shape})"
        )
    return arr


def _class_label(label: Any) -> int:
    """A client-supplied class label as an int; anything else is the client's error."""
    value = _scalar_label(label, "class label")
    if isinstance(value, float) and not value.is_integer():
        raise InvalidInput(f"a class label must be an integer, got {_short(label)}")
    return int(value)


def _real_label(label: Any) -> float:
    value = float(_scalar_label(label, "regression label"))
    if not math.isfinite(value):
        raise InvalidInput(f"a regression label must be finite, got {_short(label)}")
    return value


def _scalar_label(label: Any, what: str) -> int | float:
    if isinstance(label, (str, bytes)):
        raise InvalidInput(f"a {what} must be a number, got the string {_short(label)}")
    try:
        arr = np.asarray(label)
    except (ValueError, TypeError):
        arr = np.asarray(None)
    if arr.dtype.kind not in "biuf" or arr.size != 1:
        raise InvalidInput(f"a {what} must be one number, got {_short(label)}")
    value: int | float = arr.item()
    return value


def _check_in_range(target: int, classes: int) -> None:
    if not 0 <= target < classes:
        raise InvalidInput(f"label {target} is out of range for a model with {classes} classes")


def _probabilities(scores: _Array) -> _Floats:
    """Scores as a distribution: kept when already one, else softmaxed (max-shifted)."""
    values = scores.astype(np.float64)
    # Scores near the float limit may overflow the sum or the max-shift; the overflow is
    # harmless (an infinite sum is no distribution, exp(-inf) is 0), so do not warn.
    with np.errstate(over="ignore"):
        if np.all(values >= 0.0) and abs(float(values.sum()) - 1.0) <= _PROB_SUM_TOLERANCE:
            return values
        return _softmax(values)


def _softmax(values: _Floats) -> _Floats:
    shifted = np.exp(values - values.max())
    result: _Floats = shifted / shifted.sum()
    return result


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --- queries and answers ----------------------------------------------------------------


@dataclass(frozen=True)
class QueryInfo:
    """What a policy may know about one query."""

    context: str  # the user or session whose state this is; DEFAULT_CONTEXT when none
    models: tuple[str, ...]  # the application's linked models, in config order
    selected: tuple[str, ...] | None = None  # what select() chose, when known


@dataclass(frozen=True)
class Combined:
    """The answer ``combine`` made from the predictions that arrived."""

    output: Any  # None when nothing arrived
    confidence: float  # in [0, 1]
    used: tuple[str, ...]  # the models whose predictions went into ``output``


_NOTHING = Combined(output=None, confidence=0.0, used=())


# --- policies -------------------------------------------------------------------------


class Policy(ABC):
    """Select, combine, observe. Subclasses set ``name`` and, for options, ``defaults``."""

    name: ClassVar[str] = "custom"
    defaults: ClassVar[Mapping[str, float]] = {}

    def __init__(self, **options: Any) -> None:
        self.options = _resolve_options(self.name, self.defaults, options)
        self._validate()

    def _validate(self) -> None:
        """Check ``self.options`` beyond their type; raise ConfigError."""
        return None

    def init(self, models: Sequence[str]) -> State:
        """A fresh state for these models. Per-model entries are dicts keyed by model name,
        which is what lets ``reconcile`` carry them across a change of linked models."""
        return {
            "policy": self.name,
            "models": list(models),
            "feedback": {m: 0 for m in models},
            "loss_sum": {m: 0.0 for m in models},
            "rounds": 0,
        }

    def state_problem(self, state: State) -> str | None:
        """Why a stored ``state`` cannot be used (one of ``init``'s fields has the wrong
        type or shape), or None. Fields ``init`` does not make (a subclass's) are not
        judged, and a missing field is filled by ``reconcile``."""
        return _shape_problem(state, _BASE_STATE)

    def reconcile(self, state: State, models: Sequence[str]) -> State:
        """The state after models were linked or unlinked: known entries kept, new ones
        initialised, unlinked ones dropped. Returns a new state.

        The runtime calls this before every use of a stored state, so keys that ``init``
        does not create (a subclass's own bookkeeping) are carried over untouched.
        """
        fresh = self.init(models)
        for key, old in state.items():
            new = fresh.get(key)
            if isinstance(new, dict) and isinstance(old, dict):
                fresh[key] = {m: copy.deepcopy(old.get(m, v)) for m, v in new.items()}
            elif key not in ("policy", "models"):
                fresh[key] = copy.deepcopy(old)
        return fresh

    @abstractmethod
    def select(self, state: State, query: QueryInfo, rng: np.random.Generator) -> tuple[str, ...]:
        """The models to ask for this query."""

    @abstractmethod
    def combine(self, state: State, query: QueryInfo, predictions: Mapping[str, Any]) -> Combined:
        """One answer from the predictions that arrived (missing models are left out)."""

    def observe(
        self,
        state: State,
        query: QueryInfo,
        label: Any,
        predictions: Mapping[str, Any],
        loss: LossFn,
    ) -> State:
        """A new state after feedback ``label``; ``state`` itself is left untouched."""
        # Every loss is computed before anything is written, so a malformed label raises
        # InvalidInput with no half-applied update.
        losses = _losses(query, label, predictions, loss)
        new = copy.deepcopy(state)
        _count(new, losses)
        self._learn(new, query, losses)
        return new

    def _learn(self, state: State, query: QueryInfo, losses: Mapping[str, float]) -> None:
        """Update ``state`` (a private copy) from per-model losses; by default, nothing."""
        return None


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value: Any) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def _per_model(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, dict) and all(
        isinstance(k, str) and check(v) for k, v in value.items())


_StateShape = Mapping[str, tuple[Callable[[Any], bool], str]]
_BASE_STATE: _StateShape = {
    "policy": (lambda v: isinstance(v, str), "a policy name"),
    "models": (lambda v: isinstance(v, list) and all(isinstance(m, str) for m in v),
               "a list of model names"),
    "feedback": (_per_model(_is_count), "a count per model"),
    "loss_sum": (_per_model(_is_number), "a number per model"),
    "rounds": (_is_count, "a count"),
}
_WEIGHTED_STATE: _StateShape = {
    **_BASE_STATE, "log_weights": (_per_model(_is_number), "a number per model")}


def _shape_problem(state: State, shape: _StateShape) -> str | None:
    for key, (fits, what) in shape.items():
        if key in state and not fits(state[key]):
            return f"its {key!r} is {_short(state[key])}, not {what}"
    return None


def _resolve_options(
    name: str, defaults: Mapping[str, float], given: Mapping[str, Any]
) -> dict[str, float]:
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        valid = f"valid options: {sorted(defaults)}" if defaults else "it takes no options"
        raise ConfigError(f"policy {name!r} has no option(s) {unknown}; {valid}")
    resolved = dict(defaults)
    for key, value in given.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"policy {name!r} option {key} must be a number, got {value!r}")
        resolved[key] = float(value)
    return resolved


def _losses(
    query: QueryInfo, label: Any, predictions: Mapping[str, Any], loss: LossFn
) -> dict[str, float]:
    """Each linked model's loss on this query, for the models that answered."""
    losses = {}
    for model in dict.fromkeys(query.models):
        if model in predictions:
            value = float(loss(predictions[model], label))
            # A custom loss outside [0, 1] would break the bandits' step sizes; NaN is the
            # worst case rather than a free pass.
            losses[model] = 1.0 if math.isnan(value) else min(max(value, 0.0), 1.0)
    return losses


def _count(state: State, losses: Mapping[str, float]) -> None:
    feedback = state.setdefault("feedback", {})
    loss_sum = state.setdefault("loss_sum", {})
    for model, value in losses.items():
        feedback[model] = int(feedback.get(model, 0)) + 1
        loss_sum[model] = float(loss_sum.get(model, 0.0)) + value
    state["rounds"] = int(state.get("rounds", 0)) + 1


def _passthrough(chosen: Sequence[str], predictions: Mapping[str, Any]) -> Combined:
    """The chosen model's answer, unchanged, or nothing if it did not arrive."""
    if not chosen or chosen[0] not in predictions:
        return _NOTHING
    return Combined(output=predictions[chosen[0]], confidence=1.0, used=(chosen[0],))


class SinglePolicy(Policy):
    """Ask the first linked model; feedback is only counted (for metrics)."""

    name = "single"

    def select(self, state: State, query: QueryInfo, rng: np.random.Generator) -> tuple[str, ...]:
        return query.models[:1]

    def combine(self, state: State, query: QueryInfo, predictions: Mapping[str, Any]) -> Combined:
        chosen = query.models[:1] if query.selected is None else query.selected[:1]
        return _passthrough(chosen, predictions)


class _WeightedPolicy(Policy):
    """Log-weights per model, max-shifted to 0 and floored at log(min_weight)."""

    def init(self, models: Sequence[str]) -> State:
        state = super().init(models)
        state["log_weights"] = {m: 0.0 for m in models}
        return state

    def state_problem(self, state: State) -> str | None:
        return _shape_problem(state, _WEIGHTED_STATE)

    def reconcile(self, state: State, models: Sequence[str]) -> State:
        # A newly linked model (often a new version) starts level with the current best:
        # it must be asked to earn its weight, and feedback corrects it quickly.
        fresh = super().reconcile(state, models)
        old = state.get("log_weights") or {}
        start = max((float(old[m]) for m in models if m in old), default=0.0)
        fresh["log_weights"] = self._normalised({m: float(old.get(m, start)) for m in models})
        return fresh

    def _validate(self) -> None:
        eta, min_weight = self.options["eta"], self.options["min_weight"]
        if not 0.0 < eta < math.inf:
            raise ConfigError(f"policy {self.name!r}: eta must be > 0, got {eta}")
        if not 1e-12 <= min_weight < 1.0:
            raise ConfigError(
                f"policy {self.name!r}: min_weight must be in [1e-12, 1), got {min_weight}"
            )

    def _log_weights(self, state: State, models: Sequence[str]) -> _Floats:
        # Unknown models sit at 0, level with the best, as reconcile would place them.
        known = state.get("log_weights") or {}
        return np.array([float(known.get(m, 0.0)) for m in models], dtype=np.float64)

    def _relative_weights(self, state: State, models: Sequence[str]) -> dict[str, float]:
        """Weights of ``models`` scaled so that the largest among them is 1."""
        logs = self._log_weights(state, models)
        return dict(zip(models, np.exp(logs - logs.max()).tolist(), strict=True))

    def _penalise(self, state: State, steps: Mapping[str, float]) -> None:
        """w_i *= exp(-step_i) for each model in ``steps``, in log space."""
        logs = {m: float(v) for m, v in (state.get("log_weights") or {}).items()}
        for model, step in steps.items():
            logs[model] = logs.get(model, 0.0) - step
        state["log_weights"] = self._normalised(logs)

    def _normalised(self, logs: Mapping[str, float]) -> dict[str, float]:
        if not logs:
            return {}
        top, floor = max(logs.values()), math.log(self.options["min_weight"])
        return {m: max(v - top, floor) for m, v in logs.items()}


class Exp3Policy(_WeightedPolicy):
    """One model per query, drawn from p_i = (1 - gamma) w_i / sum(w) + gamma / K."""

    name = "exp3"
    defaults = {"eta": 0.1, "gamma": 0.05, "min_weight": 1e-3}

    def _validate(self) -> None:
        super()._validate()
        if not 0.0 < self.options["gamma"] <= 1.0:
            gamma = self.options["gamma"]
            raise ConfigError(f"policy 'exp3': gamma must be in (0, 1], got {gamma}")

    def probabilities(self, state: State, models: Sequence[str]) -> _Floats:
        """The chance that ``select`` asks each of ``models``."""
        gamma = self.options["gamma"]
        result: _Floats = (1.0 - gamma) * _softmax(self._log_weights(state, models))
        return result + gamma / len(models)

    def select(self, state: State, query: QueryInfo, rng: np.random.Generator) -> tuple[str, ...]:
        if not query.models:
            return ()
        p = self.probabilities(state, query.models)
        return (query.models[int(rng.choice(len(p), p=p))],)

    def combine(self, state: State, query: QueryInfo, predictions: Mapping[str, Any]) -> Combined:
        if query.selected is not None:
            return _passthrough(query.selected[:1], predictions)
        # Selection unknown: answer with the heaviest model that did answer.
        present = [m for m in query.models if m in predictions]
        if not present:
            return _NOTHING
        logs = self._log_weights(state, present)
        return _passthrough([present[int(np.argmax(logs))]], predictions)

    def _learn(self, state: State, query: QueryInfo, losses: Mapping[str, float]) -> None:
        eta = self.options["eta"]
        if not losses:
            return
        if query.selected is None:
            # Full information after all: a Hedge step for every model that answered.
            self._penalise(state, {m: eta * v for m, v in losses.items()})
            return
        # Only the asked model's loss is seen; dividing by its probability makes the
        # estimate unbiased. p is recomputed from the current state, which may have moved
        # since select(); the floor keeps any resulting error bounded.
        p = dict(zip(query.models, self.probabilities(state, query.models).tolist(), strict=True))
        steps = {m: eta * losses[m] / p[m] for m in query.selected if m in losses and m in p}
        self._penalise(state, steps)


class Exp4Policy(_WeightedPolicy):
    """All models per query; a weighted ensemble of those that arrived; Hedge updates."""

    name = "exp4"
    defaults = {"eta": 0.5, "min_weight": 1e-3}

    def select(self, state: State, query: QueryInfo, rng: np.random.Generator) -> tuple[str, ...]:
        return query.models

    def combine(self, state: State, query: QueryInfo, predictions: Mapping[str, Any]) -> Combined:
        asked = tuple(dict.fromkeys(query.models if query.selected is None else query.selected))
        # A NaN or infinite output is treated like a missing one rather than poisoning the
        # average; observe() still charges that model the full loss.
        present = [m for m in asked if m in predictions and _finite(predictions[m])]
        if not present:
            return _NOTHING
        weights = self._relative_weights(state, asked)
        output, agree = _ensemble({m: predictions[m] for m in present}, weights)
        return Combined(output, self._confidence(weights, asked, agree), tuple(present))

    def _confidence(
        self, weights: Mapping[str, float], asked: Sequence[str], agree: Sequence[str]
    ) -> float:
        # Divided by the weight of *all* asked models: missing models lower the confidence.
        return min(1.0, sum(weights[m] for m in agree) / sum(weights[m] for m in asked))

    def _learn(self, state: State, query: QueryInfo, losses: Mapping[str, float]) -> None:
        eta = self.options["eta"]
        self._penalise(state, {m: eta * v for m, v in losses.items()})


class RobustExp4Policy(Exp4Policy):
    """Exp4 whose confidence is the fraction of asked models agreeing with the answer."""

    name = "robust-exp4"

    def _confidence(
        self, weights: Mapping[str, float], asked: Sequence[str], agree: Sequence[str]
    ) -> float:
        return len(agree) / len(asked)


def _finite(output: Any) -> bool:
    return bool(np.all(np.isfinite(_numeric(output))))


def _ensemble(outputs: Mapping[str, Any], weights: Mapping[str, float]) -> tuple[Any, list[str]]:
    """The weighted answer, and the models whose own answer agrees with it.

    Score vectors of one length: average their probabilities. Integer labels (or vectors
    of differing lengths, reduced to their argmax): weighted vote. Floats: weighted mean,
    and every present model counts as agreeing.
    """
    arrays = {m: _numeric(o) for m, o in outputs.items()}
    kind = _ensemble_kind(list(arrays.values()))
    if kind == "value":
        values = {m: float(a.item()) for m, a in arrays.items()}
        return _weighted_mean(values, weights), list(arrays)
    classes = {m: predicted_class(a) for m, a in arrays.items()}
    if kind == "scores":
        winner = _average_vote(arrays, weights)
    else:
        winner = _weighted_vote(classes, weights)
    return winner, [m for m, c in classes.items() if c == winner]


def _ensemble_kind(arrays: Sequence[_Array]) -> str:
    vectors = [a for a in arrays if a.ndim == 1]
    floats = [a for a in arrays if a.ndim == 0 and a.dtype.kind == "f"]
    if floats and vectors:
        raise PredictError("cannot combine class scores with regression values")
    if floats:
        return "value"
    if len(vectors) == len(arrays) and len({a.size for a in vectors}) == 1:
        return "scores"
    return "labels"


def _weighted_mean(values: Mapping[str, float], weights: Mapping[str, float]) -> float:
    total = sum(weights[m] for m in values)
    return sum(weights[m] * v for m, v in values.items()) / total


def _average_vote(arrays: Mapping[str, _Array], weights: Mapping[str, float]) -> int:
    # Renormalising over present models is implicit: argmax ignores the overall scale.
    mixture = sum(weights[m] * _probabilities(a) for m, a in arrays.items())
    return int(np.argmax(mixture))


def _weighted_vote(classes: Mapping[str, int], weights: Mapping[str, float]) -> int:
    tally: dict[int, float] = {}
    for model, cls in classes.items():
        tally[cls] = tally.get(cls, 0.0) + weights[model]
    return min(tally, key=lambda c: (-tally[c], c))  # ties go to the smaller class


def weight_shares(state: State) -> dict[str, float]:
    """Each model's normalised weight (summing to 1), for metrics; {} for weightless states."""
    logs = state.get("log_weights") or {}
    if not logs:
        return {}
    shares = _softmax(np.array([float(v) for v in logs.values()], dtype=np.float64))
    return dict(zip(logs, shares.tolist(), strict=True))


# --- the registry -----------------------------------------------------------------------

POLICIES: Mapping[str, type[Policy]] = {
    cls.name: cls for cls in (SinglePolicy, Exp3Policy, Exp4Policy, RobustExp4Policy)
}
_METHODS = ("init", "select", "combine", "observe")


def make_policy(name: str, options: Mapping[str, Any] | None = None) -> Policy:
    """A built-in policy by name, or a user's class from ``python:pkg.mod:Class``."""
    opts = dict(options or {})
    if name in POLICIES:
        return POLICIES[name](**opts)
    if ":" in name:
        return _custom_policy(name, opts)
    raise ConfigError(
        f"unknown policy {name!r}; choose one of {sorted(POLICIES)} or python:pkg.mod:Class"
    )


def _custom_policy(spec: str, options: dict[str, Any]) -> Policy:
    factory = _import_target(spec)
    try:
        policy = factory(**options)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"policy {spec} could not be created with {options}: {exc}") from exc
    if isinstance(policy, Policy):
        return policy
    missing = [m for m in _METHODS if not callable(getattr(policy, m, None))]
    if missing:
        raise ConfigError(f"policy {spec} lacks the method(s) {missing}")
    return _DuckPolicy(policy)


def _import_target(spec: str) -> Any:
    module_name, _, attr = spec.removeprefix("python:").partition(":")
    if not module_name or not attr:
        raise ConfigError(f"policy {spec!r}: expected python:pkg.mod:Class")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigError(f"policy {spec}: cannot import {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(f"policy {spec}: {module_name!r} has no {attr!r}") from None
    if not callable(target):
        raise ConfigError(f"policy {spec}: {attr!r} is not a class")
    return target


class _DuckPolicy(Policy):
    """Adapts an object that has the policy methods but is not a ``Policy`` subclass."""

    def __init__(self, inner: Any) -> None:
        self.options = {}
        self._inner = inner

    def init(self, models: Sequence[str]) -> State:
        state: State = self._inner.init(models)
        return state

    def state_problem(self, state: State) -> str | None:
        # Its state is its own: judged only if it says how.
        if not callable(getattr(self._inner, "state_problem", None)):
            return None
        problem: str | None = self._inner.state_problem(state)
        return problem

    def reconcile(self, state: State, models: Sequence[str]) -> State:
        if not callable(getattr(self._inner, "reconcile", None)):
            return super().reconcile(state, models)
        new: State = self._inner.reconcile(state, models)
        return new

    def select(self, state: State, query: QueryInfo, rng: np.random.Generator) -> tuple[str, ...]:
        return tuple(self._inner.select(state, query, rng))

    def combine(self, state: State, query: QueryInfo, predictions: Mapping[str, Any]) -> Combined:
        result: Combined = self._inner.combine(state, query, predictions)
        return result

    def observe(
        self,
        state: State,
        query: QueryInfo,
        label: Any,
        predictions: Mapping[str, Any],
        loss: LossFn,
    ) -> State:
        new: State = self._inner.observe(state, query, label, predictions, loss)
        return new
