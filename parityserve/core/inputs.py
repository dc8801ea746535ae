"""One pass over a decoded JSON value: its nesting depth, its leaf count and its leaf types;
what that pass decides for a model that declares no input signature (``as_array``) and for a
numeric one (``check_leaves``); what a tensor's shape may claim before its data is read
(``element_count``, ``check_raw_size``); and how many values one request may make the frontend
decode one by one (``take_elements``).

The request limits (``server.limits``) and the numeric checks share this pass, so a normal
body is walked once, at C speed: ``set(map(type, row))`` reads a flat row of numbers without a
Python-level loop, and nested lists are walked a whole depth at a time.

orjson refuses documents nested deeper than 1024 on its own (``depth limit exceeded``); the
frontend translates that into the same ``LimitExceeded`` as ours, so ``max_json_depth`` (lower)
is the limit a client sees either way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

from parityserve.errors import InvalidInput, LimitExceeded

__all__ = ["BYTES_PREFIX", "EXACT_IN_FLOAT64", "Leaves", "array_dtype", "as_array",
           "check_leaves", "check_raw_size", "decoded_one_by_one", "depth_error",
           "element_count", "scan", "take_elements"]

_CONTAINERS = (list, dict)


@dataclass(frozen=True, slots=True)
class Leaves:
    """What a value holds below its containers: leaf types, how many, whether it has leaves at
    more than one depth (not a rectangular array), whether some container is a JSON object (a
    dict: its values are leaves too, but it is no row of an array), and how many lists and
    dicts it is made of (the value itself included: JSON values too, each a Python object)."""

    types: frozenset[type]
    count: int
    ragged: bool = False
    objects: bool = False
    containers: int = 0


def depth_error(limit: int) -> LimitExceeded:
    return LimitExceeded(f"JSON nesting deeper than max_json_depth = {limit}")


def scan(value: Any, *, max_depth: int, max_elements: int, depth: int = 1) -> Leaves:
    """Walk ``value`` found at nesting ``depth`` (the body itself is 1).

    Raises LimitExceeded when a container sits deeper than ``max_depth`` or the leaves number
    more than ``max_elements``.

    Level by level, not container by container: the children of every container at one depth
    are gathered with ``chain`` and typed with ``set(map(type, ...))``, both at C speed, so a
    list of 262,144 one-number lists (1 MiB of ``[0],``) takes a few C passes instead of one
    Python call per list (2.8 us each, 0.7 s, when this walk recursed; measured in-process).
    ``ragged`` is then "leaves at more than one depth", which no rectangular array has.
    """
    kind = type(value)
    if kind is not list and kind is not dict:
        return Leaves(frozenset((kind,)), 1)
    if kind is list and not _CONTAINER_TYPES.intersection(kinds := set(map(type, value))):
        _check_count(len(value), max_elements)  # a flat list: most queries
        return Leaves(frozenset(kinds), len(value), containers=1)
    level, has_dicts = [value], kind is dict
    types: set[type] = set()
    count, ragged, objects, containers = 0, False, has_dicts, 1
    while True:
        if depth > max_depth:
            raise depth_error(max_depth)
        items = _children(level, has_dicts)
        kinds = set(map(type, items))
        inner = kinds & _CONTAINER_TYPES
        if not inner:
            count += len(items)
            types |= kinds
            break
        level, has_dicts = [x for x in items if type(x) in _CONTAINER_TYPES], dict in inner
        objects = objects or has_dicts
        containers += len(level)
        if len(level) != len(items):  # scalars beside containers: not a rectangular array
            ragged = True
            count += len(items) - len(level)
            types |= kinds - _CONTAINER_TYPES
        _check_count(count, max_elements)
        depth += 1
    _check_count(count, max_elements)
    return Leaves(frozenset(types), count, ragged, objects, containers)


_CONTAINER_TYPES = frozenset(_CONTAINERS)


def _children(level: list[Any], has_dicts: bool) -> list[Any]:
    """The items of every list and the values of every dict in ``level``, in order."""
    if not has_dicts:
        return list(chain.from_iterable(level))
    return list(chain.from_iterable(c.values() if type(c) is dict else c for c in level))


def _check_count(count: int, limit: int) -> None:
    if count > limit:
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


# ---- what a numeric input may hold -------------------------------------------------------------
# One check for every route that turns JSON into numbers (the model routes, V2 JSON tensors and
# the graph routes): numpy would otherwise turn "1.5" into 1.5, true into 1.0 and null into NaN.

_LEAVES = {"f": frozenset((float, int)), "c": frozenset((float, int)), "i": frozenset((int,)),
           "u": frozenset((int,)), "b": frozenset((bool,))}
_TAKES = {"b": "booleans", "i": "integers", "u": "integers"}
_NAMES = {bool: "booleans", str: "strings", type(None): "null", float: "floats", int: "integers",
          dict: "objects"}


def check_leaves(leaves: Leaves, dtype: np.dtype[Any], datatype: str, where: str) -> None:
    """Raise InvalidInput unless every leaf ``scan`` found fits ``dtype``: numbers for float
    types (never strings, null or booleans), ints for integer types, booleans for BOOL, and no
    JSON object or list beside a number. Run it before numpy sees the value: ``np.array`` of
    one long string among short ones pads them all to its width (4 MB each for a 1 MB one)."""
    wrong = leaves.types - _LEAVES.get(dtype.kind, leaves.types)
    if leaves.objects:  # scan counts an object's values as leaves: numbers, maybe
        wrong |= {dict}
    if wrong or leaves.ragged:
        names = sorted(_NAMES.get(t, t.__name__) for t in wrong) or ["lists beside numbers"]
        raise InvalidInput(f"{where}: {datatype} data takes only "
                           f"{_TAKES.get(dtype.kind, 'numbers')}, got {', '.join(names)}")


# ---- shapes a client wrote ---------------------------------------------------------------------
# A V2 tensor's shape arrives before its data. Nothing may be sized by it until the data that
# fills it has been counted (issue 38: a 150-byte request whose BYTES shape said 2**30 elements
# made the frontend build 2**30 object pointers, 8 GiB, before reading its 4 data bytes).

BYTES_PREFIX = 4  # each binary BYTES element starts with its length, a little-endian uint32


def element_count(name: str, shape: Sequence[int], *, max_dims: int,
                  max_rows: int | None = None, max_per_row: int | None = None) -> int:
    """The elements a tensor of ``shape`` holds, from the shape alone: O(rank), nothing sized.

    Refuses a rank above ``max_dims`` before multiplying (a 16 MiB header holds 800,000 dims,
    whose product takes minutes), a negative size, and, when given, more than ``max_rows`` rows
    (the first axis) or more than ``max_per_row`` values per row.
    """
    if len(shape) > max_dims:
        raise InvalidInput(f"tensor {name!r} has {len(shape)} dimensions, more than {max_dims}")
    if any(d < 0 for d in shape):
        raise InvalidInput(f"tensor {name!r}: shape {list(shape)} has a negative size")
    rows = shape[0] if shape else 1
    if max_rows is not None and rows > max_rows:
        raise LimitExceeded(f"tensor {name!r} has {rows} rows, more than max_batch_items = "
                            f"{max_rows}")
    per_row = math.prod(shape[1:])
    if max_per_row is not None and per_row > max_per_row:
        raise LimitExceeded(f"tensor {name!r} has {per_row} values per row, more than "
                            f"max_input_elements = {max_per_row}")
    return rows * per_row


def check_raw_size(name: str, datatype: str, shape: Sequence[int], count: int,
                   itemsize: int | None, size: int) -> None:
    """Raise InvalidInput unless ``size`` raw bytes can hold ``count`` elements: exactly
    ``count * itemsize`` for a number type, at least ``BYTES_PREFIX`` per element for BYTES
    (``itemsize`` None), whose elements are then read one by one."""
    if itemsize is None:
        if count * BYTES_PREFIX > size:
            raise InvalidInput(f"tensor {name!r}: shape {list(shape)} of {datatype} needs at "
                               f"least {count * BYTES_PREFIX} bytes ({BYTES_PREFIX} per "
                               f"element), got {size}")
    elif count * itemsize != size:
        raise InvalidInput(f"tensor {name!r}: {size} bytes of data, but shape {list(shape)} of "
                           f"{datatype} needs {count * itemsize}")


# ---- what one request may make the frontend decode one value at a time ------------------------
# JSON values, BYTES elements and typed gRPC contents each become a Python object, at 0.1-0.5 us
# apiece, while the event loop answers nobody else; a numeric tensor sent as raw bytes is read
# in place (np.frombuffer) whatever its size. benchmarks/results/loop-block has the costs.


def decoded_one_by_one(datatype: str, *, raw: bool) -> bool:
    """Whether a tensor's elements count toward ``max_request_elements``: all of them unless
    it came as raw bytes (the binary extension, gRPC raw contents) of a number type."""
    return not raw or datatype == "BYTES"


def take_elements(taken: int, count: int, *, limit: int, what: str) -> int:
    """``taken + count``: the request's values decoded one by one so far, with the ``count``
    of ``what`` ("tensor 'x'", "the body"); raises LimitExceeded past ``limit``. Callers count
    from a shape before decoding where there is one, and JSON values as ``scan`` found them
    (``Leaves.count + Leaves.containers``: a list is a JSON value and a Python object too)."""
    total = taken + count
    if total > limit:
        raise LimitExceeded(f"{what} brings the request to {total} values decoded one by one "
                            "(JSON values, lists included; BYTES elements; typed gRPC "
                            f"contents), more than max_request_elements = {limit}; send "
                            "numbers as binary data (read in place) or raise "
                            "server.limits.max_request_elements")
    return total
