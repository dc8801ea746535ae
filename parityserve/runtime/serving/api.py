"""The contract between the HTTP layer and the serving system.

The HTTP frontend (``runtime/frontend/http.py``) only talks to an object that satisfies
``ServingSystem``. Unit tests hand it a fake; ``runtime/serving/system.py`` is the real one (queues,
workers, cache).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

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

__all__ = ["ModelMetadata", "Prediction", "ServingSystem"]


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


class ServingSystem(Protocol):
    """What the HTTP layer needs. Every method raises ``parityserve.errors`` types only."""

    async def predict(self, app: str, items: Sequence[Any],
                      uid: str | None = None) -> list[Prediction]:
        """Answer each item (one query each) in context ``uid`` (None: the global context).
        Validates items; never returns fewer answers. An item is a decoded JSON value, or an
        ``edge_array.EdgeArray`` where the HTTP layer decoded plain numbers straight to an
        array (its ``as_decoded()`` is the JSON value)."""
        ...

    def has_graph(self, name: str) -> bool: ...

    async def predict_graph(self, name: str, body: dict[str, Any]) -> list[dict[str, Any]]: ...

    def set_graph_fault(self, graph: str, operator: str, state_delay_ms: float) -> None: ...

    async def graph_digests(self, graph: str) -> dict[str, Any]: ...

    async def update(self, app: str, uid: str, item: Any, label: Any,
                     query_id: str | None = None) -> dict[str, Any]: ...

    async def infer_detailed(self, model: str, version: int | None, batch: np.ndarray
                             ) -> tuple[np.ndarray, dict[int, str]]:
        """Run a V2 batch (first axis = queries) through the model path: the stacked outputs,
        and which rows were rebuilt by decoding (row -> method)."""
        ...

    def expected_accuracy(self, model: str, version: int | None, method: str) -> float | None:
        """How often an answer of ``model`` rebuilt by ``method`` is right, as measured
        (``core/reconstruction.py``); None when nobody measured it."""
        ...

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
