"""ParM parity codes (Kosaian, Rashmi, Venkataraman, SOSP'19).

ParM groups k queries, encodes them into a parity query and sends that to a *parity model*
trained so that its output on the parity query approximates the sum of the deployed
model's outputs. When one prediction of the group is late or lost, the decoder rebuilds it
from the parity output and the outputs that did arrive.

* ``AdditionEncoder``: the parity query is the sum of the k queries.
* ``ConcatEncoder``: for images, the k queries downsampled and tiled into one image of the
  original shape (the paper's image encoder, for k = 2 and k = 4).
* ``LinearCode``: r general linear parities, decoded by least squares; it tolerates up to r
  missing outputs. ``LinearCode.addition(k)`` is the sum code.
* ``SubtractionDecoder``: the decoder of the sum code, missing = parity - sum(present).

Exactness. For a linear model without bias, f(x) = W x, a parity is exact:
f(sum_i c_i x_i) = sum_i c_i f(x_i), so decoding recovers f(x_missing) up to rounding. An
affine model f(x) = W x + b already breaks this, since f(sum_i x_i) = sum_i f(x_i) - (k-1) b,
and a neural network breaks it completely. ParM does not evaluate f on the parity: it
evaluates a learned parity model whose training target is exactly sum_i c_i f(x_i), so the
offsets and nonlinearity are learned there. This module is the algebra only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from parityserve.core.coding._arrays import (
    Array,
    FloatArray,
    all_finite,
    check_indices,
    result_dtype,
    stack_items,
    stack_queries,
)
from parityserve.errors import CodingError

__all__ = ["AdditionEncoder", "ConcatEncoder", "LinearCode", "SubtractionDecoder"]

Tile = tuple[slice, slice]


class AdditionEncoder:
    """ParM's sum encoder: the parity query of a coding group is the sum of its queries."""

    def __init__(self, k: int) -> None:
        self._k = _check_group_size(k)

    @property
    def k(self) -> int:
        return self._k

    def encode(self, queries: Sequence[Array]) -> Array:
        """Sum 1..k same-shaped queries.

        A short group (fewer than k queries, e.g. at the end of a burst) is treated as padded
        with zero queries, which add nothing to the sum; the decoder must then be given the
        model's output on a zero query for each padded position.
        """
        arrays = _as_arrays(queries)
        fast = _combine([[1.0] * len(arrays)], arrays, self._k)
        if fast is not None:
            parity: Array = fast[0]
            return parity
        summed: Array = _group(queries, self._k).sum(axis=0)
        return summed.astype(result_dtype(arrays))


class ConcatEncoder:
    """ParM's image encoder: k downsampled images tiled into one image of the same shape.

    k = 2 halves each image's width and places the two side by side; k = 4 halves both
    height and width and tiles the four images 2x2 in row-major order. Downsampling is
    average pooling. Accepted layouts: ``(C, H, W)`` (channels first), ``(H, W)``, and a flat
    square image such as MNIST's 784 pixels (read as 28x28 and returned flat again).

    Odd sizes: the first slot along an odd axis gets ``ceil(n / 2)`` pixels and the second
    ``floor(n / 2)``. Each slot averages the image over near-equal bins (the partition of
    ``np.array_split``: widths differ by at most one), so no pixel is dropped and a constant
    image stays constant. For even sizes this is exactly 2x2 (or 1x2) stride-2 pooling.
    """

    def __init__(self, k: int) -> None:
        if k not in (2, 4):
            raise CodingError(f"ConcatEncoder supports k = 2 or k = 4, got k = {k}")
        self._k = k

    @property
    def k(self) -> int:
        return self._k

    def encode(self, queries: Sequence[Array]) -> Array:
        """Tile 1..k same-shaped images; empty slots of a short group stay zero."""
        stacked = _group(queries, self._k)
        layout = stacked.shape[1:]
        images = _as_images(stacked)
        tiled = np.zeros(images.shape[1:])
        for image, (rows, cols) in zip(images, self.tile_slices(*images.shape[-2:]), strict=False):
            tiled[:, rows, cols] = _pool(image, _span(rows), _span(cols))
        return tiled.reshape(layout).astype(result_dtype(_as_arrays(queries)))

    def tile_slices(self, height: int, width: int) -> tuple[Tile, ...]:
        """Where query i lands in the ``(H, W)`` plane: ``(row slice, column slice)``."""
        min_height = 2 if self._k == 4 else 1
        if height < min_height or width < 2:
            raise CodingError(
                f"a {height}x{width} image is too small to hold {self._k} downsampled tiles"
            )
        cols = _halves(width)
        if self._k == 2:
            return tuple((slice(0, height), col) for col in cols)
        return tuple((row, col) for row in _halves(height) for col in cols)


