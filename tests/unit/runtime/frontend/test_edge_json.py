"""runtime/frontend/edge_json.py: Clipper bodies of plain numbers decoded straight to arrays, and
only where that gives what the general path (orjson, the router's scan, ``coerce_item``) gives.

The property: for any body, when ``decode_predict`` answers, each query coerced for each kind of
model (no signature with arrays or Python values, float and integer signatures, BYTES) is what
the general path makes of the same body, to the dtype and the Python type of every number; when
it does not answer, the general path decides. Hypothesis writes the bodies, rectangular and
not, with every JSON leaf type; the named cases pin the traps of flattening and of the two
parsers' differences.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parityserve.config import Limits, TensorSpec
from parityserve.core.inputs import scan
from parityserve.errors import InvalidInput, LimitExceeded, MalformedRequest
from parityserve.runtime.frontend.clipper import json_object, optional_str, predict_items
from parityserve.runtime.frontend.edge_json import decode_predict
from parityserve.runtime.modelpath.edge_array import EdgeArray
from parityserve.runtime.modelpath.tensors import coerce_item
from parityserve.runtime.serving.face import check_queries

LIMITS = Limits()
SPECS: list[tuple[TensorSpec | None, bool]] = [
    (None, True), (None, False),
    (TensorSpec(name="x", datatype="FP32", shape=(-1,)), True),
    (TensorSpec(name="x", datatype="FP64", shape=(-1, -1)), True),
    (TensorSpec(name="x", datatype="INT32", shape=(-1,)), True),
    (TensorSpec(name="x", datatype="UINT8", shape=(-1,)), True),
    (TensorSpec(name="x", datatype="BYTES", shape=(-1,)), True),
]


def _general(body: bytes, limits: Limits = LIMITS) -> tuple[list[Any], bool, str | None]:
    doc = json_object(body, limits)
    items, batched = predict_items(doc, limits)
    check_queries(len(items), limits)  # what the serving face counts for an application
    for item in items:  # what the router's scan enforces for each query
        scan(item, max_depth=limits.max_json_depth, max_elements=limits.max_input_elements,
             depth=3)
    return items, batched, optional_str(doc, "uid")


def _coerced(item: Any, spec: TensorSpec | None, json_arrays: bool) -> Any:
    leaves = item.leaves if isinstance(item, EdgeArray) else None
    try:
        return coerce_item(item, spec, where="model 'm'", leaves=leaves,
                           json_arrays=json_arrays)
    except InvalidInput as exc:
        return ("InvalidInput", str(exc))


def _same(a: Any, b: Any) -> bool:
    """Equal values of equal types all the way down (1 is not 1.0; an array's dtype counts)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape
                and np.array_equal(a, b))
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)))


def _check_agrees(body: bytes, limits: Limits = LIMITS) -> bool:
    """Asserts the property for one body; returns whether the edge answered."""
    fast = decode_predict(body, limits)
    if fast is None:
        return False
    items, batched, uid = _general(body, limits)  # the edge answers only what this accepts
    assert (fast.batched, fast.uid, len(fast.items)) == (batched, uid, len(items))
    for edge, item in zip(fast.items, items, strict=True):
        assert _same(edge.as_decoded(), item)
        for spec, json_arrays in SPECS:
            assert _same(_coerced(edge, spec, json_arrays), _coerced(item, spec, json_arrays))
    return True


# ---- bodies written by hypothesis -----------------------------------------------------------
_FLOATS = st.floats(allow_nan=False, allow_infinity=False, width=64)
_INTS = st.integers(min_value=-(2**64), max_value=2**64)
_SMALL_INTS = st.integers(min_value=-1000, max_value=1000)
_NUMBERS = st.one_of(_FLOATS, _INTS, _SMALL_INTS, st.sampled_from([0.0, -0.0, 1.0, 2.0]))
_LEAVES = st.one_of(_NUMBERS, st.booleans(), st.none(), st.text(max_size=3))


@st.composite
def _rectangular(draw: st.DrawFn, leaves: st.SearchStrategy[Any] = _NUMBERS) -> Any:
    shape = draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
    count = math.prod(shape)
    flat = draw(st.lists(leaves, min_size=count, max_size=count))
    return np.array(flat, dtype=object).reshape(shape).tolist() if count else \
        np.empty(shape).tolist()


_RAGGED = st.recursive(_LEAVES, lambda inner: st.lists(inner, max_size=3), max_leaves=12)
_QUERIES = st.one_of(_rectangular(), _rectangular(_LEAVES), _RAGGED)


