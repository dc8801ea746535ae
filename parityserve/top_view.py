"""``parityserve top``'s pure half: per-model and per-graph rows from two ``/metrics`` scrapes
and one ``/admin/state``, and their text. No I/O, no clock: the caller passes both scrapes and
the seconds between them (parityserve/top.py does the reading and the drawing)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["ModelRow", "Scrape", "GraphRow", "graph_rows", "model_rows", "parse", "quantile"]

Labels = frozenset[tuple[str, str]]


@dataclass(frozen=True)
class Scrape:
    """One ``/metrics`` text as ``{sample name: {labels: value}}``."""

    samples: Mapping[str, Mapping[Labels, float]]

    def total(self, name: str, **match: str) -> float:
        """The sum of ``name`` over every series whose labels include ``match``."""
        want = set(match.items())
        return sum(v for labels, v in self.samples.get(name, {}).items() if want <= labels)

    def values(self, name: str) -> Mapping[Labels, float]:
        return self.samples.get(name, {})


def parse(text: str) -> Scrape:
    samples: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return Scrape(samples)


@dataclass(frozen=True)
class ModelRow:
    model: str
    rate: float  # queries/s sent to its replicas
    p50_s: float
    p99_s: float
    slo_s: float
    replicas_up: int
    replicas: int
    defaults_per_s: float
    rebuilt_per_s: float
    parallelism: str


@dataclass(frozen=True)
class GraphRow:
    graph: str
    lag: float
    synced: str
    failovers_last_minute: int


def _rate(before: Scrape, after: Scrape, seconds: float, name: str, **match: str) -> float:
    if seconds <= 0:
        return 0.0
    return max(0.0, after.total(name, **match) - before.total(name, **match)) / seconds


def quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) pairs: linear
    inside the bucket; NaN with no observation."""
    pairs = sorted(buckets)
    if not pairs or pairs[-1][1] <= 0:
        return math.nan
    rank, lower, below = q * pairs[-1][1], 0.0, 0.0
    for upper, count in pairs:
        if count >= rank:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = upper, count
    return lower


def _window_buckets(before: Scrape, after: Scrape, model: str) -> list[tuple[float, float]]:
    name = "parityserve_model_latency_seconds_bucket"
    out = []
    for labels, value in after.values(name).items():
        d = dict(labels)
        if d.get("model") == model:
            out.append((float(d["le"]), value - before.values(name).get(labels, 0.0)))
    return out


def model_rows(before: Scrape, after: Scrape, seconds: float,
               state: Mapping[str, Any]) -> list[ModelRow]:
    """One row per model in ``/admin/state``, its rates over the scrapes' window."""
    defaults = _defaults_by_model(before, after, seconds, state)
    rows = []
    for model in state.get("models", []):
        name = model["name"]
        buckets = _window_buckets(before, after, name)
        replicas = model.get("replicas", [])
        rows.append(ModelRow(
            name, _rate(before, after, seconds, "parityserve_queue_time_seconds_count",
                        model=name),
            quantile(0.5, buckets), quantile(0.99, buckets), float(model["slo_ms"]) / 1000,
            sum(1 for r in replicas if r.get("state") == "ready"), len(replicas),
            defaults.get(name, 0.0),
            _rate(before, after, seconds, "parityserve_reconstructed_total", model=name),
            _parallelism(after, name)))
    return rows


def _defaults_by_model(before: Scrape, after: Scrape, seconds: float,
                       state: Mapping[str, Any]) -> dict[str, float]:
    """Defaults are counted per application: each goes to the models the app asks."""
    out: dict[str, float] = {}
    for app in state.get("applications", []):
        rate = _rate(before, after, seconds, "parityserve_default_outputs_total",
                     app=app["name"])
        for model in app.get("models", []):
            out[model] = out.get(model, 0.0) + rate
    return out


def _parallelism(scrape: Scrape, model: str) -> str:
    knobs = {dict(k)["knob"]: v for k, v in scrape.values("parityserve_parallelism_config")
             .items() if dict(k).get("model") == model}
    if not knobs:
        return "-"
    return f"c={int(knobs.get('c', 0))} intra={int(knobs.get('intra', 0))}"


def graph_rows(scrape: Scrape, state: Mapping[str, Any], now: float) -> list[GraphRow]:
    """Per graph: the largest durable lag, backups synced / stateful operators, and the
    failovers detected in the minute before ``now`` (the server's monotonic clock)."""
    rows = []
    for name, graph in state.get("graphs", {}).items():
        ops = [o for o in graph.get("operators", {}).values() if o.get("stateful")]
        lag = max((scrape.total("parityserve_graph_durable_lag_requests", graph=name,
                                operator=op) for op, o in graph.get("operators", {}).items()
                   if o.get("stateful")), default=0.0)
        synced = sum(1 for o in ops if o.get("backup_synced"))
        recent = sum(1 for f in graph.get("failovers", []) if now - f["detected_at"] <= 60)
        rows.append(GraphRow(name, lag, f"{synced}/{len(ops)}", recent))
    return rows
