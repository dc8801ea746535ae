"""A graph request's inputs (runtime/graphs.py ``graph_items``) pass the model routes' check
(core/inputs.py ``check_leaves``): numbers only, never numeric strings, booleans or null, which
numpy would turn into numbers; and a V2 tensor that is not of a number type is a 400, where a
BYTES row once reached numpy's float parser (issue 38, item 8)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from parityserve.config import TensorSpec
from parityserve.errors import InvalidInput
from parityserve.runtime.graphs import graph_items
from parityserve.runtime.tensors import coerce_item

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
