"""Applications: the selection layer around the model paths.

Per query, an application's policy (``core/selection.py``) picks the models to ask, the
system waits for them until the application's deadline, and the policy combines whatever
arrived. Feedback joins the label with each model's prediction for the same input (from the
cache, recomputed if evicted) and the policy's ``observe`` updates the state of that context,
atomically, in the configured state store.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from parityserve.config import Application
from parityserve.core.selection import Combined, LossFn, Policy, QueryInfo, get_loss, make_policy
from parityserve.errors import UnknownQuery
from parityserve.runtime.serving.state_store import StateStore

__all__ = ["AppRuntime", "QueryRecord", "describe_combined", "read_state"]

log = logging.getLogger(__name__)

# Answered queries are remembered so that feedback can name a query id instead of sending
# its input again. Bounded by count and by the (estimated) size of the inputs kept: a query's
# input can be a JSON list of thousands of numbers, and without a byte bound 100,000 of them
# would hold gigabytes and make every full garbage collection walk them all (tens of ms).
_REMEMBERED_QUERIES = 100_000
_REMEMBERED_BYTES = 64 * 2**20


@dataclass(frozen=True)
class QueryRecord:
    """What feedback needs to know about an answered query."""

    app: str
    context: str
    item: Any
    selected: tuple[str, ...]


@dataclass
class AppRuntime:
    """One application: its settings, policy, loss, and the queries feedback may refer to."""

    config: Application
    policy: Policy
    loss: LossFn
    feedback: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=100_000))
    queries: OrderedDict[str, tuple[QueryRecord, int]] = field(default_factory=OrderedDict)
    remembered_bytes: int = 0

    @classmethod
    def build(cls, config: Application) -> AppRuntime:
        return cls(config, make_policy(config.policy, config.policy_options),
                   get_loss(config.loss))

    def relink(self, config: Application) -> None:
        self.config = config

    def query_info(self, context: str, selected: tuple[str, ...] | None = None) -> QueryInfo:
        return QueryInfo(context=context, models=tuple(self.config.models), selected=selected)

    def state_key(self, context: str) -> str:
        return f"{self.config.name}/{context}"

    def current_state(self, stored: dict[str, Any] | None, context: str = "") -> dict[str, Any]:
        """The stored state brought up to date with the linked models (or a fresh one, when
        there is none or it is malformed: logged, and replaced at the next feedback)."""
        models = list(self.config.models)
        problem = None if stored is None else self.policy.state_problem(stored)
        if problem is not None:
            log.warning("application %r: discarding the stored selection state of context "
                        "%r, which starts afresh: %s", self.config.name, context[:100], problem)
        if stored is None or problem is not None:
            return self.policy.init(models)
        return self.policy.reconcile(stored, models)

    def remember(self, query_id: str, record: QueryRecord) -> None:
        size = approx_bytes(record.item)
        self.queries[query_id] = (record, size)
        self.remembered_bytes += size
        while self.queries and (len(self.queries) > _REMEMBERED_QUERIES
                                or self.remembered_bytes > _REMEMBERED_BYTES):
            _, (_, dropped) = self.queries.popitem(last=False)
            self.remembered_bytes -= dropped

    def recall(self, query_id: str) -> QueryRecord:
        try:
            return self.queries[query_id][0]
        except KeyError:
            raise UnknownQuery(
                f"application {self.config.name!r} has no record of query {query_id!r}; it "
                f"remembers the last {_REMEMBERED_QUERIES} queries, or fewer when their "
                f"inputs take more than {_REMEMBERED_BYTES // 2**20} MiB; send the input "
                "with the feedback instead") from None

    def observe(self, store: StateStore, context: str, query: QueryInfo, label: Any,
                predictions: dict[str, Any]) -> dict[str, Any]:
        """Blocking (store I/O): run from a thread for SQLite/Redis."""
        def step(stored: dict[str, Any] | None) -> dict[str, Any]:
            return self.policy.observe(self.current_state(stored, context), query, label,
                                       predictions, self.loss)

        return store.update(self.state_key(context), step)

    def losses(self, label: Any, predictions: dict[str, Any]) -> dict[str, float]:
        return {m: float(self.loss(p, label)) for m, p in predictions.items()}


def approx_bytes(value: Any) -> int:
    """A cheap estimate of the memory ``value`` holds (CPython object sizes, roughly).

    Constant time per nesting level: a list is costed from its length and its first element,
    which is right for the tensors JSON inputs are and a fair guess otherwise.
    """
    if isinstance(value, np.ndarray):
        return 112 + int(value.nbytes)
    if isinstance(value, list | tuple):
        return 56 + len(value) * (8 + (approx_bytes(value[0]) if value else 0))
    if isinstance(value, dict):
        return 232 + sum(approx_bytes(k) + approx_bytes(v) for k, v in value.items())
    if isinstance(value, str | bytes):
        return 49 + len(value)
    return 32


async def read_state(store: StateStore, app: AppRuntime, context: str) -> dict[str, Any]:
    """The context's state; memory stores are read inline, others off the event loop."""
    key = app.state_key(context)
    stored = store.get(key) if store.description == "memory" else await asyncio.to_thread(
        store.get, key)
    return app.current_state(stored, context)


def describe_combined(combined: Combined, selected: tuple[str, ...]) -> dict[str, Any]:
    """The selection fields a response carries."""
    return {"models": list(selected), "answered": len(combined.used),
            "confidence": round(float(combined.confidence), 6)}
