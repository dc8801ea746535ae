"""The query router: an application's queries through its policy to its models, and back.

``predict``: the application → its state for the user → ``policy.select`` → the SLO deadline →
admission (shed the request before queueing anything when no linked model can take it) → the
model paths → wait until the deadline → ``policy.combine`` → exactly one answer per query
(``answers.py``). ``update``: feedback → each model's prediction for the input (cached, or
recomputed) → the loss per model → ``policy.observe`` into the state store.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np

from parityserve.config import Limits
from parityserve.core.inputs import scan
from parityserve.core.selection import DEFAULT_CONTEXT, weight_shares
from parityserve.errors import InvalidInput, Overloaded, QueueFull, ServiceError
from parityserve.runtime.modelpath.dispatch import ModelPath
from parityserve.runtime.modelpath.edge_array import EdgeArray
from parityserve.runtime.modelpath.metrics import Metrics
from parityserve.runtime.serving.answers import Asked, answer, no_replica, succeeded
from parityserve.runtime.serving.api import Prediction
from parityserve.runtime.serving.applications import AppRuntime, QueryRecord, read_state
from parityserve.runtime.serving.lookup import find_app, find_model
from parityserve.runtime.serving.settle import settle
from parityserve.runtime.serving.state_store import MemoryStore, StateStore

__all__ = ["QueryRouter"]

log = logging.getLogger(__name__)


class QueryRouter:
    """Answers application queries and learns from feedback."""

    def __init__(self, apps: dict[str, AppRuntime], models: dict[str, ModelPath], *,
                 metrics: Metrics, clock: Callable[[], float], limits: Limits,
                 rng: np.random.Generator | None = None) -> None:
        self.apps = apps
        self.models = models
        self.metrics = metrics
        self.clock = clock
        self.limits = limits
        self.store: StateStore = MemoryStore()  # the real one is opened when the server starts
        self._rng = rng or np.random.default_rng()
        self._query_ids = itertools.count(1)

    # ---- predictions -----------------------------------------------------------------------
    async def predict(self, app: str, items: Sequence[Any],
                      uid: str | None = None) -> list[Prediction]:
        runtime = find_app(self.apps, app)
        context = _context(uid)
        paths = self._linked(runtime)
        inputs = [self._coerce_for(paths, item) for item in items]  # validated before queueing
        state = await self._read_state(runtime, context)
        deadline = self.clock() + runtime.config.slo_ms / 1000
        admitted = _shed_if_all_overloaded(paths.values(), len(inputs), deadline)
        plans = [self._plan(runtime, state, context, paths, x, deadline, admitted)
                 for x in inputs]
        await settle([f for _, asked in plans for f, _ in asked.values()
                      if isinstance(f, asyncio.Future)], max(0.0, deadline - self.clock()))
        return [self._answer(runtime, state, context, paths, x, selected, asked)
                for x, (selected, asked) in zip(inputs, plans, strict=True)]

    def _linked(self, runtime: AppRuntime) -> dict[str, ModelPath]:
        return {m: find_model(self.models, m) for m in runtime.config.models}

    def _coerce_for(self, paths: dict[str, ModelPath], item: Any) -> dict[str, Any]:
        """The item checked against the request limits, then against each linked model's
        signature (once per distinct input form: signature, NaN rule, JSON-to-array rule).
        One pass over the JSON serves both."""
        # An input counts from depth 3 (body, input_batch, item) however it was sent, so one
        # query may nest max_json_depth - 2 levels in either form.
        if isinstance(item, EdgeArray):  # decoded and checked against the limits at the edge
            leaves = item.leaves
        else:
            leaves = scan(item, max_depth=self.limits.max_json_depth,
                          max_elements=self.limits.max_input_elements, depth=3)
        by_form: dict[Any, Any] = {}
        out = {}
        for name, path in paths.items():
            form = path.input_form
            if form not in by_form:
                by_form[form] = path.coerce(item, leaves)
            out[name] = by_form[form]
        return out

    async def _read_state(self, runtime: AppRuntime, context: str) -> dict[str, Any]:
        try:
            return await read_state(self.store, runtime, context)
        except ServiceError as exc:  # a store outage must not stop predictions
            log.warning("state store unavailable (%s); using fresh policy state", exc)
            return runtime.current_state(None)

    def _plan(self, runtime: AppRuntime, state: dict[str, Any], context: str,
              paths: dict[str, ModelPath], x: dict[str, Any], deadline: float,
              admitted: ModelPath | None = None) -> tuple[tuple[str, ...], Asked]:
        """Ask the models the policy selects; ``admitted`` took the whole request already,
        so its queries are not admitted a second time."""
        selected = tuple(runtime.policy.select(state, runtime.query_info(context), self._rng))
        asked: Asked = {}
        shed: list[Overloaded] = []
        for model in selected:
            self.metrics.selection(runtime.config.name, model)
            path = paths[model]
            asked[model] = (_submit(path, x[model], deadline, shed, admitted=path is admitted)
                            if path.has_capacity() else (no_replica(path), False))
        if selected and len(shed) == len(selected):
            raise shed[0]  # every model asked refused it: the query is shed (429/503)
        return selected, asked

    def _answer(self, runtime: AppRuntime, state: dict[str, Any], context: str,
                paths: dict[str, ModelPath], x: dict[str, Any], selected: tuple[str, ...],
                asked: Asked) -> Prediction:
        qid = str(next(self._query_ids))
        runtime.remember(qid, QueryRecord(runtime.config.name, context, x, selected))
        return answer(runtime, state, context, qid, paths, selected, asked, self.metrics)

    # ---- feedback --------------------------------------------------------------------------
    async def update(self, app: str, uid: str, item: Any, label: Any,
                     query_id: str | None = None) -> dict[str, Any]:
        runtime = find_app(self.apps, app)
        if not isinstance(uid, str) or not uid:
            raise InvalidInput("feedback needs a non-empty string 'uid'")
        if label is None:
            raise InvalidInput("feedback needs a 'label'")
        paths = self._linked(runtime)
        record = runtime.recall(query_id) if query_id is not None else None
        inputs = record.item if record else self._coerce_for(paths, item)
        predictions = await self._predictions_for(paths, inputs)
        losses = runtime.losses(label, predictions)  # a malformed label raises InvalidInput
        query = runtime.query_info(uid, record.selected if record else None)
        state = await self._observe(runtime, uid, query, label, predictions)
        self._record_feedback(runtime, losses, state)
        runtime.feedback.append({"uid": uid, "label": label, "at": time.time()})
        return {"ok": True, "uid": uid, "losses": losses, "weights": weight_shares(state),
                "feedback_stored": len(runtime.feedback)}

    async def _predictions_for(self, paths: dict[str, ModelPath],
                               inputs: dict[str, Any]) -> dict[str, Any]:
        """Each linked model's prediction for the input: from the cache, else recomputed."""
        futures = {}
        for name, path in paths.items():
            if path.has_capacity():
                deadline = self.clock() + path.deployment.timeout_ms / 1000
                future = _submit(path, inputs[name], deadline)[0]
                if isinstance(future, asyncio.Future):  # not shed
                    futures[name] = future
        if futures:
            timeout = max(p.deployment.timeout_ms for p in paths.values()) / 1000
            await settle(futures.values(), timeout)
        return {m: f.result() for m, f in futures.items() if succeeded(f)}

    async def _observe(self, runtime: AppRuntime, context: str, query: Any, label: Any,
                       predictions: dict[str, Any]) -> dict[str, Any]:
        args = (self.store, context, query, label, predictions)
        if self.store.description == "memory":
            return runtime.observe(*args)
        return await asyncio.to_thread(runtime.observe, *args)

    def _record_feedback(self, runtime: AppRuntime, losses: dict[str, float],
                         state: dict[str, Any]) -> None:
        app = runtime.config.name
        for model, value in losses.items():
            self.metrics.loss(app, model, value)
        for model, share in weight_shares(state).items():
            self.metrics.set_weight(app, model, share)


