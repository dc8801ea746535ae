"""Applications: the selection layer around the model paths.

Per query, an application's policy (``core/selection.py``) picks the models to ask, the
system waits for them until the application's deadline, and the policy combines whatever
arrived. Feedback joins the label with each model's prediction for the same input (from the
cache, recomputed if evicted) and the policy's ``observe`` updates the state of that context,
atomically, in the configured state store.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from parityserve.config import Application
from parityserve.core.selection import Combined, LossFn, Policy, QueryInfo, get_loss, make_policy
from parityserve.errors import UnknownQuery
from parityserve.runtime.state_store import StateStore

__all__ = ["AppRuntime", "QueryRecord", "describe_combined", "read_state"]

_REMEMBERED_QUERIES = 100_000  # enough to join feedback that arrives minutes later


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
    queries: OrderedDict[str, QueryRecord] = field(default_factory=OrderedDict)

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

    def current_state(self, stored: dict[str, Any] | None) -> dict[str, Any]:
        """The stored state brought up to date with the linked models (or a fresh one)."""
        models = list(self.config.models)
        if stored is None:
            return self.policy.init(models)
        return self.policy.reconcile(stored, models)

    def remember(self, query_id: str, record: QueryRecord) -> None:
        self.queries[query_id] = record
        while len(self.queries) > _REMEMBERED_QUERIES:
            self.queries.popitem(last=False)

    def recall(self, query_id: str) -> QueryRecord:
        try:
            return self.queries[query_id]
        except KeyError:
            raise UnknownQuery(
                f"application {self.config.name!r} has no record of query {query_id!r}; it "
                f"remembers the last {_REMEMBERED_QUERIES} queries") from None

    def observe(self, store: StateStore, context: str, query: QueryInfo, label: Any,
                predictions: dict[str, Any]) -> dict[str, Any]:
        """Blocking (store I/O): run from a thread for SQLite/Redis."""
        def step(stored: dict[str, Any] | None) -> dict[str, Any]:
            return self.policy.observe(self.current_state(stored), query, label, predictions,
                                       self.loss)

        return store.update(self.state_key(context), step)

    def losses(self, label: Any, predictions: dict[str, Any]) -> dict[str, float]:
        return {m: float(self.loss(p, label)) for m, p in predictions.items()}


async def read_state(store: StateStore, app: AppRuntime, context: str) -> dict[str, Any]:
    """The context's state; memory stores are read inline, others off the event loop."""
    key = app.state_key(context)
    stored = store.get(key) if store.description == "memory" else await asyncio.to_thread(
        store.get, key)
    return app.current_state(stored)


def describe_combined(combined: Combined, selected: tuple[str, ...]) -> dict[str, Any]:
    """The selection fields a response carries."""
    return {"models": list(selected), "answered": len(combined.used),
            "confidence": round(float(combined.confidence), 6)}
