"""Locating wrong answers among coded results: a Berlekamp-Welch locator for rational fits.

ApproxIFER (Soleymani et al.) tolerates E Byzantine workers the way Berlekamp-Welch decodes
Reed-Solomon codes, with rational functions in place of polynomials. Honest results are
(approximately) samples y_i = P(z_i) / Q(z_i) of a rational function of degree
``(degree, degree)`` at the worker nodes z_i; for a linear model the decoded Berrut
interpolant has exactly this form with ``degree = K - 1``. An error-locator polynomial
Lambda of degree E vanishes at the E corrupted nodes, so for *every* node

    Lambda(z_i) P(z_i) - y_i Lambda(z_i) Q(z_i) = 0.

With A = Lambda P and B = Lambda Q (both of degree ``degree + E``) this is linear and
homogeneous in the coefficients of A and B. We solve it as a total-least-squares problem:
the right singular vector of the smallest singular value. Where the corrupted values are far
from the honest fit, B = Lambda Q must (nearly) vanish at the corrupted nodes, so the E nodes
with the smallest |B(z_i)| are that coordinate's suspects.

Each output coordinate is fitted separately, then the coordinates vote. A vote is weighted by
the coordinate's confidence, the log ratio between the (E+1)-th and E-th smallest |B|: a
coordinate whose suspects stand out clearly (a strongly corrupted coordinate) outweighs many
coordinates the adversary did not touch, whose suspects are arbitrary.

Numerical choices: Chebyshev polynomials as the basis (well conditioned at Chebyshev nodes,
where a monomial basis is not), each coordinate centred by its median and scaled by its
median absolute deviation (robust to the corrupted values themselves) so that the two
blocks of the system are balanced, batched SVDs over blocks of coordinates.

Limits: the locator always names exactly E nodes, even when fewer are corrupted (then some
honest nodes are named, which only costs accuracy). For a nonlinear model the honest values
are only approximately rational, so a corruption no larger than that approximation error
(the model's own output scale) is not reliably found.
"""

from __future__ import annotations

import numpy as np
from numpy.polynomial import chebyshev

from parityserve.core.coding._arrays import FloatArray
from parityserve.errors import CodingError

__all__ = ["locate_rational_errors"]

_BLOCK = 1024  # coordinates per batched SVD: bounds memory at block * n * 2p floats
_TINY = np.finfo(np.float64).tiny
_ROUNDING = 1e-12  # relative spread below which a coordinate's values count as equal
_RANK_TOL = 1e-9  # relative singular value below which a direction counts as null


def locate_rational_errors(
    nodes: FloatArray, values: FloatArray, degree: int, errors: int
) -> tuple[int, ...]:
    """Positions (indices into ``nodes``) of the ``errors`` values that break the fit.

    ``values`` has shape ``(len(nodes), ...)``; every trailing coordinate is fitted by a
    rational function of degree ``(degree, degree)`` in the node. Needs at least
    ``2 * (degree + errors + 1)`` nodes, the number of unknown coefficients.
    """
    _check_locator_args(nodes, values, degree, errors)
    if errors == 0:
        return ()
    flat = values.reshape(len(nodes), -1)
    basis = chebyshev.chebvander(nodes, degree + errors)
    votes = np.zeros(len(nodes))
    for start in range(0, flat.shape[1], _BLOCK):
        scores, determined = _locator_magnitudes(basis, _normalise(flat[:, start : start + _BLOCK]))
        votes += _weighted_votes(scores, errors, determined)
    # A stable sort breaks ties by position, so the answer is deterministic.
    return tuple(sorted(int(i) for i in np.argsort(-votes, kind="stable")[:errors]))


def _check_locator_args(nodes: FloatArray, values: FloatArray, degree: int, errors: int) -> None:
    if nodes.ndim != 1 or values.shape[:1] != nodes.shape:
        raise CodingError(f"got {values.shape[:1]} values for {nodes.shape} nodes")
    if degree < 0 or errors < 0:
        raise CodingError(f"degree and errors must be >= 0, got {degree} and {errors}")
    unknowns = 2 * (degree + errors + 1)
    if errors and len(nodes) < unknowns:
        raise CodingError(
            f"locating {errors} errors in a degree-{degree} rational fit needs {unknowns} "
            f"results, got {len(nodes)}"
        )
    if not (np.all(np.isfinite(nodes)) and np.all(np.isfinite(values))):
        raise CodingError("the error locator needs finite nodes and values")


def _normalise(block: FloatArray) -> FloatArray:
    """Centre each coordinate on its median and scale it by its median absolute deviation.

    The median statistics ignore the (minority of) corrupted values, so the honest values
    end up of order one and the two halves of the linear system are balanced. A coordinate
    whose honest values are all equal (to rounding) has MAD 0; it is only centred.
    """
    centred = block - np.median(block, axis=0)
    spread = np.median(np.abs(centred), axis=0)
    # A spread at rounding level (honest values equal up to an ulp) is no spread: scaling
    # by it would blow rounding noise up into a signal that outvotes the real corruption.
    floor = _ROUNDING * np.max(np.abs(block), axis=0)
    return centred / np.where(spread > floor, spread, 1.0)


def _locator_magnitudes(basis: FloatArray, block: FloatArray) -> tuple[FloatArray, FloatArray]:
    """|B(z_i)| / max_i |B(z_i)| for each coordinate: shape ``(coordinates, nodes)``, and
    whether each coordinate's system determines B at all.

    Row i of coordinate c's system is ``[T(z_i), -y_ic T(z_i)]`` against the coefficients
    ``[a; b]`` of A and B in the Chebyshev basis T. When the two smallest singular values
    are both (numerically) zero, the null space has more than one direction and the chosen
    B is arbitrary: a coordinate the adversary did not touch whose honest values are all
    equal (K = 1, or a constant output) is like that, and must not vote.
    """
    count = block.shape[1]
    width = basis.shape[1]
    left = np.broadcast_to(basis, (count, *basis.shape))
    right = -block.T[:, :, np.newaxis] * basis[np.newaxis, :, :]
    _, sv, vh = np.linalg.svd(np.concatenate([left, right], axis=2), full_matrices=False)
    magnitudes = np.abs(vh[:, -1, width:] @ basis.T)
    scaled: FloatArray = magnitudes / np.maximum(magnitudes.max(axis=1, keepdims=True), _TINY)
    determined: FloatArray = (sv[:, -2] > _RANK_TOL * sv[:, 0]).astype(np.float64)
    return scaled, determined


def _weighted_votes(scores: FloatArray, errors: int, determined: FloatArray) -> FloatArray:
    """Each coordinate votes for its ``errors`` smallest scores, weighted by confidence
    (zero for a coordinate whose locator is not determined)."""
    order = np.argsort(scores, axis=1, kind="stable")
    ranked = np.take_along_axis(scores, order, axis=1)
    ratio = np.log((ranked[:, errors] + _TINY) / (ranked[:, errors - 1] + _TINY))
    confidence = ratio * determined
    votes = np.zeros(scores.shape[1])
    np.add.at(votes, order[:, :errors].ravel(), np.repeat(confidence, errors))
    return votes
