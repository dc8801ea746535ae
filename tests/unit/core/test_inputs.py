"""What a decoded JSON input becomes for a model without an input signature (core/inputs.py
``array_dtype`` and ``as_array``): one array when it is a rectangular list of numbers that
survive the trip exactly, else the value itself."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parityserve.core.inputs import array_dtype, as_array, scan

INT64 = (-(2**63), 2**63 - 1)


def _scan(value: Any) -> Any:
    return scan(value, max_depth=sys.maxsize, max_elements=sys.maxsize)


def convert(value: Any, **kwargs: Any) -> Any:
    return as_array(value, _scan(value), **kwargs)


@pytest.mark.parametrize(("value", "dtype"), [
    ([1, 2, 3], np.int64),
    ([[1, 2], [3, 4]], np.int64),
    ([1.0, 2.0], np.float64),
    ([1, 2.5], np.float64),          # one float makes them all floats
    ([[1], [2.5]], np.float64),
    ([[1, 2], [3]], np.int64),       # ragged lengths only show in the conversion
    (1.5, None),                     # scalars stay scalars
    ("text", None),
    (None, None),
    ([], None),
    ([[], []], None),
    ([True, False], None),           # booleans are not numbers here
    ([1, True], None),
    ([1.0, None], None),
    (["1", 2], None),
    ([[1.0], 2.0], None),            # a list beside a number
    ([{"a": 1}], None),              # objects are no rows, whatever they hold
    ([[1], {"a": 2}], None),
    ({"a": 1}, None),
])
def test_array_dtype(value: Any, dtype: Any) -> None:
    assert array_dtype(value, _scan(value)) is dtype


@pytest.mark.parametrize(("value", "dtype", "shape"), [
    ([1, 2, 3], np.int64, (3,)),
    ([[1.5, 2.0], [3.0, 4.0]], np.float64, (2, 2)),
    ([1, -0.0], np.float64, (2,)),
    ([2**63 - 1, -(2**63)], np.int64, (2,)),
    ([2**70, 0.5], np.float64, (2,)),  # a power of two: exact in float64
    ([2**53 + 2, 1.0], np.float64, (2,)),
    ([1e308, 1], np.float64, (2,)),
])
def test_numbers_become_one_array(value: list[Any], dtype: Any, shape: tuple[int, ...]) -> None:
    array = convert(value)
    assert isinstance(array, np.ndarray)
    assert (array.dtype, array.shape) == (np.dtype(dtype), shape)
    assert array.tolist() == value


@pytest.mark.parametrize("value", [
    [2**63],                    # past int64
    [[1, 2], [3, -(2**63) - 1]],
    [2**53 + 1, 0.5],           # float64 would round the int
    [10**400, 0.5],             # past float64
    [[1, 2], [3]],              # ragged
    [[1, 2], [[3, 4]]],
    [[1.0], 2.0],
    [True, False],
    ["a", "b"],
    [{"a": 1.0}],
    [],
    3,
])
def test_anything_else_is_kept_as_decoded(value: Any) -> None:
    assert convert(value) is value


def test_lists_deeper_than_max_ndim_are_kept() -> None:
    deep: Any = [1.0]
    for _ in range(3):
        deep = [deep]
    assert convert(deep, max_ndim=3) is deep
    assert convert(deep, max_ndim=4).shape == (1, 1, 1, 1)


# ---- properties --------------------------------------------------------------------------

SAFE_INTS = st.integers(-(2**53), 2**53)  # exact in float64, so a mix with floats converts
FLOATS = st.floats(allow_nan=False)  # JSON has no NaN


@st.composite
def rectangular(draw: st.DrawFn, leaf: st.SearchStrategy[Any]) -> list[Any]:
    """A non-empty rectangular nest of lists with ``leaf`` values."""
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))

    def build(dims: list[int]) -> Any:
        return [build(dims[1:]) for _ in range(dims[0])] if dims else draw(leaf)

    result: list[Any] = build(shape)
    return result


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | FLOATS | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner,
                                                                max_size=3),
    max_leaves=24)


def _leaves(value: Any) -> list[Any]:
    return [x for v in value for x in _leaves(v)] if type(value) is list else [value]


def _shape(value: Any) -> tuple[int, ...] | None:
    """The shape of a rectangular, non-empty nest of lists of numbers, else None: a reference
    written independently of the scan."""
    if type(value) in (int, float):
        return ()
    if type(value) is not list or not value:
        return None
    inner = {_shape(v) for v in value}
    if len(inner) != 1 or None in inner:
        return None
    (shape,) = inner
    return None if shape is None else (len(value), *shape)


def _exact(value: Any) -> bool:
    """Whether every number survives as int64 (all ints) or float64 (any float)."""
    leaves = _leaves(value)
    if all(type(x) is int for x in leaves):
        return all(INT64[0] <= x <= INT64[1] for x in leaves)
    try:
        return all(float(x) == x for x in leaves)
    except OverflowError:
        return False


@given(rectangular(st.integers(*INT64)) | rectangular(FLOATS) | rectangular(SAFE_INTS | FLOATS))
@settings(max_examples=300, deadline=None)
def test_every_numeric_rectangular_input_round_trips(value: list[Any]) -> None:
    array = convert(value)
    assert isinstance(array, np.ndarray)
    assert array.shape == _shape(value)
    all_ints = all(type(x) is int for x in _leaves(value))
    assert array.dtype == (np.int64 if all_ints else np.float64)
    assert array.tolist() == value


@given(JSON | rectangular(st.integers() | FLOATS))
@settings(max_examples=400, deadline=None)
def test_any_json_value_is_an_exact_array_or_itself(value: Any) -> None:
    result = convert(value)
    should = type(value) is list and _shape(value) is not None and _exact(value)
    assert isinstance(result, np.ndarray) is should
    if should:
        assert result.tolist() == value
    else:
        assert result is value
