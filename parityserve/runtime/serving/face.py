"""The serving face: every inference request from every edge, decided once.

An edge (``runtime/frontend/``: the Clipper routes, V2 REST, gRPC) decodes its wire format
into an ``InferenceRequest`` and calls ``ServingSystem.infer``, which is ``serve`` over the
system's parts. Here, and only here, it is decided what the request is for: an application's
queries, a stateful graph's rows, or a model's batch; which limits and checks follow from that
(the number of an application's queries, one input tensor, the model's signature, the output
names, a graph's version and its ``streams`` and ``labels``); and what is refused, with which
``parityserve.errors`` type. Each edge maps those types to its own status codes, once.

What a request is for, by the face it came in by:

- ``clipper`` (``POST /{name}/predict``): a graph's rows when ``name`` is a graph, else an
  application's queries;
- ``v2`` (``/v2/models/{name}/infer`` and gRPC ``ModelInfer``): a graph served as one model
  (version 1, one input tensor of rows, one output named ``output``) when ``name`` is a graph,
  else the model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import orjson

from parityserve.config import Limits, TensorSpec
from parityserve.datatypes import dtype_to_datatype
from parityserve.errors import InvalidInput, LimitExceeded, MalformedRequest, UnknownModel
from parityserve.runtime.modelpath.edge_array import EdgeArray
from parityserve.runtime.serving.api import Answer, InferenceRequest, ModelMetadata, Prediction

__all__ = ["Targets", "check_against_spec", "check_queries", "serve"]

GRAPH_OUTPUT = "output"  # the one output of a graph served as a V2 model
GRAPH_VERSION = 1


class Targets(Protocol):
    """What the face decides between: the serving system's own parts (or a test's fakes)."""

    @property
    def limits(self) -> Limits: ...

    def has_graph(self, name: str) -> bool: ...

    async def predict(self, app: str, items: Sequence[Any],
                      uid: str | None = None) -> list[Prediction]:
        """An application's queries, one answer each, in context ``uid``."""
        ...

    async def predict_graph(self, name: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        """A graph's rows, as a Clipper body (``input`` or ``input_batch``, a stream key,
        ``label``, ``streams``, ``labels``): one answer's JSON per row."""
        ...

    async def infer_detailed(self, model: str, version: int | None, batch: np.ndarray,
                             timeout_s: float | None = None
                             ) -> tuple[np.ndarray, dict[int, str]]:
        """A V2 batch (first axis = queries) through the model path: the stacked outputs,
        and which rows were rebuilt by decoding (row -> method), within the deployment's
        timeout or ``timeout_s`` (the client's deadline), whichever ends first."""
        ...

    def expected_accuracy(self, model: str, version: int | None, method: str) -> float | None:
        """How often an answer of ``model`` rebuilt by ``method`` is right, as measured;
        None when nobody measured it."""
        ...

    def model_metadata(self, model: str, version: int | None) -> ModelMetadata: ...


async def serve(targets: Targets, request: InferenceRequest) -> Answer:
    """The answer to ``request``, whichever edge decoded it (see the module's docstring)."""
    graph = targets.has_graph(request.target)
    if request.api == "clipper":
        if graph:
            return await _graph_body(targets, request)
        return await _app_queries(targets, request)
    if graph:
        return await _graph_tensor(targets, request)
    return await _model_batch(targets, request)


# ---- Clipper ---------------------------------------------------------------------------------


async def _app_queries(targets: Targets, request: InferenceRequest) -> Answer:
    check_queries(len(request.queries), targets.limits)
    uid = _uid(request.parameters)
    predictions = await targets.predict(request.target, request.queries, uid)
    return Answer(request.target, answers=predictions)


def check_queries(count: int, limits: Limits) -> None:
    """An application's request holds at most ``max_batch_items`` queries (a graph's rows are
    counted by the graph, a V2 tensor's by its shape, before anything is read)."""
    if count > limits.max_batch_items:
        raise LimitExceeded(f"'input_batch' has {count} queries, more than "
                            f"max_batch_items = {limits.max_batch_items}")


def _uid(parameters: Mapping[str, Any]) -> str | None:
    uid = parameters.get("uid")
    if uid is not None and (not isinstance(uid, str) or not uid):
        raise MalformedRequest("'uid' must be a non-empty string")
    return uid


async def _graph_body(targets: Targets, request: InferenceRequest) -> Answer:
    """A graph's rows from the Clipper route: its body again, as the graph reads it (the
    stream key it names, ``label``, ``streams``, ``labels``); the reply leaves once every
    state it depends on is durable (HAMS output commit)."""
    body = dict(request.parameters)
    queries = _json_queries(request.queries)
    if request.batched:
        body["input_batch"] = queries
    else:
        body["input"] = queries[0]
    return Answer(request.target, answers=await targets.predict_graph(request.target, body))


def _json_queries(queries: Sequence[Any]) -> list[Any]:
    """The queries as JSON values. Numbers the edge decoded straight to arrays are decoded
    again from their body, once for all of them (an edge decodes every query of a body in
    one way or the other)."""
    first = queries[0] if queries else None
    if not isinstance(first, EdgeArray):
        return list(queries)
    value = orjson.loads(first.body)[first.key]
    return [value] if first.index is None else list(value)


# ---- V2 --------------------------------------------------------------------------------------


async def _model_batch(targets: Targets, request: InferenceRequest) -> Answer:
    model, version = request.target, request.version
    meta = targets.model_metadata(model, version)
    name = _output_name(request, meta.outputs[0].name if meta.outputs else GRAPH_OUTPUT,
                        f"model {meta.name!r}")
    batch = _the_input(request, f"model {meta.name!r}", meta.inputs[0] if meta.inputs else None)
    result, rebuilt = await targets.infer_detailed(model, version, batch, request.timeout_s)
    expected = {m: targets.expected_accuracy(model, version, m)
                for m in sorted(set(rebuilt.values()))}
    return Answer(meta.name, version=str(version) if version else _latest(meta),
                  output_name=name, output=np.asarray(result), rebuilt=rebuilt,
                  expected=expected)


async def _graph_tensor(targets: Targets, request: InferenceRequest) -> Answer:
    """A stateful graph's entry as a V2 model: one input tensor, a row per query (two or more
    dimensions); ``streams`` and ``labels`` ride in the request's parameters. The answer
    carries ``seqs`` and ``durable``."""
    graph = request.target
    if request.version not in (None, GRAPH_VERSION):
        raise UnknownModel(f"graph {graph!r} has no version {request.version}; serving "
                           f"version {GRAPH_VERSION}")
    _output_name(request, GRAPH_OUTPUT, f"graph {graph!r}")
    rows = _the_input(request, f"graph {graph!r}", None)
    if rows.ndim < 2:
        raise InvalidInput(f"graph {graph!r}: the input's first dimension counts the "
                           f"rows, so send shape [1, {rows.size}] for one row")
    query: dict[str, Any] = {"input_batch": list(rows)}
    query.update(graph_parameters(request.parameters, len(rows)))
    answers = await targets.predict_graph(graph, query)
    result = np.stack([np.asarray(a["output"], dtype=np.float32) for a in answers])
    return Answer(graph, version=str(GRAPH_VERSION), output_name=GRAPH_OUTPUT, output=result,
                  seqs=[a["seqs"] for a in answers], durable=bool(answers[0]["durable"]))


def graph_parameters(params: Mapping[str, Any], rows: int) -> dict[str, list[Any]]:
    """``streams`` and ``labels`` of a V2 request to a graph: a list (one per row), a string
    holding a JSON list (gRPC's parameters carry no lists), or, for a one-row request, a bare
    stream key (string) or label (integer)."""
    out: dict[str, list[Any]] = {}
    for key, kind in (("streams", str), ("labels", int)):
        if key not in params:
            continue
        value = params[key]
        if isinstance(value, str) and value[:1] == "[":
            try:
                value = orjson.loads(value)
            except orjson.JSONDecodeError as exc:
                raise InvalidInput(f"parameter {key!r}: not a JSON list: {exc}") from None
        elif type(value) is kind and rows == 1:  # type(): a bool is no label
            value = [value]
        if not isinstance(value, list):
            raise InvalidInput(f"parameter {key!r}: send a JSON list of {rows} "
                               f"{kind.__name__} values in a string parameter"
                               + (" (or one bare value for a one-row request)"
                                  if rows == 1 else ""))
        out[key] = value
    return out


def _the_input(request: InferenceRequest, what: str, spec: TensorSpec | None) -> np.ndarray:
    if len(request.tensors) != 1:
        names = [name for name, _ in request.tensors]
        raise InvalidInput(f"{what} takes exactly one input tensor, got {len(names)}: {names}")
    array = request.tensors[0][1]
    if spec is not None:
        check_against_spec(array, spec)
    return array


def _output_name(request: InferenceRequest, name: str, what: str) -> str:
    unknown = [o for o in request.outputs if o != name]
    if unknown:
        raise InvalidInput(f"{what} has no output {unknown[0]!r}; its output is {name!r}")
    return name


def _latest(meta: ModelMetadata) -> str | None:
    numeric = [v for v in meta.versions if v.isascii() and v.isdigit()]
    return max(numeric, key=int) if numeric else None


def check_against_spec(array: np.ndarray, spec: TensorSpec) -> None:
    """Raise InvalidInput unless ``array`` (batch first) fits ``spec`` (batch excluded)."""
    got = dtype_to_datatype(array.dtype)
    if got != spec.datatype:
        raise InvalidInput(f"input {spec.name!r}: expected datatype {spec.datatype}, got {got}")
    want = (-1, *spec.shape)
    if len(array.shape) != len(want) or any(
            w != -1 and s != w for s, w in zip(array.shape, want, strict=True)):
        raise InvalidInput(f"input {spec.name!r}: expected shape {list(want)} "
                           f"(-1 is any size; the first axis is the batch), "
                           f"got {list(array.shape)}")