class LinearCode:
    """r linear parities of k queries: ``parity_j = sum_i coefficients[j, i] * query_i``.

    Any set of missing outputs no larger than the number of parity outputs that arrived is
    rebuilt by least squares, provided the coefficient submatrix has full column rank.
    """

    def __init__(self, coefficients: npt.ArrayLike) -> None:
        matrix = np.array(coefficients, dtype=np.float64)
        if matrix.ndim != 2 or 0 in matrix.shape:
            raise CodingError(f"coefficients must be a non-empty (r, k) matrix, got {matrix.shape}")
        if not np.all(np.isfinite(matrix)):
            raise CodingError("coefficients contain NaN or infinite values")
        matrix.setflags(write=False)
        self._c = matrix

    @classmethod
    def addition(cls, k: int) -> LinearCode:
        """ParM's sum code: one parity, all coefficients 1; decoding is a subtraction."""
        return cls(np.ones((1, _check_group_size(k))))

    @classmethod
    def default(cls, k: int, r: int) -> LinearCode:
        """Row j is ``[1, 2, ..., k] ** j`` (row 0 is the sum).

        This is a transposed Vandermonde matrix on the distinct positive nodes 1..k, which
        is totally positive: *every* square submatrix is nonsingular. So any m <= r missing
        outputs are recoverable from any m parity outputs that arrive. Entries grow like
        k ** (r - 1), which is harmless for the small r (1 to 4) that coding groups use.
        """
        if r < 1:
            raise CodingError(f"a linear code needs r >= 1 parities, got r = {r}")
        nodes = np.arange(1, _check_group_size(k) + 1, dtype=np.float64)
        return cls(nodes[np.newaxis, :] ** np.arange(r)[:, np.newaxis])

    @property
    def coefficients(self) -> FloatArray:
        """The (r, k) matrix, read-only."""
        return self._c

    @property
    def k(self) -> int:
        return int(self._c.shape[1])

    @property
    def r(self) -> int:
        return int(self._c.shape[0])

    def encode(self, queries: Sequence[Array]) -> Array:
        """The r parity queries, shape ``(r, ...)``; a short group is zero-padded."""
        arrays = _as_arrays(queries)
        fast = _combine(self._c[:, : len(arrays)].tolist(), arrays, self.k)
        if fast is not None:
            return fast
        stacked = _group(queries, self.k)
        parities = np.tensordot(self._c[:, : len(stacked)], stacked, axes=(1, 0))
        return parities.astype(result_dtype(arrays))

    def decode(
        self,
        outputs: Mapping[int, Array],
        parity_outputs: Mapping[int, Array],
        missing: Sequence[int],
    ) -> dict[int, Array]:
        """Rebuild the ``missing`` outputs from the present ones and the parity outputs.

        Solves ``C[avail, missing] @ Y_missing = P - C[avail, present] @ Y_present`` by
        least squares; with more parity outputs than missing ones the extra equations
        average out rounding (or a parity model's approximation error).
        """
        lost = self._check_positions(outputs, missing)
        if not lost:
            return {}
        avail = self._check_parities(parity_outputs, len(lost))
        if len(lost) == 1 and len(avail) == 1:  # the common case: one late output, one parity
            fast = self._decode_one(outputs, parity_outputs[avail[0]], avail[0], lost[0])
            if fast is not None:
                return {lost[0]: fast}
        parities = stack_items(parity_outputs, "parity output")
        present = _stack_like(outputs, parities.shape[1:])
        rhs = _flat(parities) - self._c[np.ix_(avail, sorted(outputs))] @ _flat(present)
        solved = _solve(self._c[np.ix_(avail, lost)], rhs, lost)
        dtype = result_dtype(_as_arrays(outputs.values(), parity_outputs.values()))
        shape = parities.shape[1:]
        return {idx: solved[row].reshape(shape).astype(dtype) for row, idx in enumerate(lost)}

    def _decode_one(self, outputs: Mapping[int, Array], parity: Array, row: int,
                    lost: int) -> Array | None:
        """One equation, one unknown: ``(P - sum_i c_i y_i) / c_lost``, or None (slow path).

        No stacking and no least-squares solve; the answer equals the general path's.
        """
        c = self._c[row]
        if c[lost] == 0:
            return None  # rank deficient: the general path says so
        keys = sorted(outputs)
        arrays = [np.asarray(parity), *(np.asarray(outputs[i]) for i in keys)]
        combined = _combine([[1.0, *(-float(c[i]) for i in keys)]], arrays, len(arrays))
        if combined is None:
            return None
        out: Array = combined[0]
        if c[lost] != 1.0:
            np.divide(out, c[lost], out=out, dtype=out.dtype)
            if not all_finite(out):
                return None
        return out

    def _check_positions(self, outputs: Mapping[int, Array], missing: Sequence[int]) -> list[int]:
        # Every position must be accounted for exactly once: a position that is neither
        # given nor listed as missing would otherwise be silently treated as zero.
        check_indices(outputs, self.k, "output")
        check_indices(missing, self.k, "missing output")
        lost = [int(i) for i in missing]
        if len(set(lost)) != len(lost):
            raise CodingError(f"missing outputs {lost} contain duplicates")
        both = sorted(set(lost) & set(outputs))
        if both:
            raise CodingError(f"outputs {both} are both given and listed as missing")
        unknown = sorted(set(range(self.k)) - set(lost) - set(outputs))
        if unknown:
            raise CodingError(f"outputs {unknown} are neither given nor listed as missing")
        return lost

    def _check_parities(self, parity_outputs: Mapping[int, Array], lost: int) -> list[int]:
        check_indices(parity_outputs, self.r, "parity output")
        if lost > len(parity_outputs):
            raise CodingError(
                f"{lost} outputs are missing but only {len(parity_outputs)} parity outputs "
                "arrived; a linear code rebuilds at most as many outputs as it has parities"
            )
        return sorted(int(j) for j in parity_outputs)


