"""ApproxIFER: approximate coded inference with Berrut rational interpolation.

Soleymani, Ali, Mahdavifar, Avestimehr, "ApproxIFER: A Model-Agnostic Approach to Resilient
and Robust Prediction Serving Systems" (AAAI'22). Unlike ParM it needs no trained parity
model: K queries x_j are placed at the data nodes alpha_j (Chebyshev points of the first
kind), the Berrut interpolant u(z) through (alpha_j, x_j) is evaluated at N + 1 worker nodes
beta_i (Chebyshev points of the second kind), and every worker runs the *unchanged* model on
its coded query u(beta_i). Results from any ``needed`` workers are interpolated again, over
the beta_i that answered, and evaluated at the alpha_j: since u(alpha_j) = x_j, the value
there approximates f(x_j).

Why Berrut: its rational interpolant r(z) = sum_m w_m f_m / (z - z_m) / sum_m w_m / (z - z_m)
with alternating weights w_m = (-1)^m (over the nodes sorted) has no poles on the real line
for *any* set of distinct nodes, so decoding from whichever workers happen to be fastest is
always well-posed, with no ill-conditioned Vandermonde solve. Its accuracy is only O(h) in
the node spacing h, so the decode is approximate even for a linear model: more workers
(denser nodes) give a better answer, and losing adjacent nodes near an end (extrapolation
towards an alpha_j) gives a worse one.

Policies chosen here:
* K = 1 is allowed. With a single data node the interpolant is constant, so every coded
  query is the query itself: replication, decoded exactly.
* A result with NaN or inf is dropped, like a straggler, when enough results remain;
  otherwise ``CodingError`` names the offending workers. Decoding never returns NaN.
* With E > 0 the E located workers are excluded and the rest (at least 2K + E) are used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from parityserve.core.coding._arrays import (
    Array,
    FloatArray,
    check_indices,
    finite_items,
    result_dtype,
    stack_items,
    stack_queries,
)
from parityserve.core.coding.locator import locate_rational_errors
from parityserve.errors import CodingError

__all__ = [
    "BerrutCode",
    "BerrutDecoding",
    "SystematicBerrut",
    "berrut_interpolate",
    "berrut_weights",
    "chebyshev_first_kind",
    "chebyshev_second_kind",
    "minimum_workers",
]

_DECODERS = ("interpolate", "subtract")

# A point within this distance of a node (relative to the nodes' magnitude) takes that
# node's value instead of dividing by a (near-)zero difference.
_NODE_TOL = 64 * np.finfo(np.float64).eps


def chebyshev_first_kind(count: int) -> FloatArray:
    """The data nodes alpha_j = cos((2j + 1) pi / (2 count)), j = 0..count-1 (decreasing)."""
    j = np.arange(count, dtype=np.float64)
    return np.cos((2.0 * j + 1.0) * np.pi / (2.0 * count))


def chebyshev_second_kind(n: int) -> FloatArray:
    """The worker nodes beta_i = cos(i pi / n), i = 0..n (decreasing); n = 0 gives [1]."""
    if n == 0:
        return np.ones(1)
    return np.cos(np.arange(n + 1, dtype=np.float64) * np.pi / n)


def berrut_weights(nodes: npt.ArrayLike, points: npt.ArrayLike) -> FloatArray:
    """The ``(len(points), len(nodes))`` matrix M with ``interpolant(points) = M @ values``.

    Rows sum to one (Berrut's interpolant reproduces constants exactly). A point on a node
    gets a one-hot row, which makes the interpolant exact at the nodes.
    """
    z = _check_nodes(nodes)
    at = np.atleast_1d(np.asarray(points, dtype=np.float64))
    if at.ndim != 1 or not np.all(np.isfinite(at)):
        raise CodingError("interpolation points must be a finite 1-D array")
    diff = at[:, np.newaxis] - z[np.newaxis, :]
    hit = np.abs(diff) <= _NODE_TOL * max(1.0, float(np.max(np.abs(z))))
    terms = _alternating_signs(z) / np.where(hit, 1.0, diff)
    on_node = hit.any(axis=1)
    terms[on_node] = hit[on_node]
    weights: FloatArray = terms / terms.sum(axis=1, keepdims=True)
    return weights


def berrut_interpolate(nodes: npt.ArrayLike, values: Array, points: npt.ArrayLike) -> FloatArray:
    """Berrut's interpolant through ``(nodes[m], values[m])`` evaluated at ``points``.

    ``values`` has shape ``(len(nodes), ...)``; the result has ``(len(points), ...)``: each
    trailing coordinate is interpolated on its own, with the same weights.
    """
    data = np.asarray(values, dtype=np.float64)
    weights = berrut_weights(nodes, points)
    if data.shape[:1] != (weights.shape[1],):
        raise CodingError(f"got {data.shape[:1]} values for {weights.shape[1]} nodes")
    flat = weights @ data.reshape(len(data), -1)
    return flat.reshape(len(weights), *data.shape[1:])


@dataclass(frozen=True, slots=True)
class BerrutDecoding:
    """A decode and what went into it, so a caller can flag reconstructions honestly.

    ``outputs`` has shape ``(K, ...)``; ``used`` are the workers interpolated through,
    ``suspected`` those the error locator excluded, ``non_finite`` those dropped for NaN/inf.
    """

    outputs: Array
    used: tuple[int, ...]
    suspected: tuple[int, ...]
    non_finite: tuple[int, ...]


class BerrutCode:
    """ApproxIFER's code: K queries, tolerating S stragglers and E Byzantine workers.

    There are ``n_workers = N + 1`` workers. The fewest that tolerate S stragglers and E
    errors (``minimum_workers``) are K + S when E = 0 and 2(K + E) + S otherwise; ``workers``
    may ask for more. Decoding needs ``needed`` results: K when E = 0, and 2(K + E)
    otherwise, the number of unknowns of the error locator. A group waits for
    ``decode_at = n_workers - S`` of them: with the minimum that is ``needed``, and extra
    workers put more, denser nodes under the interpolation, which decodes more accurately.
    """

    def __init__(self, K: int, S: int = 0, E: int = 0, workers: int | None = None) -> None:
        _check_counts(K, S, E)
        self._k, self._s, self._e = K, S, E
        least = minimum_workers(K, S, E)
        if workers is None:
            workers = least
        if isinstance(workers, bool) or not isinstance(workers, int | np.integer) \
                or workers < least:
            raise CodingError(f"K={K}, S={S}, E={E} needs at least {least} workers, got "
                              f"{workers!r}")
        self._alpha = _frozen(chebyshev_first_kind(K))
        self._beta = _frozen(chebyshev_second_kind(int(workers) - 1))

    @property
    def K(self) -> int:  # the paper's names: K queries, S stragglers, E errors
        return self._k

    @property
    def S(self) -> int:
        return self._s

    @property
    def E(self) -> int:
        return self._e

    @property
    def n_workers(self) -> int:
        return len(self._beta)

    @property
    def needed(self) -> int:
        return self._k if self._e == 0 else 2 * (self._k + self._e)

    @property
    def decode_at(self) -> int:
        """How many results a group waits for: all but the S stragglers it tolerates."""
        return self.n_workers - self._s

    @property
    def alpha(self) -> FloatArray:
        """Data nodes, read-only."""
        return self._alpha

    @property
    def beta(self) -> FloatArray:
        """Worker nodes, read-only; worker i gets the coded query at ``beta[i]``."""
        return self._beta

    def encode(self, queries: Sequence[Array] | Array) -> Array:
        """The ``n_workers`` coded queries, shape ``(N + 1, ...)``, from exactly K queries."""
        data = _k_queries(queries, self._k)
        coded = berrut_interpolate(self._alpha, data, self._beta)
        return coded.astype(result_dtype([np.asarray(q) for q in queries]))

    def decode(self, results: Mapping[int, Array]) -> Array:
        """Approximations of the K outputs, shape ``(K, ...)``, from worker results."""
        return self.decode_detailed(results).outputs

    def decode_detailed(self, results: Mapping[int, Array]) -> BerrutDecoding:
        """``decode`` with a record of which workers were used, excluded and dropped.

        All results given are used (the runtime passes the fastest ones), except those
        with NaN/inf and, when E > 0, the E workers the error locator names.
        """
        workers, values, dropped = self._usable(results)
        suspected = self._suspects(workers, values, self._e)
        keep = [m for m, worker in enumerate(workers) if worker not in suspected]
        outputs = berrut_interpolate(
            self._beta[[workers[m] for m in keep]], values[keep], self._alpha
        )
        return BerrutDecoding(
            outputs=outputs.astype(result_dtype(results[w] for w in workers)),
            used=tuple(workers[m] for m in keep),
            suspected=tuple(sorted(suspected)),
            non_finite=tuple(dropped),
        )

    def locate_errors(self, results: Mapping[int, Array], E: int | None = None) -> set[int]:
        """The workers whose results the Berlekamp-Welch-style locator finds wrong.

        ``E`` defaults to the code's own; at least ``2(K + E)`` finite results are needed.
        See ``parityserve.core.coding.locator`` for the algorithm.
        """
        errors = self._e if E is None else E
        if errors < 0:
            raise CodingError(f"E must be >= 0, got {errors}")
        check_indices(results, self.n_workers, "worker")
        if not results:
            raise CodingError("no results to check")
        values = stack_items(results, "worker result")
        return self._suspects(sorted(results), values, errors)

    def _usable(self, results: Mapping[int, Array]) -> tuple[list[int], FloatArray, list[int]]:
        """The finite results (workers ascending, stacked), and the workers dropped."""
        check_indices(results, self.n_workers, "worker")
        finite, dropped = finite_items(results)
        if len(finite) < self.needed:
            why = f"; workers {dropped} returned NaN or inf" if dropped else ""
            raise CodingError(
                f"Berrut decoding with K={self._k}, E={self._e} needs {self.needed} results, "
                f"got {len(finite)} usable{why}"
            )
        return sorted(finite), stack_items(finite, "worker result"), dropped

    def _suspects(self, workers: list[int], values: FloatArray, errors: int) -> set[int]:
        # The decoded interpolant of a linear model is rational of degree (K-1, K-1) in z.
        found = locate_rational_errors(self._beta[workers], values, self._k - 1, errors)
        return {workers[m] for m in found}


class SystematicBerrut:
    """Systematic ApproxIFER: K workers get the queries unchanged, S more get coded ones.

    The coded queries sit at S nodes that never coincide with a data node alpha_j: extrema
    cos(i pi / (mK)) of the Chebyshev polynomial T_mK for the smallest odd m with
    mK + 1 >= S (for odd m these are never zeros of T_K), S of them picked evenly across
    the grid. When all K originals arrive they are returned exactly. For the missing ones
    there are two decoders (``decoder``):

    * ``interpolate`` (the default): every result that arrived, originals at alpha_j and
      coded ones at their nodes, is interpolated and evaluated at the missing alpha_j. Good
      when the queries vary smoothly with the node (its error is O(1/K) there); on unrelated
      inputs, such as a group of MNIST digits, it mostly returns a neighbour's answer.
    * ``subtract``: ParM's decoder. Coded result i is f(sum_j W_ij x_j); if f were affine it
      would equal sum_j W_ij f(x_j), so the arrived originals' known contributions are
      subtracted and the missing f(x_j) solved for (least squares over the coded results that
      arrived). Exact for affine models (linear or logistic-regression scores); for a
      nonlinear model the error is divided by the missing query's small weight.

    Measured on the MNIST MLP at K = 8, S = 1 (``benchmarks/results/accuracy.md``), neither
    rebuilds a useful class (about 20-25% against 97.9% available): for a nonlinear
    classifier, treat a rebuilt answer as a placeholder, not a prediction.
    """

    def __init__(self, K: int, S: int, decoder: str = "interpolate") -> None:
        _check_counts(K, S, 0)
        if decoder not in _DECODERS:
            raise CodingError(f"decoder must be one of {', '.join(_DECODERS)}, got "
                              f"{decoder!r}")
        self._k, self._s, self._decoder = K, S, decoder
        self._alpha = _frozen(chebyshev_first_kind(K))
        self._coded = _frozen(_systematic_nodes(K, S))
        self._nodes = _frozen(np.concatenate([self._alpha, self._coded]))
        # Row i: coded query i's weight on each original (what ``encode`` multiplies by).
        self._mix = _frozen(berrut_weights(self._alpha, self._coded) if S else np.empty((0, K)))

    @property
    def K(self) -> int:
        return self._k

    @property
    def S(self) -> int:
        return self._s

    @property
    def n_workers(self) -> int:
        return self._k + self._s

    @property
    def needed(self) -> int:
        return self._k

    @property
    def alpha(self) -> FloatArray:
        return self._alpha

    @property
    def decoder(self) -> str:
        return self._decoder

    @property
    def coded_nodes(self) -> FloatArray:
        """Nodes of the S coded queries (workers K..K+S-1), read-only."""
        return self._coded

    @property
    def nodes(self) -> FloatArray:
        """Every worker's node in worker order: the alpha_j, then the coded nodes."""
        return self._nodes

    def encode(self, queries: Sequence[Array] | Array) -> Array:
        """Shape ``(K + S, ...)``: the K queries unchanged, then the S coded ones."""
        data = _k_queries(queries, self._k)
        coded = berrut_interpolate(self._alpha, data, self._coded)
        both = np.concatenate([data, coded])
        return both.astype(result_dtype([np.asarray(q) for q in queries]))

    def decode(self, results: Mapping[int, Array]) -> Array:
        """The K outputs: exact where the original arrived, rebuilt by ``decoder`` where not."""
        check_indices(results, self.n_workers, "worker")
        finite, dropped = finite_items(results)
        if len(finite) < self._k:
            why = f"; workers {dropped} returned NaN or inf" if dropped else ""
            raise CodingError(
                f"systematic decoding with K={self._k} needs {self._k} results, got "
                f"{len(finite)} usable{why}"
            )
        workers = sorted(finite)
        values = stack_items(finite, "worker result")
        missing = [j for j in range(self._k) if j not in finite]
        if missing and self._decoder == "subtract":
            outputs = self._subtract(workers, values, missing)
        else:
            outputs = berrut_interpolate(self._nodes[workers], values, self._alpha)
        for m, worker in enumerate(workers):
            if worker < self._k:
                outputs[worker] = values[m]  # originals are exact, not interpolated
        return outputs.astype(result_dtype(results[w] for w in workers))

    def _subtract(self, workers: list[int], values: FloatArray, missing: list[int]
                  ) -> FloatArray:
        """ParM-style: coded results minus the arrived originals' contributions, solved for
        the missing originals (rows of the result for arrived workers are filled later)."""
        rows = {w: m for m, w in enumerate(workers)}
        known = [j for j in range(self._k) if j in rows]
        coded = [w - self._k for w in workers if w >= self._k]
        flat = values.reshape(len(values), -1)
        rhs = flat[[rows[self._k + c] for c in coded]]
        if known:
            rhs = rhs - self._mix[np.ix_(coded, known)] @ flat[[rows[j] for j in known]]
        # As many coded results as missing originals (S stragglers at most): a square or
        # overdetermined system; lstsq also copes with a near-singular one.
        solved = np.linalg.lstsq(self._mix[np.ix_(coded, missing)], rhs, rcond=None)[0]
        outputs = np.zeros((self._k, flat.shape[1]))
        outputs[missing] = solved
        return outputs.reshape(self._k, *values.shape[1:])


def minimum_workers(K: int, S: int = 0, E: int = 0) -> int:
    """The fewest Berrut workers that tolerate S stragglers and E Byzantine workers."""
    return K + S if E == 0 else 2 * (K + E) + S


def _check_counts(K: int, S: int, E: int) -> None:
    for name, value, low in (("K", K, 1), ("S", S, 0), ("E", E, 0)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
            raise CodingError(f"{name} must be an integer >= {low}, got {value!r}")


def _check_nodes(nodes: npt.ArrayLike) -> FloatArray:
    z = np.atleast_1d(np.asarray(nodes, dtype=np.float64))
    if z.ndim != 1 or len(z) == 0 or not np.all(np.isfinite(z)):
        raise CodingError("interpolation nodes must be a non-empty, finite 1-D array")
    gaps = np.diff(np.sort(z))
    if np.any(gaps <= 2 * _NODE_TOL * max(1.0, float(np.max(np.abs(z))))):
        raise CodingError("interpolation nodes must be distinct")
    return z


def _alternating_signs(nodes: FloatArray) -> FloatArray:
    """(-1)^m over the nodes in sorted order, whatever order they are given in."""
    signs = np.empty(len(nodes))
    signs[np.argsort(nodes, kind="stable")] = (-1.0) ** np.arange(len(nodes))
    return signs


def _k_queries(queries: Sequence[Array] | Array, k: int) -> FloatArray:
    data = stack_queries(queries)
    if len(data) != k:
        raise CodingError(f"this code encodes exactly K = {k} queries, got {len(data)}")
    return data


def _systematic_nodes(k: int, s: int) -> FloatArray:
    if s == 0:
        return np.empty(0)
    m = 1
    while m * k + 1 < s:
        m += 2
    grid = chebyshev_second_kind(m * k)
    picks = np.floor((np.arange(s) + 0.5) * len(grid) / s).astype(np.intp)
    return grid[picks]


def _frozen(array: FloatArray) -> FloatArray:
    array.setflags(write=False)
    return array
