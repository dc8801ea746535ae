"""A graph request's inputs (runtime/graphs/registry.py ``graph_items``) pass the model routes'
check (core/inputs.py ``check_leaves``): numbers only, never numeric strings, booleans or null,
which numpy would turn into numbers; and a V2 tensor that is not of a number type is a 400, where a
BYTES row once reached numpy's float parser (issue 38, item 8)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from parityserve.config import TensorSpec
from parityserve.errors import InvalidInput
from parityserve.runtime.graphs.registry import graph_items
from parityserve.runtime.modelpath.tensors import coerce_item

ROW = [0.1, 0.2, 0.3, 0.4]


@pytest.mark.parametrize(("bad", "words"), [
    (["0.1", "0.2", "0.3", "0.4"], "got strings"),
    ([True, False, 0.3, 0.4], "got booleans"),
    ([None, 0.2, 0.3, 0.4], "got null"),
    ([{"a": 1}, 0.2, 0.3, 0.4], "got objects"),
    ([[0.1], 0.2, 0.3, 0.4], "got lists beside numbers"),
])
def test_graph_inputs_take_what_a_model_route_takes(bad: list[Any], words: str) -> None:
    for body in ({"input": bad, "ticker": "IBM"}, {"input_batch": [ROW, bad]}):
        with pytest.raises(InvalidInput, match=f"graph input: FP32 data takes only numbers, "
                                               f"{words}"):
            graph_items(body, "ticker")
    # the same words from the model route, whose check this is
    with pytest.raises(InvalidInput, match=f"FP32 data takes only numbers, {words}"):
        coerce_item(bad, TensorSpec(name="x", datatype="FP32", shape=(4,)), where="model 'm'")


@pytest.mark.parametrize(("rows", "datatype"), [
    (np.array([[b"0.1", b"abc"]], dtype=object), "BYTES"),
    (np.array([[True, False]]), "BOOL"),
])
def test_v2_rows_that_are_not_numbers_are_refused(rows: np.ndarray, datatype: str) -> None:
    with pytest.raises(InvalidInput, match=f"got a {datatype} tensor"):
        graph_items({"input_batch": list(rows)}, "ticker")


def test_numbers_of_any_number_type_become_float32_rows() -> None:
    rows, streams, labels = graph_items({"input": [1, 2, 3, 4], "ticker": "IBM"}, "ticker")
    assert rows[0].dtype == np.float32 and rows[0].tolist() == [1, 2, 3, 4]
    assert (streams, labels) == (["IBM"], [-1])
    ints = np.arange(8, dtype=np.int32).reshape(2, 4)
    rows, _, _ = graph_items({"input_batch": list(ints)}, "ticker")
    assert [r.dtype for r in rows] == [np.float32] * 2


def test_a_one_dimensional_v2_tensor_is_refused_saying_what_one_row_looks_like() -> None:
    # a V2 tensor's first axis counts rows: [4] was 4 numpy scalars, refused as "float32"
    rows = np.array([0.1, 0.2, 0.3, 0.4], dtype=np.float32)
    with pytest.raises(InvalidInput, match=r"first dimension counts the rows.*shape \[1, 4\]"):
        graph_items({"input_batch": list(rows)}, "ticker")


def test_non_finite_rows_are_refused_at_the_door_without_a_warning() -> None:
    # warnings are errors here: a cast of 1e39 printed a RuntimeWarning per request to the
    # server's stderr. And a graph whose first operator is stateful would have folded the
    # infinity into its stream's state: the door refuses it, as the model routes do.
    for body in ({"input": [1e39, 0, 0, 0]}, {"input_batch": [ROW, [1e39, 0, 0, 0]]},
                 {"input_batch": list(np.array([ROW, [np.nan, 0, 0, 0]], np.float32))}):
        with pytest.raises(InvalidInput, match=r"row \d holds NaN or infinity"):
            graph_items(body, "ticker")
    with pytest.raises(InvalidInput, match="share one shape"):  # cast row by row
        graph_items({"input_batch": [[1e39], [0.1, 0.2]]}, "ticker")


def test_a_row_deeper_than_the_worker_wire_carries_is_a_400() -> None:
    # no shape declared, so no door stopped it: the operator's model answered 500 ProtocolError
    deep: Any = 1.0
    for _ in range(32):
        deep = [deep]
    with pytest.raises(InvalidInput, match=r"at most 31 dimensions \(.*got 32"):
        graph_items({"input": deep}, "ticker")
    graph_items({"input": deep[0]}, "ticker")  # 31: the batch's axis makes the wire's 32
