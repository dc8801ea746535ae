"""``parityserve top``'s pure half: per-model and per-graph rows from two ``/metrics`` scrapes
and one ``/admin/state``, and their text. No I/O, no clock: the caller passes both scrapes and
the seconds between them (parityserve/top.py does the reading and the drawing).

With one scrape (``before`` is None) nothing per second can be known: rates and the window's
percentiles are None, which top shows as "n/a". Failovers are counted as the change of
``parityserve_graph_failovers_total`` between scrapes on top's own clock, never from the
server's timestamps (another host's monotonic clock means nothing here)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from parityserve.core.scheduling.pools import DATA_POOL

__all__ = ["GraphRow", "ModelRow", "Scrape", "graph_rows", "increase", "model_rows", "parse",
           "quantile", "window_base"]

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
    rate: float | None  # queries/s sent to its replicas; None with one scrape
    p50_s: float | None  # of the window between the scrapes; NaN when nothing was answered
    p99_s: float | None
    slo_s: float
    replicas_up: int  # the model's own replicas (pool "data"), as configured
    replicas: int
    defaults_per_s: float | None
    rebuilt_per_s: float | None
    parallelism: str
    parity_up: int = 0  # its parity models' replicas (ParM), shown apart: not "replicas"
    parity: int = 0


@dataclass(frozen=True)
class GraphRow:
    graph: str
    rate: float | None  # requests/s on its predict route
    p50_s: float | None
    p99_s: float | None
    lag: float
    synced: str
    failovers: int | None  # since ``base`` (about a minute ago); None with one scrape


def increase(before: Scrape, after: Scrape, name: str, **match: str) -> float:
    """How much a counter grew, series by series; a series that went down was reset (the
    server restarted) and counts from zero, as Prometheus' increase() reads it."""
    grown = 0.0
    old = before.values(name)
    want = set(match.items())
    for labels, value in after.values(name).items():
        if want <= labels:
            prior = old.get(labels, 0.0)
            grown += value - prior if value >= prior else value
    return grown


def _rate(before: Scrape | None, after: Scrape, seconds: float, name: str,
          **match: str) -> float | None:
    if before is None:
        return None
    return increase(before, after, name, **match) / seconds if seconds > 0 else 0.0


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


def _window(before: Scrape | None, after: Scrape, name: str,
            **match: str) -> tuple[float | None, float | None]:
    """p50 and p99 of one histogram's observations between the scrapes."""
    if before is None:
        return None, None
    want = set(match.items())
    buckets = [(float(dict(labels)["le"]), value - before.values(name).get(labels, 0.0))
               for labels, value in after.values(name).items() if want <= labels]
    return quantile(0.5, buckets), quantile(0.99, buckets)


def model_rows(before: Scrape | None, after: Scrape, seconds: float,
               state: Mapping[str, Any]) -> list[ModelRow]:
    """One row per model in ``/admin/state``, its rates over the scrapes' window."""
    defaults = _defaults_by_model(before, after, seconds, state)
    rows = []
    for model in state.get("models", []):
        name = model["name"]
        p50, p99 = _window(before, after, "parityserve_model_latency_seconds_bucket",
                           model=name)
        replicas = model.get("replicas", [])
        data = [r for r in replicas if r.get("pool", DATA_POOL) == DATA_POOL]
        parity = [r for r in replicas if r.get("pool", DATA_POOL) != DATA_POOL]
        rows.append(ModelRow(
            name, _rate(before, after, seconds, "parityserve_queue_time_seconds_count",
                        model=name),
            p50, p99, float(model["slo_ms"]) / 1000, _ready(data), len(data),
            defaults.get(name) if before is not None else None,
            _rate(before, after, seconds, "parityserve_reconstructed_total", model=name),
            _parallelism(after, name), _ready(parity), len(parity)))
    return rows


def _ready(replicas: list[Mapping[str, Any]]) -> int:
    return sum(1 for r in replicas if r.get("state") == "ready")


def _defaults_by_model(before: Scrape | None, after: Scrape, seconds: float,
                       state: Mapping[str, Any]) -> dict[str, float]:
    """Defaults are counted per application: each goes to the models the app asks."""
    out: dict[str, float] = {}
    for app in state.get("applications", []):
        rate = _rate(before, after, seconds, "parityserve_default_outputs_total",
                     app=app["name"]) or 0.0
        for model in app.get("models", []):
            out[model] = out.get(model, 0.0) + rate
    return out


def _parallelism(scrape: Scrape, model: str) -> str:
    knobs = {dict(k)["knob"]: v for k, v in scrape.values("parityserve_parallelism_config")
             .items() if dict(k).get("model") == model}
    if not knobs:
        return "-"
    return f"c={int(knobs.get('c', 0))} intra={int(knobs.get('intra', 0))}"


def graph_rows(before: Scrape | None, after: Scrape, seconds: float,
               state: Mapping[str, Any], base: Scrape | None) -> list[GraphRow]:
    """Per graph: its request rate and p50/p99 over the window, the largest durable lag,
    backups synced / stateful operators, and failovers since ``base`` (see window_base)."""
    rows = []
    for name, graph in state.get("graphs", {}).items():
        stateful = [op for op, o in graph.get("operators", {}).items() if o.get("stateful")]
        lag = max((after.total("parityserve_graph_durable_lag_requests", graph=name,
                               operator=op) for op in stateful), default=0.0)
        synced = sum(1 for op in stateful if graph["operators"][op].get("backup_synced"))
        p50, p99 = _window(before, after, "parityserve_request_latency_seconds_bucket",
                           route="predict", target=name)
        failovers = None if base is None else round(
            increase(base, after, "parityserve_graph_failovers_total", graph=name))
        rows.append(GraphRow(
            name, _rate(before, after, seconds, "parityserve_requests_total", route="predict",
                        target=name),
            p50, p99, lag, f"{synced}/{len(stateful)}", failovers))
    return rows


def window_base(history: Sequence[tuple[float, Scrape]], now: float,
                window_s: float = 60.0) -> Scrape | None:
    """The scrape to count "the last minute" from: the newest one at least ``window_s`` before
    ``now``, else the oldest (top has run for less than a minute). ``history`` is (time on
    top's own clock, scrape), oldest first, the latest being ``now``'s; None with one scrape."""
    if len(history) < 2:
        return None
    older = [scrape for t, scrape in history[:-1] if now - t >= window_s]
    return older[-1] if older else history[0][1]
