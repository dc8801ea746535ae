"""Turning decoded JSON inputs into arrays that match a model's signature."""

from __future__ import annotations

from typing import Any

import numpy as np

from parityserve.config import TensorSpec
from parityserve.errors import InvalidInput
from parityserve.runtime.v2 import datatype_to_dtype

__all__ = ["coerce_item", "shape_matches"]

def shape_matches(shape: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    """Shapes match when ranks agree and every non-wildcard (-1) dimension is equal."""
    return len(shape) == len(expected) and all(
        e == -1 or s == e for s, e in zip(shape, expected, strict=True))


def coerce_item(item: Any, spec: TensorSpec | None, *, where: str) -> Any:
    """One query's input as an array of the model's dtype and shape, or InvalidInput.

    Models that declare no signature receive the decoded JSON value unchanged.
    """
    if spec is None:
        return item
    if spec.datatype == "BYTES":
        return item
    try:
        array = np.asarray(item, dtype=datatype_to_dtype(spec.datatype))
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidInput(f"{where}: input is not a {spec.datatype} tensor ({exc})") from exc
    if not shape_matches(array.shape, spec.shape):
        raise InvalidInput(f"{where}: expected input shape {list(spec.shape)}, "
                           f"got {list(array.shape)}")
    return array
