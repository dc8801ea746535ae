"""The server's stateful service graphs: one ``GraphRuntime`` each, behind one small face.

A model that a graph runs as a *stateful* operator is not deployed as ordinary replicas:
its processes (primary, backup, spare) belong to the graph. Stateless operators use the
ordinary deployed model, with its replicas, batching and restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from parityserve.config import Limits, ServingConfig
from parityserve.core.inputs import check_leaves, scan
from parityserve.datatypes import dtype_to_datatype
from parityserve.errors import (
    ConfigError,
    InvalidInput,
    LimitExceeded,
    MalformedRequest,
    UnknownApplication,
)
from parityserve.runtime.fleet.zygote import ForkServer
from parityserve.runtime.graphs.hams_graph import GraphAnswer, GraphRuntime, Infer
from parityserve.runtime.modelpath.metrics import Metrics
from parityserve.runtime.workers.keys import ServerKeys
from parityserve.runtime.workers.wire import MAX_DIMS

__all__ = ["Graphs", "stateful_models"]


def stateful_models(config: ServingConfig) -> set[str]:
    """Models run as stateful graph operators; each must serve nothing else."""
    stateful = {op.model for g in config.graphs for op in g.operators if op.stateful}
    stateless = {op.model for g in config.graphs for op in g.operators if not op.stateful}
    apps = {m for a in config.applications for m in a.models}
    if clash := sorted(stateful & (stateless | apps)):
        raise ConfigError(f"models {clash} are stateful graph operators and also serve "
                          "statelessly; deploy a second model entry for the stateless use")
    users = [op.model for g in config.graphs for op in g.operators if op.stateful]
    if twice := sorted({m for m in users if users.count(m) > 1}):
        raise ConfigError(f"models {twice} back more than one stateful operator; each "
                          "stateful operator needs a model entry of its own")
    return stateful


class Graphs:
    def __init__(self, config: ServingConfig, infer: Infer, *, keys: ServerKeys | None,
                 clock: Callable[[], float], log_dir: Path | None,
                 metrics: Metrics | None = None, forks: ForkServer | None = None) -> None:
        deployments = {m.name: m for m in config.models}
        self.limits = config.server.limits
        self.runtimes = {g.name: GraphRuntime(g, deployments, infer, keys=keys, clock=clock,
                                              log_dir=log_dir, host=config.server.host,
                                              launcher=config.launcher)
                         for g in config.graphs}
        # The server's one zygote (its model replicas' too, runtime/fleet/zygote.py): the
        # serving system opens and closes it, around the graphs
        self.forks = forks
        for runtime in self.runtimes.values():
            runtime.launcher.forks = self.forks
        if metrics is not None:  # the watchdog's count, per graph and operator, and the
            for name, runtime in self.runtimes.items():  # malformed messages dropped
                runtime.on_expired = functools.partial(metrics.graph_batches_expired, name)
                runtime.on_protocol_error = functools.partial(metrics.graph_protocol_error,
                                                              name)

    def __contains__(self, name: str) -> bool:
        return name in self.runtimes

    async def start(self) -> None:
        await asyncio.gather(*(g.start() for g in self.runtimes.values()))

    async def close(self) -> None:
        await asyncio.gather(*(g.close() for g in self.runtimes.values()))

    def ready(self) -> bool:
        return all(g.ready() for g in self.runtimes.values())

    def state(self) -> dict[str, Any]:
        return {name: g.statistics() for name, g in self.runtimes.items()}

    def get(self, name: str) -> GraphRuntime:
        runtime = self.runtimes.get(name)
        if runtime is None:
            raise UnknownApplication(f"unknown graph {name!r}; serving: {sorted(self.runtimes)}")
        return runtime

    async def predict(self, name: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        """``{"input": x, STREAM_KEY: "s", "label": 3}`` or ``{"input_batch": [...],
        "streams": [...], "labels": [...]}``; one answer per input, in order."""
        runtime = self.get(name)
        _check_rows(body, self.limits)
        rows, streams, labels = graph_items(body, runtime.graph.stream_key)
        _check_streams(streams, self.limits)
        answers = await runtime.predict(rows, streams, labels, runtime.graph.timeout_ms / 1000)
        durable = runtime.mode in ("hams", "remus")  # the others hold no reply
        return [_answer_json(name, a, durable) for a in answers]


def _check_rows(body: dict[str, Any], limits: Limits) -> None:
    """A graph request holds at most ``max_batch_items`` rows, as on the model routes:
    checked before a row is read (50,000 rows once took 24.6 s)."""
    batch = body.get("input_batch")
    if isinstance(batch, list) and len(batch) > limits.max_batch_items:
        raise LimitExceeded(f"'input_batch' has {len(batch)} rows, more than "
                            f"max_batch_items = {limits.max_batch_items}")


def _check_streams(streams: Sequence[str], limits: Limits) -> None:
    """A stream key names a stream, it is not a payload: at most ``max_stream_key_bytes``
    of UTF-8 (a 10 MB key once went to every stateful operator with each batch)."""
    limit = limits.max_stream_key_bytes
    for i, stream in enumerate(streams):
        if len(stream) > limit or len(stream.encode("utf-8", "surrogatepass")) > limit:
            where = f"streams[{i}]" if len(streams) > 1 else "the stream key"
            raise LimitExceeded(f"{where} has more than max_stream_key_bytes = {limit} bytes "
                                "of UTF-8")


def graph_items(body: dict[str, Any], stream_key: str
                ) -> tuple[list[np.ndarray], list[str], list[int]]:
    if ("input" in body) == ("input_batch" in body):
        raise MalformedRequest("the body must have exactly one of 'input' and 'input_batch'")
    if "input" in body:
        inputs = [body["input"]]
        streams = [body.get(stream_key, "")]
        labels = [body.get("label", -1)]
    else:
        inputs = body["input_batch"]
        if not isinstance(inputs, list) or not inputs:
            raise MalformedRequest("'input_batch' must be a non-empty list")
        streams = body.get("streams", [""] * len(inputs))
        labels = body.get("labels", [-1] * len(inputs))
    return _rows(inputs), _checked(streams, str, "stream", len(inputs)), \
        _checked(labels, int, "label", len(inputs))


_FP32 = np.dtype(np.float32)
_WHERE = "graph input"
_MAX_ROW_DIMS = MAX_DIMS - 1  # a batch of rows is one more


def _rows(inputs: Sequence[Any]) -> list[np.ndarray]:
    """Rows of float32 numbers, of one shape, that the worker wire can carry in a batch: a
    deeper row once reached the first operator's model, whose replica answered 500."""
    rows = _float_rows(inputs)
    if rows[0].ndim > _MAX_ROW_DIMS:
        raise InvalidInput(f"{_WHERE}: a row has at most {_MAX_ROW_DIMS} dimensions (the "
                           f"worker wire's {MAX_DIMS}, less the batch's), got {rows[0].ndim}")
    # Refused at the door, as the model routes do: a stateful first operator would otherwise
    # fold NaN or infinity (1e39 is infinity in float32) into its stream's state for good.
    for i, row in enumerate(rows):
        if not np.isfinite(row).all():
            raise InvalidInput(f"{_WHERE}: row {i} holds NaN or infinity (or a number too "
                               "large for float32); graph inputs must be finite")
    return rows


