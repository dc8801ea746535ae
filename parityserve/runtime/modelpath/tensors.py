"""Turning decoded JSON inputs into arrays that match a model's signature."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from parityserve.config import TensorSpec
from parityserve.core.inputs import Leaves, as_array, check_leaves, scan
from parityserve.datatypes import datatype_to_dtype
from parityserve.errors import InvalidInput
from parityserve.runtime.modelpath.edge_array import EdgeArray
from parityserve.runtime.workers.wire import MAX_DIMS

__all__ = ["coerce_item", "shape_matches"]


def shape_matches(shape: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    """Shapes match when ranks agree and every non-wildcard (-1) dimension is equal."""
    return len(shape) == len(expected) and all(
        e == -1 or s == e for s, e in zip(shape, expected, strict=True))


def coerce_item(item: Any, spec: TensorSpec | None, *, where: str,
                allow_nonfinite: bool = False, leaves: Leaves | None = None,
                json_arrays: bool = True) -> Any:
    """One query's input as an array of the model's dtype and shape, or InvalidInput.

    Models that declare no signature accept any JSON value (a python: model may take strings
    or objects); with ``json_arrays`` (the deployment's ``json_inputs: arrays``) a rectangular
    list of numbers still becomes one array, else the value is passed on as decoded. A declared
    numeric signature means a rectangular array of JSON numbers (booleans for BOOL), finite for
    float types unless the deployment sets ``allow_nonfinite``.
    """
    if isinstance(item, EdgeArray):
        item, leaves = _from_edge(item, spec, json_arrays)
    if spec is None:
        return _no_signature(item, leaves) if json_arrays else item
    if spec.datatype == "BYTES":
        return item
    dtype = datatype_to_dtype(spec.datatype)
    if not isinstance(item, np.ndarray):
        check_leaves(leaves or _leaves(item), dtype, spec.datatype, where)
    try:
        with np.errstate(over="ignore"):  # 1e39 as FP32 is infinity: refused just below
            array = np.asarray(item, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidInput(f"{where}: input is not a {spec.datatype} tensor ({exc})") from exc
    if not shape_matches(array.shape, spec.shape):
        raise InvalidInput(f"{where}: expected input shape {list(spec.shape)}, "
                           f"got {list(array.shape)}")
    if dtype.kind in "fc" and not allow_nonfinite and not np.isfinite(array).all():
        raise InvalidInput(f"{where}: the input holds non-finite values (NaN, infinity, or a "
                           f"number too large for {spec.datatype}); set allow_nonfinite: true "
                           "on the deployment to accept NaN and infinity")
    return array


def _from_edge(item: EdgeArray, spec: TensorSpec | None, json_arrays: bool
               ) -> tuple[Any, Leaves | None]:
    """The edge's array where the general path makes the same array of it (no signature with
    ``json_arrays``, or a float signature: one rounding from the same exact values); the JSON
    value as decoded where the model takes Python values or range-checks integers."""
    if spec is None and json_arrays or (
            spec is not None and spec.datatype != "BYTES"
            and datatype_to_dtype(spec.datatype).kind == "f"):
        return item.array, item.leaves
    return item.as_decoded(), None


def _no_signature(item: Any, leaves: Leaves | None) -> Any:
    """A no-signature input: numbers become one array here, once, so that the cache digest,
    the feedback memory and the wire never walk the list (core/inputs.py ``as_array``)."""
    if type(item) is not list:  # scalars, strings, objects: nothing to stack
        return item
    # One rank is left for the batch axis, within what a worker accepts over the wire.
    return as_array(item, leaves or _leaves(item), max_ndim=MAX_DIMS - 1)


def _leaves(item: Any) -> Leaves:
    # Limits were enforced where the body was read; this pass only reads leaf types.
    return scan(item, max_depth=sys.maxsize, max_elements=sys.maxsize)