@st.composite
def _bodies(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if draw(st.booleans()):
        body["input"] = draw(_QUERIES)
    else:
        body["input_batch"] = draw(st.lists(_QUERIES, max_size=3))
    if draw(st.booleans()):
        body["uid"] = draw(st.one_of(st.text(max_size=4), st.none(), st.integers()))
    if draw(st.integers(0, 9)) == 0:
        body["extra"] = draw(_QUERIES)
    return body


def _dumps(body: dict[str, Any]) -> bytes | None:
    try:
        return orjson.dumps(body)
    except TypeError:  # an integer past 64 bits: orjson will not write it
        return None


@settings(max_examples=400, deadline=None)
@given(_bodies())
def test_whatever_the_edge_answers_is_what_the_general_path_makes(body: dict[str, Any]) -> None:
    raw = _dumps(body)
    if raw is not None:
        _check_agrees(raw)


@settings(max_examples=200, deadline=None)
@given(_rectangular(st.one_of(st.floats(-1e15, 1e15), _SMALL_INTS)), st.booleans())
def test_rectangular_numbers_take_the_edge(query: Any, batched: bool) -> None:
    """The property above must not hold by the edge never answering. (Magnitudes from 2**53
    on take the general path, which checks that mixed ints stay exact.)"""
    raw = orjson.dumps({"input_batch": [query, query]} if batched else {"input": query})
    nonempty = math.prod(np.asarray(query).shape) > 0
    assert _check_agrees(raw) == nonempty


# ---- named cases ------------------------------------------------------------------------------
@pytest.mark.parametrize("body", [
    b'{"input": [1, [2], 3]}',  # one element nested: flattening would hide it
    b'{"input": [[1, [2]], [3, 4]]}',
    b'{"input": [[1, 2], [3, 4, 5], [6]]}',  # ragged, with the count of a 3x2
    b'{"input": [[1], 2]}',
    b'{"input": [1, []]}',
    b'{"input": []}',
    b'{"input": [[]]}',
    b'{"input": [true, 1.0]}',
    b'{"input": [null, 1.0]}',
    b'{"input": ["1", 1.0]}',
    b'{"input": [{"a": 1}]}',
    b'{"input": [9007199254740993, 0.5]}',  # an int that float64 would round
    b'{"input": [18446744073709551615]}',  # past int64
    b'{"input": [123456789012345678901234567890]}',  # past 64 bits: orjson makes a float
    b'\xef\xbb\xbf{"input": [1.0]}',  # a byte-order mark: simdjson takes it, orjson does not
    b' {"input": [1.0]}',
    b'{"input": [1.0], "input": [2.0]}',  # duplicate keys: orjson keeps the last
    b'{"input": [1.0], "input_batch": [[2.0]]}',
    b'{"input": [1.0], "uid": ""}',
    b'{"input": [1.0], "uid": 7}',
    b'{"input": [1.0], "uid": "a[b"}',  # a '[' in the uid: merely the general path
    b'{"input": [1.0], "label": 1}',
    b'{"input_batch": []}',
    b'{"input_batch": [1.0]}',
    b'{"input_batch": [[1.0], "x"]}',
    b'{"input": 1.0}',
    b'[1.0]',
    b'{"input": [1.0]} x',
    b'{"input": [1e400]}',
    b'{"input": [1.0,]}',
])
def test_what_the_edge_leaves_to_the_general_path(body: bytes) -> None:
    assert decode_predict(body, LIMITS) is None


@pytest.mark.parametrize(("body", "dtype", "shape"), [
    (b'{"input": [0.5, 1.0, 2.0]}', "float64", (3,)),
    (b'{"input": [1, 2, 3]}', "int64", (3,)),
    (b'{"input": [1, 2.5]}', "float64", (2,)),
    (b'{"input": [1.0, 2.0]}', "float64", (2,)),  # whole numbers written as floats
    (b'{"input": [-0, 1e2]}', "float64", (2,)),
    (b'{"input":[[1,2],[3,4]],"uid":"u"}', "int64", (2, 2)),
    (b'{"input_batch": [[[0.5]], [[1.5]]]}', "float64", (1, 1)),
    (b'{ "input" : [ 1.0 ,\n 2.0 ] }\n', "float64", (2,)),
])
def test_numbers_become_the_array_the_general_path_makes(body: bytes, dtype: str,
                                                         shape: tuple[int, ...]) -> None:
    fast = decode_predict(body, LIMITS)
    assert fast is not None
    assert all(e.array.dtype == np.dtype(dtype) and e.array.shape == shape for e in fast.items)
    assert _check_agrees(body)


def test_mixed_ints_keep_their_type_for_models_that_take_python_values() -> None:
    (edge,) = decode_predict(b'{"input": [1, 2.5]}', LIMITS).items  # type: ignore[union-attr]
    decoded = coerce_item(edge, None, where="m", json_arrays=False)
    assert decoded == [1, 2.5] and type(decoded[0]) is int


def test_integer_signatures_keep_their_range_check() -> None:
    (edge,) = decode_predict(b'{"input": [300, 1]}', LIMITS).items  # type: ignore[union-attr]
    spec = TensorSpec(name="x", datatype="UINT8", shape=(-1,))
    with pytest.raises(InvalidInput, match="not a UINT8 tensor"):
        coerce_item(edge, spec, where="m")


@pytest.mark.parametrize(("limits", "body"), [
    (Limits(max_input_elements=3), b'{"input": [1.0, 2.0, 3.0, 4.0]}'),
    (Limits(max_json_depth=4), b'{"input": [[[1.0]]]}'),
    (Limits(max_batch_items=2), b'{"input_batch": [[1.0], [2.0], [3.0]]}'),
])
def test_past_a_limit_the_general_path_names_the_limit(limits: Limits, body: bytes) -> None:
    assert decode_predict(body, limits) is None
    with pytest.raises(LimitExceeded):
        _general(body, limits)


def test_within_the_limits_the_edge_answers() -> None:
    assert decode_predict(b'{"input": [1.0, 2.0, 3.0]}', Limits(max_input_elements=3))
    assert decode_predict(b'{"input": [[[1.0]]]}', Limits(max_json_depth=5))


def test_invalid_json_is_the_general_paths_error() -> None:
    assert decode_predict(b'{"input": [1.0', LIMITS) is None
    with pytest.raises(MalformedRequest, match="invalid JSON"):
        _general(b'{"input": [1.0')