class SubtractionDecoder:
    """Decoder of ParM's sum code (r = 1): missing output = parity output - sum(present)."""

    def decode(self, outputs: Mapping[int, Array], parity_output: Array, k: int) -> Array:
        """The one output of positions ``0..k-1`` not present in ``outputs``.

        A plain subtraction rather than a least-squares solve: for the all-ones code it is
        the exact solution, and it adds no rounding beyond the sum itself.
        """
        check_indices(outputs, _check_group_size(k), "output")
        absent = sorted(set(range(k)) - set(outputs))
        if len(absent) != 1:
            raise CodingError(
                f"the sum code rebuilds exactly one missing output; {len(absent)} of {k} are "
                "missing"
            )
        keys = sorted(outputs)
        arrays = [np.asarray(parity_output), *(np.asarray(outputs[i]) for i in keys)]
        fast = _combine([[1.0] + [-1.0] * len(keys)], arrays, len(arrays))
        if fast is not None:
            missing: Array = fast[0]
            return missing
        parity = stack_items({0: parity_output}, "parity output")
        present = _stack_like(outputs, parity.shape[1:])
        rebuilt: Array = parity[0] - present.sum(axis=0)
        return rebuilt.astype(result_dtype(_as_arrays([parity_output], outputs.values())))


def _as_arrays(*groups: Iterable[Array]) -> list[Array]:
    return [np.asarray(item) for group in groups for item in group]


def _combine(coefficients: list[list[float]], arrays: Sequence[Array], k: int
             ) -> Array | None:
    """The hot path of encoding and decoding: ``coefficients @ arrays`` without a stack.

    Accumulates straight from the inputs into the result's own dtype (``result_dtype``:
    float32 for float32 queries, so no float64 copy of the group is made and memory traffic
    is what a plain numpy sum costs), then checks the *result* for NaN and infinity instead
    of every input: a non-finite input always makes a non-finite result. With float32 inputs
    each step rounds to float32, which adds at most k - 1 float32 roundings; the inputs carry
    that much rounding already. Returns None whenever the inputs are unusual (mixed shapes,
    non-numeric dtypes, more than k of them, a non-finite result), so that the caller's
    validating path runs and raises its precise error.
    """
    if not arrays or len(arrays) > k:
        return None
    shape, dtype = arrays[0].shape, arrays[0].dtype
    same = True
    for a in arrays:
        if a.shape != shape or a.dtype.kind not in "fiu":
            return None
        same = same and a.dtype == dtype
    if not (same and dtype in _FLOATS):
        dtype = result_dtype(arrays)
    out = np.empty((len(coefficients), *shape), dtype=dtype)
    for row, acc in zip(coefficients, out, strict=True):
        _accumulate(acc, row, arrays)
    return out if all_finite(out) else None


