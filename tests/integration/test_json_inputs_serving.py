"""What a model without an input signature receives from the Clipper JSON route (issue 17).

A real server and real workers: numbers arrive as one stacked numpy array by default, as
Python lists with ``json_inputs: python``, and anything that is not a rectangular list of
numbers arrives as decoded JSON either way.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from parityserve.client import Client
from parityserve.config import Limits
from parityserve.runtime.frontend.edge_json import decode_predict

pytestmark = pytest.mark.integration

MODELS = '''
class Describe:
    """Answers, per query, what its batch and its row were, and the row itself."""
    def predict(self, batch):
        kind = type(batch).__name__
        dtype = str(batch.dtype) if hasattr(batch, "dtype") else None
        return [{"batch": kind, "dtype": dtype, "row": type(row).__name__,
                 "value": row.tolist() if hasattr(row, "tolist") else row} for row in batch]
'''

HUGE = 2**63  # past int64; orjson still reads it as an int (up to 2**64 - 1)
ODD = [
    "text",
    3.5,
    {"a": [1.0, 2.0]},
    [True, False],
    [1, True],
    [[1.0, 2.0], [3.0]],
    [[1.0], 2.0],
    [HUGE, 1],
    [2**53 + 1, 0.5],  # float64 would round the int
    ["a", "b"],
    [None, 1.0],
    [],
]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from conftest import start_server

    base = tmp_path_factory.mktemp("json-inputs")
    (base / "describe_models.py").write_text(MODELS)
    models = [
        {"name": "arrays", "source": "python:describe_models:Describe"},
        {"name": "lists", "source": "python:describe_models:Describe", "json_inputs": "python"},
        {"name": "echo", "source": "zoo:echo"},
    ]
    config = {
        "server": {"http_port": 0},
        "models": [{**m, "replicas": 1, "batching": {"max_batch_size": 8, "max_delay_ms": 20}}
                   for m in models],
        "applications": [{"name": m["name"], "models": [m["name"]], "slo_ms": 5000,
                          "default_output": "DEFAULT"} for m in models],
    }
    server = start_server(config, base)
    try:
        with Client(server.url) as c:
            yield c
    finally:
        server.stop()


def _served(answer: dict[str, Any]) -> Any:
    assert answer["default"] is False, answer
    return answer["output"]


def test_numbers_reach_a_model_without_a_signature_as_one_stacked_array(client) -> None:
    rows = [[0.5, 1.0, 2.0], [3.0, 4.0, 5.5]]
    answers = client.predict_batch("arrays", rows)
    for row, answer in zip(rows, answers, strict=True):
        assert _served(answer) == {"batch": "ndarray", "dtype": "float64", "row": "ndarray",
                                   "value": row}
    ints = _served(client.predict("arrays", [[1, 2], [3, 4]]))
    assert ints == {"batch": "ndarray", "dtype": "int64", "row": "ndarray",
                    "value": [[1, 2], [3, 4]]}


def test_json_inputs_python_keeps_the_lists(client) -> None:
    answer = _served(client.predict("lists", [0.5, 1.0, 2.0]))
    assert answer == {"batch": "list", "dtype": None, "row": "list", "value": [0.5, 1.0, 2.0]}


@pytest.mark.parametrize(("row", "dtype"), [
    ([1, 2.5], "float64"),  # an int beside a float: the row is float64
    ([1.0, 2.0], "float64"),  # whole numbers written as floats stay floats
    ([[1, 2], [3, 4]], "int64"),
])
def test_plain_numbers_decoded_straight_to_arrays_match_the_general_path(
        client, row: list[Any], dtype: str) -> None:
    """Bodies of plain numbers take the HTTP layer's straight-to-array decoding
    (runtime/frontend/edge_json.py): an array model gets the general path's dtype, and a model that
    takes Python values gets the numbers with their JSON types (1 stays int, 2.0 float)."""
    assert decode_predict(orjson.dumps({"input": row}), Limits()) is not None  # that path
    array = _served(client.predict("arrays", row))
    assert array == {"batch": "ndarray", "dtype": dtype, "row": "ndarray", "value": row}
    listed = _served(client.predict("lists", row))
    assert listed == {"batch": "list", "dtype": None, "row": "list", "value": row}
    flat = [v for r in row for v in (r if isinstance(r, list) else [r])]
    got = [v for r in listed["value"] for v in (r if isinstance(r, list) else [r])]
    assert [type(v) for v in got] == [type(v) for v in flat]


@pytest.mark.parametrize("app", ["arrays", "lists"])
@pytest.mark.parametrize("odd", ODD, ids=repr)
def test_inputs_that_are_no_numeric_array_arrive_as_decoded(client, app: str, odd: Any) -> None:
    answer = _served(client.predict(app, odd))
    assert answer["batch"] == "list" and answer["value"] == odd
    assert type(answer["value"]) is type(odd)


def test_answers_keep_their_json_types(client) -> None:
    # zoo:echo answers its input: ints stay ints and floats stay floats in the answer.
    assert _served(client.predict("echo", [1, 2, 3])) == [1, 2, 3]
    assert _served(client.predict("echo", [1.5, 2.0])) == [1.5, 2.0]
    out = _served(client.predict("echo", [[1, 2], [3, 4]]))
    assert out == [[1, 2], [3, 4]] and all(type(v) is int for r in out for v in r)


def test_feedback_by_query_id_uses_the_remembered_array(client) -> None:
    scores = [0.1, 0.9, 0.0]  # zoo:echo's answer is these scores: class 1
    answer = client.predict("echo", scores, uid="u1")
    by_id = client.update("echo", "u1", scores, 1, query_id=answer["query_id"])
    assert by_id["losses"] == {"echo": 0.0}
    by_input = client.update("echo", "u1", scores, 2)
    assert by_input["losses"] == {"echo": 1.0}

