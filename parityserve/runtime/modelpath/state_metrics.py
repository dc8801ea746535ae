"""Metrics read from the serving system's state at scrape time, not counted on the hot path.

SLOs, the expected accuracy of rebuilt answers and a stateful graph's durability (lag, backup
sync, failovers with their phases) already live in the objects that decide them; this
collector turns them into samples each time ``/metrics`` is read, so no request pays for them
and they can never drift from what ``/admin/state`` says.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from parityserve.core.hams.placement import ROLES

__all__ = ["ServingView", "StateCollector", "failover_phases", "member_nodes"]


class ServingView(Protocol):
    """What the collector reads: the system's apps, models and graphs (duck-typed)."""

    @property
    def apps(self) -> Mapping[str, Any]: ...

    @property
    def models(self) -> Mapping[str, Any]: ...

    @property
    def graphs(self) -> Any: ...


@dataclass(frozen=True)
class _Families:
    app_slo: GaugeMetricFamily
    model_slo: GaugeMetricFamily
    expected: GaugeMetricFamily
    lag: GaugeMetricFamily
    synced: GaugeMetricFamily
    member_nodes: GaugeMetricFamily
    recovering: GaugeMetricFamily
    failovers: CounterMetricFamily
    phases: SummaryMetricFamily


def _families() -> _Families:
    g, op = ["graph"], ["graph", "operator"]
    return _Families(
        GaugeMetricFamily("parityserve_application_slo_seconds",
                          "The application's latency objective (slo_ms)", labels=["app"]),
        GaugeMetricFamily("parityserve_model_slo_seconds", "The latency objective the model's "
                          "scheduler works to (its tightest application's)", labels=["model"]),
        GaugeMetricFamily("parityserve_reconstruction_expected_accuracy", "How often an answer "
                          "rebuilt by this method is right (0..1), as measured offline",
                          labels=["model", "method"]),
        GaugeMetricFamily("parityserve_graph_durable_lag_requests", "Requests a stateful "
                          "operator has taken whose state is not yet durable on its backup",
                          labels=op),
        GaugeMetricFamily("parityserve_graph_backup_synced", "1 if the stateful operator's "
                          "backup holds a full copy of its state", labels=op),
        GaugeMetricFamily("parityserve_graph_member_nodes", "Distinct nodes the stateful "
                          "operator's running members (primary, backup, spare) are on: 3 when "
                          "one node's loss takes at most one of them; 1 on the local launcher "
                          "(the frontend's host)", labels=op),
        GaugeMetricFamily("parityserve_graph_recovering", "1 while the graph recovers from a "
                          "lost member", labels=g),
        CounterMetricFamily("parityserve_graph_failovers", "Stateful primaries lost and "
                            "replaced, by how the loss was detected",
                            labels=["graph", "operator", "detection"]),
        SummaryMetricFamily("parityserve_graph_failover_phase_seconds", "Time in each phase "
                            "of a failover: protocol (loss detected to resumed) and first_reply "
                            "(resumed to the first reply past the rollback)",
                            labels=["graph", "operator", "phase"]),
    )


def member_nodes(entry: Mapping[str, Any]) -> int:
    """How many nodes an operator's members are on, from ``/admin/state``'s entry (a member
    whose node Ray has not said yet is left out)."""
    return len({entry.get(f"{role}_node") for role in ROLES} - {None})


def failover_phases(record: Mapping[str, Any]) -> dict[str, float]:
    """A failover record's phases in seconds; a phase not yet reached is left out."""
    phases = {"protocol": float(record["protocol_done_at"]) - float(record["detected_at"])}
    first = record.get("first_reply_at")
    if first is not None:
        phases["first_reply"] = float(first) - float(record["protocol_done_at"])
    return phases


class StateCollector(Collector):
    """``registry.register(StateCollector(lambda: system))``; None while nothing serves."""

    def __init__(self, view: Callable[[], ServingView | None]) -> None:
        self._view = view

    def collect(self) -> Iterator[Metric]:
        fam = _families()
        system = self._view()
        if system is not None:
            _serving(system, fam)
            graphs = getattr(system.graphs, "runtimes", None) or {}
            for name, runtime in graphs.items():
                _graph(name, runtime.statistics(), fam)
        yield from (getattr(fam, f) for f in fam.__dataclass_fields__)


def _serving(system: ServingView, fam: _Families) -> None:
    for name, app in system.apps.items():
        fam.app_slo.add_metric([name], app.config.slo_ms / 1000)
    for name, path in system.models.items():
        fam.model_slo.add_metric([name], path.slo_s)
        expected = getattr(path, "expected", None)
        for method, accuracy in (expected.by_method.items() if expected else ()):
            fam.expected.add_metric([name, method], accuracy)


def _graph(name: str, stats: Mapping[str, Any], fam: _Families) -> None:
    fam.recovering.add_metric([name], 1.0 if stats.get("recovering") else 0.0)
    for op, entry in stats.get("operators", {}).items():
        if not entry.get("stateful"):
            continue
        durable = entry.get("durable")
        if durable is not None:
            fam.lag.add_metric([name, op], max(0, entry["last_seq"] - durable))
        fam.synced.add_metric([name, op], 1.0 if entry.get("backup_synced") else 0.0)
        fam.member_nodes.add_metric([name, op], member_nodes(entry))
    stateful = [op for op, entry in stats.get("operators", {}).items() if entry.get("stateful")]
    _failovers(name, stateful, stats.get("failovers", ()), fam)


def _failovers(name: str, ops: Iterable[str], records: Iterable[Mapping[str, Any]],
               fam: _Families) -> None:
    """Every stateful operator has its series from the start (at 0), so ``increase()`` sees
    the first failover as one."""
    counts: dict[tuple[str, str], int] = {}
    phases: dict[tuple[str, str], list[float]] = {}
    for record in records:
        key = (record["op"], record["detection"])
        counts[key] = counts.get(key, 0) + 1
        for phase, seconds in failover_phases(record).items():
            phases.setdefault((record["op"], phase), []).append(seconds)
    for op in ops:
        for detection in ("exit", "timeout"):
            counts.setdefault((op, detection), 0)
    for (op, detection), n in sorted(counts.items()):
        fam.failovers.add_metric([name, op, detection], n)
    for (op, phase), seen in sorted(phases.items()):
        fam.phases.add_metric([name, op, phase], count_value=len(seen), sum_value=sum(seen))