_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _accumulate(acc: Array, coefs: list[float], arrays: Sequence[Array]) -> None:
    # dtype= makes every ufunc compute in the accumulator's precision (uint8 pixels must not
    # wrap around before they are cast). No shortcut for a zero coefficient: 0 * NaN is NaN,
    # so a bad input is still caught.
    dt = acc.dtype
    start = 1
    if len(arrays) > 1 and coefs[0] == 1.0 and coefs[1] in (1.0, -1.0):
        op = np.add if coefs[1] == 1.0 else np.subtract
        op(arrays[0], arrays[1], out=acc, dtype=dt)
        start = 2
    elif coefs[0] == 1.0:
        np.copyto(acc, arrays[0], casting="unsafe")
    else:
        np.multiply(arrays[0], coefs[0], out=acc, dtype=dt)
    for c, a in zip(coefs[start:], arrays[start:], strict=True):
        if c == 1.0:
            np.add(acc, a, out=acc, dtype=dt)
        elif c == -1.0:
            np.subtract(acc, a, out=acc, dtype=dt)
        else:
            np.add(acc, np.multiply(a, c, dtype=dt), out=acc, dtype=dt)


def _check_group_size(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise CodingError(f"a coding group needs k >= 1 queries, got k = {k!r}")
    return int(k)


def _group(queries: Sequence[Array], k: int) -> FloatArray:
    # Short groups are allowed (padding with zero queries is implicit), long ones are a bug.
    if len(queries) > k:
        raise CodingError(f"a coding group holds at most k = {k} queries, got {len(queries)}")
    return stack_queries(queries)


def _stack_like(outputs: Mapping[int, Array], shape: tuple[int, ...]) -> FloatArray:
    """Stack the present outputs and check they match the parity outputs' shape."""
    if not outputs:
        return np.zeros((0, *shape))
    stacked = stack_items(outputs, "output")
    if stacked.shape[1:] != shape:
        raise CodingError(f"outputs have shape {stacked.shape[1:]}, parity outputs {shape}")
    return stacked


def _flat(stacked: FloatArray) -> FloatArray:
    # An explicit width, not -1: a stack of zero outputs has no size to infer it from.
    return stacked.reshape(len(stacked), math.prod(stacked.shape[1:]))


def _solve(matrix: FloatArray, rhs: FloatArray, lost: list[int]) -> FloatArray:
    # lstsq goes through the SVD: no explicit inverse, and the reported rank tells a
    # rank-deficient system (whose answer would be arbitrary) from a solvable one.
    solution, _, rank, _ = np.linalg.lstsq(matrix, rhs, rcond=None)
    if rank < matrix.shape[1]:
        raise CodingError(
            f"cannot rebuild outputs {lost}: the parity equations that arrived have rank "
            f"{rank} < {matrix.shape[1]}"
        )
    return solution


def _halves(length: int) -> tuple[slice, slice]:
    middle = math.ceil(length / 2)
    return slice(0, middle), slice(middle, length)


def _span(part: slice) -> int:
    return int(part.stop) - int(part.start)


def _as_images(stacked: FloatArray) -> FloatArray:
    """View a stack of queries as ``(n, C, H, W)`` images."""
    n, layout = len(stacked), stacked.shape[1:]
    if len(layout) == 1 and math.isqrt(layout[0]) ** 2 == layout[0] and layout[0] >= 4:
        side = math.isqrt(layout[0])
        return stacked.reshape(n, 1, side, side)
    if len(layout) == 2:
        return stacked.reshape(n, 1, *layout)
    if len(layout) == 3:
        return stacked
    raise CodingError(
        f"ConcatEncoder needs (C, H, W), (H, W) or a flat square image, got shape {layout}"
    )


def _pool(image: FloatArray, height: int, width: int) -> FloatArray:
    return _pool_axis(_pool_axis(image, 1, height), 2, width)


def _pool_axis(x: FloatArray, axis: int, size: int) -> FloatArray:
    """Average ``x`` along ``axis`` over ``size`` contiguous bins of near-equal width."""
    length = x.shape[axis]
    widths = np.full(size, length // size)
    widths[: length % size] += 1
    starts = np.concatenate(([0], np.cumsum(widths)[:-1]))
    shape = [1] * x.ndim
    shape[axis] = size
    pooled: FloatArray = np.add.reduceat(x, starts, axis=axis) / widths.reshape(shape)
    return pooled
