"""One pass over a decoded JSON value: its nesting depth, its leaf count and its leaf types.

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

from parityserve.errors import LimitExceeded

__all__ = ["Leaves", "depth_error", "scan"]

_CONTAINERS = (list, dict)


@dataclass(frozen=True, slots=True)
class Leaves:
    """What a value holds below its containers: leaf types, how many, and whether some list
    mixes lists with scalars (not a rectangular array)."""

    types: frozenset[type]
    count: int
    ragged: bool = False


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
        return Leaves(frozenset(types), len(value))
    leaf_types = types - {list, dict}
    ragged = bool(leaf_types)  # scalars beside lists: not a rectangular array
    count = sum(1 for x in items if type(x) not in _CONTAINERS) if ragged else 0
    for item in items:
        if type(item) in _CONTAINERS:
            inner = _scan(item, max_depth, limit, budget - count, depth + 1)
            leaf_types |= inner.types
            count += inner.count
            ragged = ragged or inner.ragged
    _check_count(count, budget, limit)
    return Leaves(frozenset(leaf_types), count, ragged)


def _check_count(count: int, budget: int, limit: int) -> None:
    if count > budget:
        raise LimitExceeded(f"more than max_input_elements = {limit} values in one input")