def _float_rows(inputs: Sequence[Any]) -> list[np.ndarray]:
    """Rows of float32 numbers. JSON inputs pass the model routes' check first (no numeric
    strings, booleans or null, which numpy would turn into numbers); V2 tensors must be of
    a number type (a BYTES row's b"abc" failed in numpy's float parser: a 500)."""
    if all(isinstance(x, np.ndarray | np.generic) for x in inputs):  # V2: a tensor's rows
        _check_tensor_rows(inputs)
        with np.errstate(over="ignore"):  # as below
            return [np.ascontiguousarray(x, dtype=np.float32) for x in inputs]
    check_leaves(scan(inputs, max_depth=sys.maxsize, max_elements=sys.maxsize), _FP32, "FP32",
                 _WHERE)
    # 1e39 is finite in JSON and infinity in float32: cast quietly (a RuntimeWarning per
    # request on the server's stderr); the model path refuses the infinity with a 400
    with contextlib.suppress(TypeError, ValueError), np.errstate(over="ignore"):
        whole = np.asarray(inputs, dtype=np.float32)  # one C pass, not one call per row
        if whole.ndim >= 2 and whole[0].size:
            return list(whole)
    try:
        with np.errstate(over="ignore"):
            rows = [np.asarray(x, dtype=np.float32) for x in inputs]
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"graph inputs must be numbers or nested lists of numbers: {exc}"
                           ) from exc
    shapes = {r.shape for r in rows}
    if len(shapes) != 1 or not rows[0].size:
        raise InvalidInput(f"graph inputs must be non-empty and share one shape, got {shapes}")
    return rows


def _check_tensor_rows(rows: Sequence[np.ndarray | np.generic]) -> None:
    """A V2 tensor's rows: of a number type, and rows, not numbers (a tensor of shape [4]
    gave numpy scalars, refused as "got float32")."""
    if rows[0].dtype.kind not in "iuf":  # one tensor: its rows share one dtype
        raise InvalidInput(f"{_WHERE}: FP32 data takes only numbers, got a "
                           f"{dtype_to_datatype(rows[0].dtype)} tensor")
    if isinstance(rows[0], np.generic):
        raise InvalidInput(f"{_WHERE}: a V2 tensor's first dimension counts the rows, so a "
                           f"graph takes two or more dimensions; for one row of "
                           f"{len(rows)} values send shape [1, {len(rows)}]")


def _checked(values: Any, kind: type, what: str, count: int) -> list[Any]:
    if not isinstance(values, list) or len(values) != count:
        raise MalformedRequest(f"one {what} per input is needed ({count})")
    if any(type(v) is not kind for v in values):
        raise MalformedRequest(f"every {what} must be a {kind.__name__}")
    return values


def _answer_json(name: str, answer: GraphAnswer, durable: bool) -> dict[str, Any]:
    output = answer.output
    return {"query_id": str(answer.client), "graph": name,
            "output": output.tolist() if isinstance(output, np.ndarray) else output,
            "seqs": answer.seqs, "durable": durable}