def _shed_if_all_overloaded(paths: Collection[ModelPath], count: int, deadline: float
                            ) -> ModelPath | None:
    """Refuse an application's request when every model it links would shed it; else the
    first model that admitted all ``count`` queries (None: the application links none).

    The rule for applications: a request is shed (Overloaded, 429/503) before anything is
    queued when no linked model can take all its queries, and a query is shed when every
    model the policy asks for it refuses it. A model that refuses while another asked model
    accepts counts as not answering: the policy combines the others, or the default answers.
    (When a later query of a batch is shed, earlier ones already queued are still computed
    and cached, not answered.)
    """
    first: Overloaded | None = None
    for path in paths:
        try:
            path.admit(count, deadline)
        except Overloaded as exc:
            first = first or exc
            continue
        return path
    if first is not None:
        raise first
    return None


def _submit(path: ModelPath, item: Any, deadline: float,
            shed: list[Overloaded] | None = None, *, admitted: bool = False
            ) -> tuple[Any, bool]:
    """Queue one item; a model that sheds it counts as not answering (the reason)."""
    try:
        return path.submit(item, deadline, admitted=admitted)
    except Overloaded as exc:
        if shed is not None:
            shed.append(exc)
        return f"overloaded: {exc}", False
    except QueueFull:
        path.shed += 1
        return f"queue full: model {path.name!r} has {len(path.queue)} queries waiting", False


def _context(uid: str | None) -> str:
    """Selection state is per user or session; queries that name none share one context."""
    if uid is None:
        return DEFAULT_CONTEXT
    if not isinstance(uid, str) or not uid:
        raise InvalidInput("'uid' must be a non-empty string")
    return uid
