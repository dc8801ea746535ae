"""The contract between the edges and the serving system.

The HTTP and gRPC frontends (``runtime/frontend/``) only talk to an object that satisfies
``ServingSystem``. Every inference request, whichever edge and route it came by, reaches it as
one record, ``InferenceRequest``, and leaves as one ``Answer``: the edge decodes its wire
format into the first and encodes the second, and ``ServingSystem.infer`` decides the rest
(``runtime/serving/face.py``). Unit tests hand the edges a fake; ``runtime/serving/system.py`` is
the real one (queues, workers, cache).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from parityserve.config import (
    Application,
    Deployment,
    FaultConfig,
    ParityConfig,
    RedundancyConfig,
    SchedulerConfig,
    TensorSpec,
)

__all__ = ["Answer", "InferenceRequest", "ModelMetadata", "Prediction", "ServingSystem"]

Api = Literal["clipper", "v2"]


@dataclass(frozen=True, slots=True)
class Prediction:
    """Exactly one answer to one accepted query."""

    query_id: str
    output: Any
    default: bool = False
    default_explanation: str | None = None
    model: str | None = None
    version: int | None = None
    cached: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The Clipper-style response body for this query."""
        out = self.output.tolist() if isinstance(self.output, np.ndarray) else self.output
        if isinstance(out, np.generic):
            out = out.item()
        body: dict[str, Any] = {"query_id": self.query_id, "output": out, "default": self.default}
        if self.default_explanation is not None:
            body["default_explanation"] = self.default_explanation
        if self.model is not None:
            body["model"] = self.model
            body["version"] = self.version
        body.update(self.extra)
        return body


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


@dataclass(frozen=True, slots=True)
class InferenceRequest:
    """One inference request, its wire format decoded, as every edge hands it over.

    ``api`` says which face of the target was asked: ``clipper`` (``POST /{name}/predict``: an
    application's queries, or a graph's rows) or ``v2`` (KServe V2 over HTTP or gRPC: a model,
    or a graph served as one). Which of those ``target`` is, and what follows from it (limits,
    checks, errors), is the serving system's to decide, once, for every edge.
    """

    api: Api
    target: str  # the application, graph or model the URL or the RPC names
    version: int | None = None  # V2: the version asked for; None: the one served
    # Clipper: one query per item, a decoded JSON value or an ``edge_array.EdgeArray`` where
    # the edge decoded plain numbers straight to an array (its ``as_decoded()`` is the value).
    queries: Sequence[Any] = ()
    batched: bool = False  # Clipper: sent as ``input_batch`` (answered with a list)
    # V2: the input tensors by name, in request order, each batch first (a row per query).
    tensors: tuple[tuple[str, np.ndarray], ...] = ()
    outputs: tuple[str, ...] = ()  # V2: the output names asked for (none: every output)
    # Clipper: the body's other keys (``uid``, a graph's stream key, ``label``, ``streams``,
    # ``labels``...); V2: the request's parameters, as plain values.
    parameters: Mapping[str, Any] = field(default_factory=dict)
    request_id: str | None = None  # V2: echoed in the answer
    # The client's own deadline, in seconds from when the edge decoded the request (gRPC's
    # deadline); a model's rows are dropped, not computed, once it has passed. None: the
    # deployment's timeout_ms alone.
    timeout_s: float | None = None

    @property
    def uid(self) -> str | None:
        """Clipper: the user context an application's policy reads (None: the global one);
        the edge has checked that it is a non-empty string when present."""
        uid = self.parameters.get("uid")
        return uid if isinstance(uid, str) else None


@dataclass(frozen=True, slots=True)
class Answer:
    """The answer to one ``InferenceRequest``, for its edge to encode.

    Clipper: ``answers``, one per query in order (a ``Prediction`` for an application, the
    JSON object of a graph's answer). V2: ``output`` named ``output_name`` (rows stacked, one
    per input row) from ``version``; ``rebuilt`` names the rows answered by decoding (row ->
    method) and ``expected`` each method's measured accuracy; a graph's answer has ``seqs``
    (where each row passed each stateful operator) and ``durable``.
    """

    target: str
    answers: Sequence[Prediction | dict[str, Any]] = ()
    version: str | None = None
    output_name: str = "output"
    output: np.ndarray | None = None
    rebuilt: Mapping[int, str] = field(default_factory=dict)
    expected: Mapping[str, float | None] = field(default_factory=dict)
    seqs: list[Any] | None = None
    durable: bool | None = None

    def clipper_json(self) -> list[dict[str, Any]]:
        """The Clipper-style response body of each query."""
        return [a.to_json() if isinstance(a, Prediction) else a for a in self.answers]


class ServingSystem(Protocol):
    """What the edges need. Every method raises ``parityserve.errors`` types only."""

    async def infer(self, request: InferenceRequest) -> Answer:
        """Answer one inference request from any edge: an application's queries, a graph's
        rows, or a model's batch, as ``request.target`` names. Never fewer answers than
        queries or rows; anything refused raises, whichever edge asked, the same error."""
        ...

    def set_graph_fault(self, graph: str, operator: str, state_delay_ms: float) -> None: ...

    def has_graph(self, name: str) -> bool: ...

    def graph_deadline_s(self, name: str) -> float: ...

    def graph_share(self, address: str, target: str) -> AbstractAsyncContextManager[None]:
        """Entered around a request for ``target`` from client ``address``: for a graph, a
        place among that address's (``server.limits.max_graph_requests_per_address``, or
        its ``_shared`` twin while other addresses use the graphs too; one count over every
        edge), waited for up to the graph's deadline, else
        ``TooManyInFlight``; for anything else, nothing."""
        ...

    async def graph_digests(self, graph: str) -> dict[str, Any]: ...

    async def update(self, app: str, uid: str, item: Any, label: Any,
                     query_id: str | None = None) -> dict[str, Any]: ...

    def model_metadata(self, model: str, version: int | None) -> ModelMetadata: ...

    def is_ready(self) -> bool: ...

    def model_ready(self, model: str, version: int | None) -> bool: ...

    async def add_application(self, app: Application) -> None: ...

    async def remove_application(self, name: str) -> None: ...

    async def deploy(self, deployment: Deployment) -> None: ...

    async def set_replicas(self, model: str, replicas: int) -> None: ...

    async def link_models(self, app: str, models: Sequence[str]) -> None: ...

    async def set_faults(self, model: str, replica: str, faults: FaultConfig) -> None: ...

    async def set_parallelism(self, model: str, parallelism: int | None) -> None: ...

    async def set_threads(self, model: str, threads: int) -> None: ...

    async def set_scheduler(self, model: str, scheduler: SchedulerConfig) -> None: ...

    async def remove_scheduler(self, model: str) -> bool: ...

    async def set_redundancy(self, model: str, redundancy: RedundancyConfig,
                             parity: ParityConfig | None) -> None: ...

    def state(self) -> dict[str, Any]: ...
