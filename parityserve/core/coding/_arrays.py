"""Input checks shared by the encoders and decoders.

Coding mixes every query of a group into every coded query, so one bad array (a NaN, a
wrong shape) silently spoils a whole group. These helpers reject such input early with a
``CodingError`` that names the offending item, instead of letting numpy broadcast or
propagate NaN into a plausible-looking answer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from parityserve.errors import CodingError

__all__ = [
    "Array",
    "FloatArray",
    "all_finite",
    "check_indices",
    "finite_items",
    "result_dtype",
    "stack_items",
    "stack_queries",
]

Array = npt.NDArray[Any]
FloatArray = npt.NDArray[np.floating[Any]]


def result_dtype(arrays: Iterable[Array]) -> np.dtype[Any]:
    """The floating dtype to hand results back in.

    The validating paths compute in float64; the parity hot path (``parity._combine``)
    accumulates directly in this dtype. Either way results go back in the inputs' own
    floating precision, at least float32 (float32 stays float32, uint8 pixels become
    float32, int64 becomes float64), so a model fed coded queries sees the precision it was
    built for.
    """
    return np.result_type(*(np.asarray(a).dtype for a in arrays), np.float32)


def stack_queries(queries: Sequence[Array] | Array, what: str = "query") -> FloatArray:
    """Stack same-shaped, finite arrays into one float64 array of shape ``(n, ...)``."""
    items = [np.asarray(q) for q in queries]
    if not items:
        raise CodingError(f"no {what} arrays given")
    return stack_items(dict(enumerate(items)), what)


def stack_items(items: Mapping[int, Array], what: str) -> FloatArray:
    """Stack the values of ``items`` (ordered by key) after checking shapes and values."""
    keys = sorted(items)
    arrays = [np.asarray(items[key]) for key in keys]
    shape = arrays[0].shape
    for key, array in zip(keys, arrays, strict=True):
        if array.shape != shape:
            raise CodingError(
                f"{what} {key} has shape {array.shape}, expected {shape} like {what} {keys[0]}"
            )
        if not np.issubdtype(array.dtype, np.number) or np.iscomplexobj(array):
            raise CodingError(f"{what} {key} has dtype {array.dtype}; a real number is needed")
        if not np.all(np.isfinite(array)):
            raise CodingError(f"{what} {key} contains NaN or infinite values")
    return np.stack(arrays).astype(np.float64, copy=False)


def finite_items(items: Mapping[int, Array]) -> tuple[dict[int, Array], list[int]]:
    """Split ``items`` into the finite ones and the keys of those holding NaN or inf."""
    good: dict[int, Array] = {}
    bad: list[int] = []
    for key in sorted(items):
        array = np.asarray(items[key])
        numeric = np.issubdtype(array.dtype, np.number) and not np.iscomplexobj(array)
        if numeric and np.all(np.isfinite(array)):
            good[key] = array
        elif numeric:
            bad.append(key)
        else:
            raise CodingError(f"result {key} has dtype {array.dtype}; a real number is needed")
    return good, bad


def check_indices(indices: Iterable[int], limit: int, what: str) -> None:
    """Every index must be an int in ``[0, limit)``."""
    for index in indices:
        if isinstance(index, bool) or not isinstance(index, int | np.integer):
            raise CodingError(f"{what} index {index!r} is not an integer")
        if not 0 <= index < limit:
            raise CodingError(f"{what} index {index} is out of range [0, {limit})")


def all_finite(x: Array) -> bool:
    """No NaN or infinity in ``x``. A dot product of x with itself is finite exactly when x
    is, barring overflow of the squares; it is several times cheaper than ``np.isfinite``
    (a BLAS reduction, and ``vdot`` flattens without a Python-level reshape), so the full
    check runs only when it is not finite."""
    return math.isfinite(np.vdot(x, x)) or bool(np.isfinite(x).all())
