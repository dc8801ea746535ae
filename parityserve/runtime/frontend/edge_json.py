"""Clipper predict bodies of plain numbers, decoded straight into numpy arrays (issue 17).

Why this exists: the general path (``orjson.loads``, then ``core/inputs.py`` ``scan`` and
``as_array``) makes one Python float per number, walks them for their types, copies them into an
array and frees them: about 50 us for one 784-float query, a fifth of the frontend's CPU per
request on the Clipper route. simdjson parses the body into its own tape and copies a numeric
array into one buffer without making a Python object per number (about 25 us for the same body,
checks included).

The rule that keeps it safe: ``decode_predict`` answers only where its result is what the
general path gives, and otherwise says None, so the body takes the general path and gets its
answer or its error from there. It answers for an object whose keys are ``input`` or
``input_batch`` (one of them) and optionally ``uid`` (a string), whose queries are non-empty
rectangular arrays of JSON numbers within the request limits, with every magnitude below 2**53
(so that ints mixed with floats are exact in float64). Everything else — strings, booleans,
null, objects, ragged or empty lists, duplicate keys, a byte-order mark, an oversize integer,
the limits crossed — is left to the general path.

A query decoded here travels as an ``EdgeArray`` to the router, whose coercion (``runtime/
tensors.py``) takes the array where the general path would have made the same one (a model
without a signature, ``json_inputs: arrays``; a float signature) and otherwise asks for the
JSON value as decoded (``as_decoded``: the body decoded again by the general path), so models
that want Python objects, or integer signatures with their range checks, see no difference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import simdjson

from parityserve.config import Limits
from parityserve.core.inputs import EXACT_IN_FLOAT64, Leaves
from parityserve.runtime.modelpath.edge_array import EdgeArray
from parityserve.runtime.workers.wire import MAX_DIMS

__all__ = ["PredictBody", "decode_predict"]

_KEYS = frozenset(("input", "input_batch", "uid"))
_FLOATS = frozenset((float,))
_INTS = frozenset((int,))
# What the simdjson proxies raise on a document or value this path does not take (invalid
# JSON, a string in a numeric array, an integer past 64 bits, a number past float64...).
_REFUSED = (ValueError, TypeError, RuntimeError, KeyError, IndexError)


@dataclass(frozen=True, slots=True)
class PredictBody:
    items: list[EdgeArray]
    batched: bool
    uid: str | None


def decode_predict(body: bytes, limits: Limits) -> PredictBody | None:
    """The queries of a Clipper predict body, or None where the general path must decide."""
    if body[:1] != b"{":  # leading whitespace or a byte-order mark: the general path
        return None
    try:
        return _decode(body, limits)
    except _REFUSED:
        return None


def _decode(body: bytes, limits: Limits) -> PredictBody | None:
    doc = simdjson.Parser().parse(body)
    if not isinstance(doc, simdjson.Object):
        return None
    keys = list(doc.keys())
    if len(set(keys)) != len(keys) or not _KEYS.issuperset(keys):
        return None
    batched = "input_batch" in keys
    if batched == ("input" in keys):
        return None
    uid = doc["uid"] if "uid" in keys else None  # (doc.get of a missing key costs 2 us)
    if uid is not None and (type(uid) is not str or not uid):
        return None
    key = "input_batch" if batched else "input"
    value = doc[key]
    if not isinstance(value, simdjson.Array):
        return None
    proxies = _batch(value, limits) if batched else [value]
    if proxies is None:
        return None
    items: list[EdgeArray] = []
    brackets = 1 if batched else 0
    # Every JSON value of the body counts (max_request_elements): the body, the uid, the
    # input_batch list, and each query's numbers and lists.
    room = limits.max_request_elements - 1 - (uid is not None) - brackets
    for index, proxy in enumerate(proxies):
        item = _item(proxy, limits, body, key, index if batched else None, room)
        if item is None:
            return None
        items.append(item)
        room -= item.array.size + item.leaves.containers
        brackets += item.leaves.containers
    # Every '[' of the body is one of the arrays just counted: a list nested where a number
    # was expected (which simdjson's flattening would hide) adds one. A '[' inside the uid
    # string adds one too; that body takes the general path, which is merely slower.
    if not _has_brackets(body, brackets):
        return None
    return PredictBody(items, batched, uid)


def _has_brackets(body: bytes, expected: int) -> bool:
    """Whether ``body`` holds exactly ``expected`` '['. One ``find`` per bracket: find is a
    memchr, several times faster than ``bytes.count`` over a body of numbers."""
    found, at = 0, body.find(b"[")
    while at >= 0:
        found += 1
        if found > expected:
            return False
        at = body.find(b"[", at + 1)
    return found == expected


def _batch(value: simdjson.Array, limits: Limits) -> list[Any] | None:
    count = len(value)
    if count == 0 or count > limits.max_batch_items:
        return None
    proxies = list(value)
    return proxies if all(isinstance(p, simdjson.Array) for p in proxies) else None


def _item(proxy: simdjson.Array, limits: Limits, body: bytes, key: str,
          index: int | None, room: int) -> EdgeArray | None:
    """One query, or None: past a limit (``room``: what ``max_request_elements`` leaves
    the request), the general path refuses it with the limit's name."""
    shape = _shape(proxy, room)
    if shape is None:
        return None
    count, lists = math.prod(shape), _brackets(shape)
    # The query's outermost list counts as depth 3, as in the router's scan.
    if (len(shape) > MAX_DIMS - 1 or len(shape) + 2 > limits.max_json_depth
            or not 0 < count <= limits.max_input_elements or count + lists > room):
        return None
    array = np.frombuffer(proxy.as_buffer(of_type="d"), dtype=np.float64)
    if array.size != count or not bool(np.abs(array).max() < EXACT_IN_FLOAT64):
        return None
    if _whole(array):  # written as ints, or as 2.0?
        ints = _as_ints(proxy)
        if ints is not None:
            return EdgeArray(ints.reshape(shape), Leaves(_INTS, count, containers=lists), body,
                             key, index)
    return EdgeArray(array.reshape(shape), Leaves(_FLOATS, count, containers=lists), body, key,
                     index)


