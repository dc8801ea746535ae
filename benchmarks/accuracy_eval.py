"""Accuracy of coded redundancy, measured on outputs: the pure part of ``benchmarks.accuracy``.

Nothing here knows about torch or files: a model is any ``predict(batch) -> outputs``
callable on numpy arrays, so the unit tests drive every function with synthetic data.

Metrics (ParM, Kosaian et al. SOSP'19, section 5):

* ``A_a``, available accuracy: the deployed model's own accuracy.
* ``A_d``, degraded-mode accuracy: accuracy of the predictions the code *rebuilds* when
  a prediction of the group is unavailable.
* ``A_o = (1 - f) A_a + f A_d``: overall accuracy when a fraction ``f`` of predictions is
  unavailable and rebuilt.
* The default-prediction lower bound: unavailable predictions answered with a fixed default
  (the test set's most common class), ``(1 - f) A_a + f * majority_rate``.

ApproxIFER (Soleymani et al., AAAI'22): K queries are Berrut-encoded into N + 1 coded
queries, the unchanged model runs on each, S random workers straggle (or, with S = 0, E
random workers return outputs corrupted by Gaussian noise of scale sigma) and the K outputs
are decoded from the rest; all K answers are approximations, so accuracy is over all K.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from parityserve.core.coding import (
    AdditionEncoder,
    BerrutCode,
    ConcatEncoder,
    SubtractionDecoder,
    SystematicBerrut,
    berrut_weights,
)
from parityserve.core.redundancy import softmax_subtraction

__all__ = [
    "ByzantineTrial",
    "Predict",
    "accuracy",
    "berrut_decode_stragglers",
    "byzantine_trial",
    "coded_outputs",
    "default_bound",
    "groupings",
    "majority_rate",
    "mean_spread",
    "overall_accuracy",
    "parity_queries",
    "parm_degraded",
    "softmax",
    "straggler_trial",
    "systematic_outputs",
    "systematic_trial",
]

Predict = Callable[[np.ndarray], np.ndarray]


# --- metrics --------------------------------------------------------------------------------


def accuracy(outputs: np.ndarray, labels: np.ndarray) -> float:
    """Top-1 accuracy of ``outputs`` (..., C) against integer ``labels`` (...)."""
    outputs, labels = np.asarray(outputs), np.asarray(labels)
    if outputs.shape[:-1] != labels.shape:
        raise ValueError(f"outputs {outputs.shape} do not match labels {labels.shape}")
    if labels.size == 0:
        raise ValueError("no predictions to score")
    return float(np.mean(outputs.argmax(axis=-1) == labels))


def overall_accuracy(a_available: float, a_degraded: float,
                     fractions: Sequence[float] | np.ndarray) -> np.ndarray:
    """``A_o = (1 - f) A_a + f A_d`` for each unavailable fraction ``f`` in [0, 1]."""
    f = np.asarray(fractions, dtype=np.float64)
    if np.any((f < 0) | (f > 1)):
        raise ValueError("unavailable fractions must lie in [0, 1]")
    result: np.ndarray = (1.0 - f) * a_available + f * a_degraded
    return result


def default_bound(a_available: float, default_rate: float,
                  fractions: Sequence[float] | np.ndarray) -> np.ndarray:
    """Overall accuracy when unavailable predictions get a default answer instead.

    ``default_rate`` is how often the default is right: ``1 / classes`` for a random class,
    the majority class's share for the most common class.
    """
    return overall_accuracy(a_available, default_rate, fractions)


def majority_rate(labels: np.ndarray, num_classes: int) -> tuple[int, float]:
    """The most common class and its share of ``labels``: the best fixed default answer."""
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=num_classes)
    if counts.sum() == 0:
        raise ValueError("no labels")
    best = int(np.argmax(counts))
    return best, float(counts[best] / counts.sum())


def mean_spread(values: Sequence[float] | np.ndarray) -> dict[str, float | int]:
    """Mean, sample standard deviation (0 for one value), min and max of repeated trials."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        raise ValueError("no trials")
    return {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else 0.0,
            "min": float(v.min()), "max": float(v.max()), "n": int(v.size)}


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64)
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    out: np.ndarray = z / z.sum(axis=-1, keepdims=True)
    return out


