"""One application query's answer, from what its models returned by the deadline.

The policy combines the predictions that arrived; the answer is that output (flagged when a
model's part was rebuilt by decoding, with the decoding method and its expected accuracy),
or the application's default output with the reason: nothing usable arrived, the policy
failed, its confidence is below the threshold, or a rebuilt part is expected to be right
less often than the application's ``min_expected_accuracy`` (``core/reconstruction.py``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from parityserve.config import Application
from parityserve.core.reconstruction import Rebuilt, below_floor
from parityserve.errors import PredictError
from parityserve.runtime.modelpath.dispatch import ModelPath, QueryExpired
from parityserve.runtime.modelpath.metrics import Metrics
from parityserve.runtime.serving.api import Prediction
from parityserve.runtime.serving.applications import AppRuntime, describe_combined

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
        parts = _flag_rebuilt(extra, rebuilt, paths, one)
        reason = below_floor(app.min_expected_accuracy, parts)
        if reason is not None:
            return default(app, qid, reason, metrics, extra)
    return Prediction(qid, combined.output, model=one,
                      version=paths[one].version if one else None, cached=cached, extra=extra)


def _flag_rebuilt(extra: dict[str, Any], rebuilt: dict[str, str],
                  paths: dict[str, ModelPath], one: str | None) -> list[Rebuilt]:
    """Flag the answer with each rebuilt part's method and its expected accuracy (None when
    nobody measured it), and where that number comes from."""
    parts = [Rebuilt(m, how, paths[m].expected_accuracy(how)) for m, how in rebuilt.items()]
    sources = {p.model: s.source for p in parts if (s := paths[p.model].expected) is not None}
    if one is not None:
        extra["reconstructed"] = parts[0].method
        extra["expected_accuracy"] = parts[0].expected
        if sources:
            extra["expected_accuracy_source"] = sources[one]
    else:
        extra["reconstructed"] = rebuilt
        extra["expected_accuracy"] = {p.model: p.expected for p in parts}
        if sources:
            extra["expected_accuracy_source"] = sources
    return parts


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
