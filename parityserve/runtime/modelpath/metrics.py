"""Prometheus metrics for one serving system.

Each ``Metrics`` owns its own ``CollectorRegistry`` rather than the process-global one, so
several servers (or tests) can live in one process without "duplicated timeseries" errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from parityserve.errors import RequestError
from parityserve.runtime.modelpath.buffered_histogram import BufferedHistogram
from parityserve.runtime.modelpath.state_metrics import ServingView, StateCollector

__all__ = ["BAD_REQUEST_CODES", "LATENCY_BUCKETS", "REFUSAL_REASONS", "Metrics"]

# From 50 us (a cache hit) to 10 s (a long timeout): sub-ms tails must stay visible.
LATENCY_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)
_BATCH_BUCKETS = tuple(float(2 ** i) for i in range(17))  # 1 .. 65536, the batching ceiling
# Every ``Refusal.reason`` of the connection guards (runtime/frontend/connection.py), the label
# values of parityserve_connections_refused: its series are made at 0 when the server starts, so
# that a dashboard's increase() sees the first refusal (a series born at 1 shows nothing). Kept with
# the metric, not the guards, so the model path's metrics never import the HTTP edge.
REFUSAL_REASONS = ("malformed", "too_many_connections", "too_many_connections_per_address",
                   "host_not_allowed", "body_timeout", "header_timeout", "idle_timeout",
                   "header_too_large")


def _request_error_codes() -> set[str]:
    found, todo = set(), [RequestError]
    while todo:
        cls = todo.pop()
        found.add(cls.code)
        todo += cls.__subclasses__()
    return found


# The ``code`` label values of parityserve_bad_requests, made at 0 at start for the same reason:
# every RequestError's code (what the HTTP edge counts) and the router's own 404 and 405.
BAD_REQUEST_CODES = tuple(sorted(_request_error_codes() | {"not_found", "method_not_allowed"}))


class Metrics:
    """The counters, gauges and histograms the frontend and the serving system update."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._labelled: dict[tuple[Any, tuple[str, ...]], Any] = {}
        self._define_requests()
        self._define_models()
        self._define_replicas()
        self._define_selection()
        self._define_parallelism()
        self._define_graphs()
        self._state_view: Callable[[], ServingView | None] = lambda: None
        self.registry.register(StateCollector(lambda: self._state_view()))

    def _define_requests(self) -> None:
        reg = self.registry
        self._requests = Counter("parityserve_requests", "HTTP requests answered",
                                 ["route", "target", "outcome"], registry=reg)
        self._latency = BufferedHistogram("parityserve_request_latency_seconds",
                                          "Time from request start to response",
                                          ["route", "target"], buckets=LATENCY_BUCKETS,
                                          registry=reg)
        self._bad = Counter("parityserve_bad_requests", "Requests refused with a 4xx",
                            ["code"], registry=reg)
        for code in BAD_REQUEST_CODES:  # at 0, as the refusals below
            self._bad.labels(code)
        self._refused = Counter("parityserve_connections_refused",
                                "Connections closed on a limit or an HTTP framing error",
                                ["reason"], registry=reg)
        for reason in REFUSAL_REASONS:  # at 0: increase() would not see a series born at 1
            self._refused.labels(reason)
        self._defaults = Counter("parityserve_default_outputs",
                                 "Queries answered with the application's default output",
                                 ["app", "reason"], registry=reg)

    def _define_models(self) -> None:
        reg = self.registry
        # observed per request, per query and per batch: counted in bulk (see its module)
        self._queue = BufferedHistogram("parityserve_queue_time_seconds",
                                        "Time a query waited in queue", ["model"],
                                        buckets=LATENCY_BUCKETS, registry=reg)
        self._model_latency = BufferedHistogram(
            "parityserve_model_latency_seconds", "Time from a query entering the model's queue "
            "to its answer (a prediction or a rebuilt one)", ["model"], buckets=LATENCY_BUCKETS,
            registry=reg)
        self._batch = BufferedHistogram("parityserve_batch_size", "Queries per dispatched batch",
                                        ["model"], buckets=_BATCH_BUCKETS, registry=reg)
        self._hits = Counter("parityserve_cache_hits", "Prediction cache hits", ["model"],
                             registry=reg)
        self._misses = Counter("parityserve_cache_misses", "Prediction cache misses",
                               ["model"], registry=reg)
        self._loop_busy = Gauge("parityserve_event_loop_busy", "The frontend event loop's "
                                "smoothed busy share of wall time (on a CPU or waiting for one), "
                                "as batching's busy hold reads it", registry=reg)

    def _define_replicas(self) -> None:
        reg, labels = self.registry, ["model", "replica"]
        self._inflight = Gauge("parityserve_replica_inflight", "Queries in flight on a replica",
                               labels, registry=reg)
        self._restarts = Counter("parityserve_replica_restarts", "Replica restarts", labels,
                                 registry=reg)
        self._up = Gauge("parityserve_replica_up", "1 if the replica is alive", labels,
                         registry=reg)
        self._tasks = Counter("parityserve_redundant_tasks",
                              "Extra tasks sent for redundancy (copies, parity, coded) or "
                              "to find the rows a model raised on (split)",
                              ["model", "kind"], registry=reg)
        self._rebuilt = Counter("parityserve_reconstructed",
                                "Queries answered by decoding instead of their own prediction",
                                ["model", "method"], registry=reg)
        self._byzantine = Counter("parityserve_byzantine_located",
                                  "Coded results the error locator excluded", labels,
                                  registry=reg)
        self._worker_rejected = Counter(
            "parityserve_worker_messages_rejected", "Worker messages dropped, and CURVE keys "
            "refused, by reason", ["reason"], registry=reg)

    def worker_rejected(self, reason: str) -> None:
        """A worker message dropped (malformed, unknown batch, wrong key...) or a key refused."""
        self._worker_rejected.labels(reason).inc()

    def redundant_task(self, model: str, kind: str) -> None:
        self._tasks.labels(model, kind).inc()

    def reconstructed(self, model: str, method: str, n: int) -> None:
        self._rebuilt.labels(model, method).inc(n)

    def byzantine(self, model: str, replica: str) -> None:
        self._byzantine.labels(model, replica).inc()

    def _child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, cached: labels() takes a lock and builds a tuple, and
        these are called per query. Label sets are bounded (apps, models, replicas)."""
        key = (metric, labels)
        child = self._labelled.get(key)
        if child is None:
            child = self._labelled[key] = metric.labels(*labels)
        return child

    def request(self, route: str, target: str, outcome: str, latency_s: float) -> None:
        self._child(self._requests, route, target, outcome).inc()
        self._child(self._latency, route, target).observe(latency_s)

    def bad_request(self, code: str) -> None:
        self._bad.labels(code).inc()

    def connection_refused(self, reason: str) -> None:
        self._refused.labels(reason).inc()

    def queue_time(self, model: str, seconds: float) -> None:
        self._child(self._queue, model).observe(seconds)

    def model_latency(self, model: str, seconds: float) -> None:
        self._child(self._model_latency, model).observe(seconds)

    def batch(self, model: str, size: int) -> None:
        self._child(self._batch, model).observe(size)

    def cache(self, model: str, hit: bool) -> None:
        (self._hits if hit else self._misses).labels(model).inc()

    def watch_event_loop(self, level: Callable[[], float]) -> None:
        """Read the loop's busy level at each scrape (nothing on the hot path)."""
        self._loop_busy.set_function(level)

    def watch_state(self, view: Callable[[], ServingView | None]) -> None:
        """Read SLOs, expected accuracies and graph durability from ``view()`` at each scrape
        (runtime/modelpath/state_metrics.py); the last system to call this is the one read."""
        self._state_view = view

    def set_inflight(self, model: str, replica: str, n: int) -> None:
        self._child(self._inflight, model, replica).set(n)

    def restart(self, model: str, replica: str) -> None:
        self._restarts.labels(model, replica).inc()

    def _define_selection(self) -> None:
        reg, labels = self.registry, ["app", "model"]
        self._selections = Counter("parityserve_selections", "Times a policy asked a model",
                                   labels, registry=reg)
        self._feedback = Counter("parityserve_feedback", "Feedback labels joined per model",
                                 labels, registry=reg)
        self._loss = Counter("parityserve_loss", "Sum of feedback losses per model (divide by "
                             "parityserve_feedback_total for the mean)", labels, registry=reg)
        self._weight = Gauge("parityserve_policy_weight", "A model's normalised policy weight "
                             "in the context last updated", labels, registry=reg)

    def selection(self, app: str, model: str) -> None:
        self._child(self._selections, app, model).inc()

    def loss(self, app: str, model: str, value: float) -> None:
        self._feedback.labels(app, model).inc()
        self._loss.labels(app, model).inc(value)

    def set_weight(self, app: str, model: str, share: float) -> None:
        self._weight.labels(app, model).set(share)

    def set_replica_up(self, model: str, replica: str, up: bool) -> None:
        self._child(self._up, model, replica).set(1 if up else 0)
        # the replica's restart count exists from its first report, at 0: a series born at
        # 1 by its first restart is one that increase(), and so the dashboard, never sees
        self._child(self._restarts, model, replica)

    def observe_default(self, app: str, reason: str) -> None:
        self._defaults.labels(app, reason).inc()

    def _define_graphs(self) -> None:
        self._graph_expired = Counter(
            "parityserve_graph_batches_expired", "Stateful-graph operator batches the watchdog "
            "failed: in flight for longer than the graph's timeout_ms", ["graph", "operator"],
            registry=self.registry)
        self._graph_protocol_errors = Counter(
            "parityserve_graph_protocol_errors", "Messages from a stateful graph's operator "
            "processes dropped as malformed, by the kind they claimed", ["graph", "kind"],
            registry=self.registry)

    def graph_batches_expired(self, graph: str, operator: str, n: int) -> None:
        self._child(self._graph_expired, graph, operator).inc(n)

    def graph_protocol_error(self, graph: str, kind: str) -> None:
        self._child(self._graph_protocol_errors, graph, kind).inc()

    def _define_parallelism(self) -> None:
        reg, labels = self.registry, ["model"]
        self._config = Gauge("parityserve_parallelism_config", "The configuration the "
                             "parallelism controller runs: knob c (requests at once) or intra "
                             "(threads per request)", ["model", "knob"], registry=reg)
        self._lambda = Gauge("parityserve_scheduler_arrival_rate", "The controller's arrival "
                             "rate estimate (queries per second over its window)", labels,
                             registry=reg)
        self._latency_seen = Gauge("parityserve_scheduler_latency_seconds", "Mean latency of "
                                   "the configuration chosen: predicted by the policy's model "
                                   "(NaN without one) or observed over the window",
                                   ["model", "kind"], registry=reg)
        self._switches = Counter("parityserve_scheduler_switches", "Configuration switches "
                                 "the controller applied", ["model", "policy"], registry=reg)

    def parallelism_decision(self, model: str, policy: str, *, c: int, intra: int,
                             arrival_rate: float, predicted_s: float | None,
                             observed_s: float | None, switched: bool) -> None:
        """One controller tick (runtime/fleet/parallelism.py)."""
        self._config.labels(model, "c").set(c)
        self._config.labels(model, "intra").set(intra)
        self._lambda.labels(model).set(arrival_rate)
        nan = float("nan")
        self._latency_seen.labels(model, "predicted").set(
            nan if predicted_s is None else predicted_s)
        self._latency_seen.labels(model, "observed").set(nan if observed_s is None else observed_s)
        counter = self._switches.labels(model, policy)  # present from the first tick, at 0
        if switched:
            counter.inc()

    def render(self) -> tuple[bytes, str]:
        """The exposition body and its content type, for ``GET /metrics``."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