def _whole(array: np.ndarray[Any, Any]) -> bool:
    # The first number settles most float inputs without a pass over the array.
    return float(array[0]).is_integer() and np.array_equal(array, np.trunc(array))


def _as_ints(proxy: simdjson.Array) -> np.ndarray[Any, Any] | None:
    """int64 when every number was written as an integer (what orjson makes ints)."""
    try:
        return np.frombuffer(proxy.as_buffer(of_type="i"), dtype=np.int64)
    except (TypeError, ValueError):  # some number was written as a float
        return None


def _shape(proxy: simdjson.Array, limit: int) -> tuple[int, ...] | None:
    """The shape of a rectangular nest of arrays (the leaves are checked by the caller), or
    None when some array's length differs from its siblings', or when its JSON values would
    be more than ``limit``: each array of the next depth is one and holds one at least, so
    that is known before any of them is made (a Python proxy each, 0.2 us)."""
    shape = [len(proxy)]
    rows, lists = [proxy], 1
    while shape[-1] and isinstance(first := rows[0][0], simdjson.Array):
        length = len(first)
        lists += len(rows) * shape[-1]
        if lists + len(rows) * shape[-1] > limit:
            return None
        children: list[Any] = []
        for row in rows:
            children.extend(row)
        if not all(isinstance(c, simdjson.Array) and len(c) == length for c in children):
            return None
        shape.append(length)
        rows = children
    return tuple(shape)


def _brackets(shape: tuple[int, ...]) -> int:
    """How many '[' a rectangular array of this shape is written with."""
    total, rows = 0, 1
    for length in shape:
        total += rows
        rows *= length
    return total
