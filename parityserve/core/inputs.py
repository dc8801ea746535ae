"""One pass over a decoded JSON value: its nesting depth, its leaf count and its leaf types;
and what that pass decides for a model that declares no input signature (``as_array``).

The request limits (``server.limits``) and the numeric checks share this pass, so a normal
body is walked once, at C speed: ``set(map(type, row))`` reads a flat row of numbers without a
Python-level loop, and only lists that hold containers are descended into.

orjson refuses documents nested deeper than 1024 on its own (``depth limit exceeded``); the
frontend translates that into the same ``LimitExceeded`` as ours, so ``max_json_depth`` (lower)
is the limit a client sees either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from parityserve.errors import LimitExceeded

__all__ = ["EXACT_IN_FLOAT64", "Leaves", "array_dtype", "as_array", "depth_error", "scan"]

_CONTAINERS = (list, dict)


@dataclass(frozen=True, slots=True)
class Leaves:
    """What a value holds below its containers: leaf types, how many, whether some list
    mixes lists with scalars (not a rectangular array), and whether some container is a JSON
    object (a dict: its values are leaves too, but it is no row of an array)."""

    types: frozenset[type]
    count: int
    ragged: bool = False
    objects: bool = False


def depth_error(limit: int) -> LimitExceeded:
    return LimitExceeded(f"JSON nesting deeper than max_json_depth = {limit}")


def scan(value: Any, *, max_depth: int, max_elements: int, depth: int = 1) -> Leaves:
    """Walk ``value`` found at nesting ``depth`` (the body itself is 1).

    Raises LimitExceeded when a container sits deeper than ``max_depth`` or the leaves number
    more than ``max_elements``.
    """
    return _scan(value, max_depth, max_elements, max_elements, depth)


def _scan(value: Any, max_depth: int, limit: int, budget: int, depth: int) -> Leaves:
    kind = type(value)
    if kind is not list and kind is not dict:
        return Leaves(frozenset((kind,)), 1)
    if depth > max_depth:
        raise depth_error(max_depth)
    items = value.values() if kind is dict else value
    types = set(map(type, items))
    if list not in types and dict not in types:
        _check_count(len(value), budget, limit)
        return Leaves(frozenset(types), len(value), objects=kind is dict)
    leaf_types = types - {list, dict}
    ragged = bool(leaf_types)  # scalars beside lists: not a rectangular array
    objects = kind is dict or dict in types
    count = sum(1 for x in items if type(x) not in _CONTAINERS) if ragged else 0
    for item in items:
        if type(item) in _CONTAINERS:
            inner = _scan(item, max_depth, limit, budget - count, depth + 1)
            leaf_types |= inner.types
            count += inner.count
            ragged = ragged or inner.ragged
            objects = objects or inner.objects
    _check_count(count, budget, limit)
    return Leaves(frozenset(leaf_types), count, ragged, objects)


def _check_count(count: int, budget: int, limit: int) -> None:
    if count > budget:
        raise LimitExceeded(f"more than max_input_elements = {limit} values in one input")


# ---- inputs of models without a signature ----------------------------------------------------
# Why arrays at the edge (issue 17): a JSON list of numbers kept as decoded travels the whole
# frontend as Python floats. The cache digest walks it (~23 us for 784 floats, ~4.5 us as an
# array), the feedback memory keeps it (freeing evicted lists cost ~11% of frontend CPU), and
# the wire sends it as msgpack instead of one raw frame. One conversion here serves them all.

_INTS = frozenset((int,))
_NUMBERS = frozenset((int, float))
EXACT_IN_FLOAT64 = 2**53  # integers up to this size survive a trip through float64


def array_dtype(value: Any, leaves: Leaves) -> type[np.int64] | type[np.float64] | None:
    """The dtype a decoded JSON input takes as an array, or None to keep it as decoded.

    ``leaves`` is ``scan(value)``. A non-empty list of numbers with no list beside a number
    and no JSON object in it is int64 when every leaf is an int, float64 when one is a float.
    Scalars, strings, null, booleans (exact types: bool is not int here), objects and empty
    lists stay as they are. Ragged lengths and ints past int64 only show in the conversion
    (``as_array`` keeps those too).
    """
    if type(value) is not list or not leaves.count or leaves.ragged or leaves.objects:
        return None
    if leaves.types == _INTS:
        return np.int64
    return np.float64 if leaves.types <= _NUMBERS else None


def as_array(value: Any, leaves: Leaves, *, max_ndim: int = 64) -> Any:
    """``value`` as one numpy array when ``array_dtype`` allows it and every number survives
    the conversion exactly (``as_array(v).tolist() == v``); otherwise ``value`` unchanged.

    ``max_ndim`` keeps deeper lists as they are (the wire carries arrays of bounded rank).
    """
    dtype = array_dtype(value, leaves)
    if dtype is None or _ndim(value) > max_ndim:
        return value
    try:
        array = np.array(value, dtype=dtype)
    except (OverflowError, ValueError):  # an int past int64 (or float64); ragged lengths
        return value
    if dtype is np.float64 and int in leaves.types and not _ints_exact(array, value):
        return value
    return array


def _ndim(value: Any) -> int:
    # The rank along the first elements; a ragged value fails in np.array anyway.
    ndim = 0
    while type(value) is list and value:
        value, ndim = value[0], ndim + 1
    return ndim


def _ints_exact(array: np.ndarray[Any, Any], value: list[Any]) -> bool:
    """Whether the ints of a mixed int/float list kept their exact values in float64: surely
    so when every magnitude is below 2**53 (one vectorised pass), else compare value by value
    (Python compares an int and a float exactly)."""
    if bool(np.abs(array).max() < EXACT_IN_FLOAT64):  # NaN compares False: the slow path decides
        return True
    return bool(array.tolist() == value)