# --- groupings ------------------------------------------------------------------------------


def groupings(n: int, k: int, count: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``count`` random partitions of ``range(n)`` into groups of ``k``: arrays ``(n // k, k)``.

    The ``n % k`` samples left over by each shuffle are not used in that grouping.
    """
    if k < 1 or n < k or count < 1:
        raise ValueError(f"cannot make {count} groupings of {n} samples into groups of {k}")
    usable = n // k * k
    return [rng.permutation(n)[:usable].reshape(-1, k) for _ in range(count)]


def _batched(predict: Predict, inputs: np.ndarray, batch: int) -> np.ndarray:
    parts = [np.asarray(predict(inputs[i:i + batch])) for i in range(0, len(inputs), batch)]
    return np.concatenate(parts)


# --- ApproxIFER -----------------------------------------------------------------------------


def coded_outputs(predict: Predict, x: np.ndarray, groups: np.ndarray,
                  code: BerrutCode | SystematicBerrut, *, batch: int = 2048) -> np.ndarray:
    """The model's outputs on every worker's coded query: ``(groups, n_workers, C)``.

    Encoding is ``code.encode`` for all groups at once (one matrix product per grouping).
    """
    queries = x[groups]  # (G, K, ...)
    flat = queries.reshape(len(groups), groups.shape[1], -1).astype(np.float64)
    if isinstance(code, SystematicBerrut):
        nodes, data_nodes = code.nodes, code.alpha
    else:
        nodes, data_nodes = code.beta, code.alpha
    weights = berrut_weights(data_nodes, nodes)  # (n_workers, K)
    coded = np.einsum("wk,gkd->gwd", weights, flat).astype(x.dtype)
    coded = coded.reshape(len(groups) * code.n_workers, *x.shape[1:])
    out = _batched(predict, coded, batch)
    return out.reshape(len(groups), code.n_workers, *out.shape[1:])


def berrut_decode_stragglers(code: BerrutCode, outputs: np.ndarray, stragglers: int,
                             rng: np.random.Generator) -> np.ndarray:
    """Drop ``stragglers`` random workers per group, decode the K outputs from the rest.

    ``outputs`` is ``(G, n_workers, C)``; returns ``(G, K, C)``. The decode is Berrut
    interpolation through the answering workers' nodes, as ``code.decode`` does.
    """
    groups, workers = outputs.shape[:2]
    if not 0 <= stragglers <= workers - code.needed:
        raise ValueError(f"{stragglers} stragglers leave fewer than {code.needed} of {workers}")
    decoded = np.empty((groups, code.K, *outputs.shape[2:]))
    for g in range(groups):
        used = np.sort(rng.permutation(workers)[: workers - stragglers])
        weights = berrut_weights(code.beta[used], code.alpha)
        decoded[g] = np.tensordot(weights, outputs[g, used], axes=(1, 0))
    return decoded


def straggler_trial(code: BerrutCode, outputs: np.ndarray, labels: np.ndarray, stragglers: int,
                    rng: np.random.Generator, *, space: str = "logits") -> float:
    """Accuracy of ApproxIFER's decoded outputs over all K queries of every group.

    ``space`` is where decoding happens: on the model's ``logits`` or on ``probs``
    (softmax of the logits).
    """
    if space not in ("logits", "probs"):
        raise ValueError(f"space must be logits or probs, got {space!r}")
    values = softmax(outputs) if space == "probs" else outputs
    return accuracy(berrut_decode_stragglers(code, values, stragglers, rng), labels)


@dataclass(frozen=True)
class ByzantineTrial:
    accuracy: float
    located: float  # share of the corrupted workers that the locator named


def byzantine_trial(code: BerrutCode, outputs: np.ndarray, labels: np.ndarray, sigma: float,
                    rng: np.random.Generator) -> ByzantineTrial:
    """E random workers per group return outputs plus N(0, sigma^2) noise; decode with the
    error locator (``code.decode_detailed``) and score all K outputs."""
    groups, workers = outputs.shape[:2]
    decoded = np.empty((groups, code.K, *outputs.shape[2:]))
    found = 0
    for g in range(groups):
        bad = rng.choice(workers, size=code.E, replace=False)
        values = outputs[g].astype(np.float64)
        values[bad] += sigma * rng.standard_normal(values[bad].shape)
        result = code.decode_detailed({w: values[w] for w in range(workers)})
        decoded[g] = result.outputs
        found += len(set(result.suspected) & {int(b) for b in bad})
    located = found / (groups * code.E) if code.E else 1.0
    return ByzantineTrial(accuracy(decoded, labels), located)


def systematic_outputs(predict: Predict, x: np.ndarray, groups: np.ndarray,
                       code: SystematicBerrut) -> np.ndarray:
    """Outputs of the K uncoded and S coded workers per group: ``(G, K + S, C)``."""
    return coded_outputs(predict, x, groups, code)


def systematic_trial(code: SystematicBerrut, outputs: np.ndarray, labels: np.ndarray,
                     rng: np.random.Generator) -> dict[str, Any]:
    """S random workers of K + S straggle; decode with ``code.decode``.

    Returns the accuracy over all K answers (``group``) and over the rebuilt ones only
    (``degraded``, the queries whose uncoded worker was among the stragglers; None when
    no uncoded worker straggled in any group), plus how many were rebuilt.
    """
    groups, workers = outputs.shape[:2]
    right_all = 0
    right_rebuilt = rebuilt = 0
    for g in range(groups):
        late = set(rng.choice(workers, size=code.S, replace=False).tolist())
        decoded = code.decode({w: outputs[g, w] for w in range(workers) if w not in late})
        hits = decoded.argmax(axis=-1) == labels[g]
        right_all += int(hits.sum())
        missing = [w for w in late if w < code.K]
        rebuilt += len(missing)
        right_rebuilt += int(hits[missing].sum())
    return {"group": right_all / labels.size,
            "degraded": right_rebuilt / rebuilt if rebuilt else None, "rebuilt": rebuilt}


# --- ParM -----------------------------------------------------------------------------------


def parity_queries(x: np.ndarray, groups: np.ndarray, encoder: str) -> np.ndarray:
    """The parity query of each group, ``(G, ...)``, from the core encoders."""
    k = groups.shape[1]
    if encoder == "addition":  # AdditionEncoder.encode, vectorised over the groups
        AdditionEncoder(k)  # validates k
        return np.asarray(x[groups].sum(axis=1), dtype=x.dtype)
    if encoder != "concat":
        raise ValueError(f"encoder must be addition or concat, got {encoder!r}")
    enc = ConcatEncoder(k)
    return np.stack([enc.encode(list(x[group])) for group in groups]).astype(x.dtype)


def parm_degraded(outputs: np.ndarray, parity_outputs: np.ndarray, groups: np.ndarray,
                  labels: np.ndarray, encoder: str, rng: np.random.Generator) -> float:
    """A_d: per group one random query is unavailable and rebuilt from the parity output.

    ``outputs`` are the deployed model's outputs on every sample (indexed by ``groups``),
    ``parity_outputs`` the parity model's output per group. Addition: the subtraction
    decoder on logits; concat: the softmax-subtraction decoder (probabilities).
    """
    k = groups.shape[1]
    lost = rng.integers(0, k, size=len(groups))
    right = 0
    decoder = SubtractionDecoder()
    for g, group in enumerate(groups):
        present = {i: outputs[group[i]] for i in range(k) if i != lost[g]}
        if encoder == "concat":
            rebuilt = softmax_subtraction(parity_outputs[g], list(present.values()), k)
        else:
            rebuilt = decoder.decode(present, parity_outputs[g], k)
        right += int(np.argmax(rebuilt) == labels[group[lost[g]]])
    return right / len(groups)
