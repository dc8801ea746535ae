"""One application query's answer, from what its models returned by the deadline.

The policy combines the predictions that arrived; the answer is that output (flagged when a
model's part was rebuilt by decoding), or the application's default output with the reason:
nothing usable arrived, the policy failed, or its confidence is below the threshold.
"""

from __future__ import annotations

import asyncio
from typing import Any

from parityserve.config import Application
from parityserve.errors import PredictError
from parityserve.runtime.api import Prediction
from parityserve.runtime.applications import AppRuntime, describe_combined
from parityserve.runtime.dispatch import ModelPath, QueryExpired
from parityserve.runtime.metrics import Metrics

__all__ = ["Asked", "answer", "no_replica", "succeeded"]

# Per model asked: (its future, or the reason it was not queued; whether it came from cache).
Asked = dict[str, tuple[Any, bool]]


def answer(runtime: AppRuntime, state: dict[str, Any], context: str, qid: str,
           paths: dict[str, ModelPath], selected: tuple[str, ...], asked: Asked,
           metrics: Metrics) -> Prediction:
    app = runtime.config
    arrived = {m: f.result() for m, (f, _) in asked.items() if succeeded(f)}
    try:
        combined = runtime.policy.combine(state, runtime.query_info(context, selected), arrived)
    except PredictError as exc:
        return default(app, qid, f"error: {exc}", metrics)
    if combined.output is None:
        return default(app, qid, _missing_reason(app, paths, asked), metrics)
    extra = describe_combined(combined, selected)
    threshold = app.confidence_threshold
    if threshold is not None and combined.confidence < threshold:
        return default(app, qid, f"low confidence: {combined.confidence:.2f} is below the "
                       f"application's threshold {threshold:g}", metrics, extra)
    one = combined.used[0] if len(combined.used) == 1 else None
    cached = all(asked[m][1] for m in combined.used)
    rebuilt = {m: how for m in combined.used
               if (how := paths[m].reconstruction(asked[m][0])) is not None}
    if rebuilt:  # answered by decoding, not by the model's own prediction
        extra["reconstructed"] = next(iter(rebuilt.values())) if one else rebuilt
    return Prediction(qid, combined.output, model=one,
                      version=paths[one].version if one else None, cached=cached, extra=extra)


def default(app: Application, qid: str, reason: str, metrics: Metrics,
            extra: dict[str, Any] | None = None) -> Prediction:
    metrics.observe_default(app.name, reason.split(":")[0])
    return Prediction(qid, app.default_output, default=True, default_explanation=reason,
                      extra=extra or {})


def _missing_reason(app: Application, paths: dict[str, ModelPath], asked: Asked) -> str:
    """Why nothing usable arrived, from the first model that did not answer."""
    model, (future, _) = next(iter(asked.items()))
    path = paths[model]
    if isinstance(future, str):
        return future  # decided before queueing: queue full or no replica
    if future.done():
        if isinstance(future.exception(), QueryExpired):
            return f"deadline: {future.exception()}"
        return f"error: {future.exception()}"
    if not path.has_capacity():
        return no_replica(path)
    return f"deadline: model {path.name!r} did not answer within the {app.slo_ms:g} ms SLO"


def succeeded(future: Any) -> bool:
    return isinstance(future, asyncio.Future) and future.done() and future.exception() is None


def no_replica(path: ModelPath) -> str:
    return f"unavailable: model {path.name!r} has no running replica"
