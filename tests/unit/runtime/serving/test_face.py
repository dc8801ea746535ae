"""runtime/serving/face.py: every edge's request, decided once (issue 40, item 2).

The face over fake parts: which part a request reaches (an application, a graph by its
Clipper body, a graph served as a V2 model, a model), what it checks on the way, and what it
answers. The edges' own tests (test_http_frontend, test_grpc_codec) show both edges get the
same answers and errors from it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
import pytest

from parityserve.config import Limits, TensorSpec
from parityserve.core.inputs import Leaves
from parityserve.errors import (
    InvalidInput,
    LimitExceeded,
    MalformedRequest,
    UnknownApplication,
    UnknownModel,
)
from parityserve.runtime.modelpath.edge_array import EdgeArray
from parityserve.runtime.serving.api import Answer, InferenceRequest, ModelMetadata, Prediction
from parityserve.runtime.serving.face import graph_parameters, serve

SPEC = TensorSpec(name="x", datatype="FP32", shape=(3,))


class Parts:
    """App "calc", graph "stocks" (each row's answer is its sum), model "double" (x2)."""

    def __init__(self) -> None:
        self.limits = Limits(max_batch_items=4)
        self.calls: list[tuple[Any, ...]] = []

    def has_graph(self, name: str) -> bool:
        return name == "stocks"

    async def predict(self, app: str, items: Sequence[Any],
                      uid: str | None = None) -> list[Prediction]:
        if app != "calc":
            raise UnknownApplication(f"unknown application {app!r}")
        self.calls.append(("predict", app, list(items), uid))
        return [Prediction(str(i), x) for i, x in enumerate(items)]

    async def predict_graph(self, name: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        self.calls.append(("graph", name, body))
        rows = body["input_batch"] if "input_batch" in body else [body["input"]]
        return [{"query_id": str(i), "graph": name, "output": [float(np.sum(r))],
                 "seqs": {"seq1": i + 1}, "durable": True} for i, r in enumerate(rows)]

    async def infer_detailed(self, model: str, version: int | None, batch: np.ndarray,
                             timeout_s: float | None = None
                             ) -> tuple[np.ndarray, dict[int, str]]:
        self.calls.append(("infer", model, version))
        return batch * 2, ({1: "parm"} if len(batch) > 1 else {})

    def expected_accuracy(self, model: str, version: int | None, method: str) -> float | None:
        return 0.9

    def model_metadata(self, model: str, version: int | None) -> ModelMetadata:
        if model != "double" or version not in (None, 3):
            raise UnknownModel(f"unknown model {model!r}")
        return ModelMetadata("double", ("3",), "python", (SPEC,),
                             (TensorSpec(name="y", datatype="FP32", shape=(3,)),))


def run(parts: Parts, request: InferenceRequest) -> Answer:
    return asyncio.run(serve(parts, request))


def clipper(target: str, *queries: Any, batched: bool = False, **params: Any
            ) -> InferenceRequest:
    return InferenceRequest("clipper", target, queries=queries, batched=batched,
                            parameters=params)


def v2(target: str, *tensors: tuple[str, Any], version: int | None = None,
       outputs: tuple[str, ...] = (), **params: Any) -> InferenceRequest:
    return InferenceRequest("v2", target, version,
                            tensors=tuple((n, np.asarray(a, np.float32)) for n, a in tensors),
                            outputs=outputs, parameters=params)


# ---- Clipper -----------------------------------------------------------------------------------


def test_an_applications_queries_go_to_its_policy_with_the_uid() -> None:
    parts = Parts()
    answer = run(parts, clipper("calc", [1, 2], [3, 4], batched=True, uid="u"))
    assert [p.output for p in answer.answers] == [[1, 2], [3, 4]]
    assert parts.calls == [("predict", "calc", [[1, 2], [3, 4]], "u")]
    assert answer.clipper_json()[0] == {"query_id": "0", "output": [1, 2], "default": False}


def test_an_application_takes_at_most_max_batch_items_queries() -> None:
    with pytest.raises(LimitExceeded, match="5 queries, more than max_batch_items = 4"):
        run(Parts(), clipper("calc", *[[1]] * 5, batched=True))


@pytest.mark.parametrize("uid", ["", 5, ["u"]])
def test_an_applications_uid_is_a_non_empty_string(uid: Any) -> None:
    with pytest.raises(MalformedRequest, match="'uid' must be a non-empty string"):
        run(Parts(), clipper("calc", [1], uid=uid))


def test_an_unknown_name_is_the_applications_404() -> None:
    with pytest.raises(UnknownApplication):
        run(Parts(), clipper("nope", [1]))


def test_a_graphs_clipper_body_reaches_it_whole() -> None:
    parts = Parts()
    one = run(parts, clipper("stocks", [1.0, 2.0], ticker="IBM", label=3))
    assert parts.calls[-1] == ("graph", "stocks", {"input": [1.0, 2.0], "ticker": "IBM",
                                                   "label": 3})
    assert one.clipper_json() == [{"query_id": "0", "graph": "stocks", "output": [3.0],
                                   "seqs": {"seq1": 1}, "durable": True}]
    run(parts, clipper("stocks", [1.0], [2.0], batched=True, streams=["a", "b"]))
    assert parts.calls[-1] == ("graph", "stocks", {"input_batch": [[1.0], [2.0]],
                                                   "streams": ["a", "b"]})


def test_a_graphs_rows_that_the_edge_made_arrays_reach_it_as_json() -> None:
    """The fast Clipper decoding makes arrays; a graph reads the body's JSON (one parse)."""
    body = orjson.dumps({"input_batch": [[1, 2], [3.5, 4]]})
    rows = [EdgeArray(np.array(r, np.float64), Leaves(frozenset((float,)), 2), body,
                      "input_batch", i) for i, r in enumerate(([1, 2], [3.5, 4]))]
    parts = Parts()
    run(parts, clipper("stocks", *rows, batched=True))
    assert parts.calls[-1] == ("graph", "stocks", {"input_batch": [[1, 2], [3.5, 4]]})
    single = EdgeArray(np.array([1.0]), Leaves(frozenset((float,)), 1),
                       orjson.dumps({"input": [1.0], "uid": "u"}), "input")
    run(parts, clipper("stocks", single, uid="u"))
    assert parts.calls[-1] == ("graph", "stocks", {"input": [1.0], "uid": "u"})


# ---- V2: a model -------------------------------------------------------------------------------


def test_a_models_batch_answers_with_its_version_and_rebuilt_rows() -> None:
    parts = Parts()
    answer = run(parts, v2("double", ("x", [[1, 2, 3], [4, 5, 6]])))
    np.testing.assert_array_equal(answer.output, [[2, 4, 6], [8, 10, 12]])
    assert (answer.target, answer.version, answer.output_name) == ("double", "3", "y")
    assert answer.rebuilt == {1: "parm"} and answer.expected == {"parm": 0.9}
    assert answer.seqs is None and parts.calls == [("infer", "double", None)]
    assert run(parts, v2("double", ("x", [[1, 2, 3]]), version=3)).version == "3"


@pytest.mark.parametrize(("request_", "error", "words"), [
    (v2("double", ("x", [[1, 2, 3]]), ("z", [[1]])), InvalidInput,
     r"model 'double' takes exactly one input tensor, got 2: \['x', 'z'\]"),
    (v2("double", ("x", [[1, 2]])), InvalidInput, r"expected shape \[-1, 3\]"),
    (v2("double", ("x", [[1, 2, 3]]), outputs=("z",)), InvalidInput,
     "model 'double' has no output 'z'; its output is 'y'"),
    (v2("double", ("x", [[1, 2, 3]]), version=2), UnknownModel, "unknown model"),
])
def test_a_models_batch_is_checked_before_it_is_run(request_: InferenceRequest,
                                                    error: type[Exception], words: str) -> None:
    parts = Parts()
    with pytest.raises(error, match=words):
        run(parts, request_)
    assert parts.calls == []


# ---- V2: a graph served as a model ---------------------------------------------------------------


def test_a_graph_served_as_a_model_takes_rows_and_answers_with_seqs() -> None:
    parts = Parts()
    answer = run(parts, v2("stocks", ("x", [[1, 2], [3, 4]]), version=1,
                           streams='["a", "b"]', labels=[1, 2]))
    np.testing.assert_array_equal(answer.output, [[3.0], [7.0]])
    assert (answer.version, answer.output_name, answer.durable) == ("1", "output", True)
    assert answer.seqs == [{"seq1": 1}, {"seq1": 2}]
    _, _, body = parts.calls[-1]
    assert body["streams"] == ["a", "b"] and body["labels"] == [1, 2]
    assert [r.tolist() for r in body["input_batch"]] == [[1, 2], [3, 4]]


@pytest.mark.parametrize(("request_", "error", "words"), [
    # V2 REST served these three and gRPC refused them: both refuse them now
    (v2("stocks", ("x", [[1, 2]]), version=2), UnknownModel,
     "graph 'stocks' has no version 2; serving version 1"),
    (v2("stocks", ("x", [[1, 2]]), outputs=("y",)), InvalidInput,
     "graph 'stocks' has no output 'y'; its output is 'output'"),
    (v2("stocks", ("x", 5.0)), InvalidInput, r"send shape \[1, 1\] for one row"),
    (v2("stocks", ("x", [1.0, 2.0])), InvalidInput, r"send shape \[1, 2\] for one row"),
    (v2("stocks", ("x", [[1, 2]]), ("y", [[1]])), InvalidInput,
     r"graph 'stocks' takes exactly one input tensor, got 2"),
    (v2("stocks", ("x", [[1, 2]]), streams="[nope"), InvalidInput, "not a JSON list"),
])
def test_a_graph_served_as_a_model_refuses_what_it_cannot_serve(
        request_: InferenceRequest, error: type[Exception], words: str) -> None:
    parts = Parts()
    with pytest.raises(error, match=words):
        run(parts, request_)
    assert parts.calls == []


@pytest.mark.parametrize(("params", "rows", "expected"), [
    ({}, 2, {}),
    ({"streams": ["a", "b"], "labels": [1, 2]}, 2, {"streams": ["a", "b"], "labels": [1, 2]}),
    ({"streams": '["a", "b"]', "labels": "[1, 2]"}, 2, {"streams": ["a", "b"],
                                                        "labels": [1, 2]}),
    ({"streams": "a", "labels": 7}, 1, {"streams": ["a"], "labels": [7]}),
    ({"binary_data_output": True}, 1, {}),  # not a graph's
])
def test_graph_parameters_are_lists_however_they_came(params: dict[str, Any], rows: int,
                                                      expected: dict[str, Any]) -> None:
    assert graph_parameters(params, rows) == expected


@pytest.mark.parametrize(("params", "rows", "words"), [
    ({"streams": "a"}, 2, "a JSON list of 2 str values in a string parameter$"),
    ({"labels": True}, 1, r"a JSON list of 1 int values .*\(or one bare value"),
    ({"labels": "3"}, 1, "'labels'"),
    ({"streams": 5}, 1, "'streams'"),
])
def test_graph_parameters_that_are_no_list_are_refused(params: dict[str, Any], rows: int,
                                                       words: str) -> None:
    with pytest.raises(InvalidInput, match=words):
        graph_parameters(params, rows)
