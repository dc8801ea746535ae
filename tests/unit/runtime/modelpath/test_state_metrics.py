"""runtime/modelpath/state_metrics.py: SLOs, expected accuracies and graph durability, read at
scrape."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from parityserve.core.reconstruction import ExpectedAccuracy
from parityserve.runtime.modelpath.metrics import Metrics
from parityserve.runtime.modelpath.state_metrics import failover_phases, member_nodes


def _samples(metrics: Metrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = generate_latest(metrics.registry).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _value(samples: dict[Any, float], name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def _graph_stats(failovers: list[dict[str, Any]], recovering: bool = False) -> dict[str, Any]:
    return {"recovering": recovering, "failovers": failovers, "operators": {
        "feat": {"stateful": False, "last_seq": 9},
        "seq1": {"stateful": True, "last_seq": 12, "durable": 9, "backup_synced": True},
        "seq2": {"stateful": True, "last_seq": 12, "durable": None, "backup_synced": False}}}


def _system(graph_stats: dict[str, Any]) -> SimpleNamespace:
    runtime = SimpleNamespace(statistics=lambda: graph_stats)
    expected = ExpectedAccuracy({"berrut": 0.9, "parm-subtraction": 0.8}, "a test")
    return SimpleNamespace(
        apps={"a": SimpleNamespace(config=SimpleNamespace(slo_ms=20.0))},
        models={"m": SimpleNamespace(slo_s=0.02, expected=expected),
                "plain": SimpleNamespace(slo_s=0.5, expected=None)},
        graphs=SimpleNamespace(runtimes={"stocks": runtime}))


def test_nothing_serving_gives_empty_families_not_an_error():
    samples = _samples(Metrics())
    assert not [k for k in samples if k[0].startswith(("parityserve_graph_", "parityserve_"
                                                      "application_slo"))]


def test_slos_and_expected_accuracy_per_model():
    metrics = Metrics()
    metrics.watch_state(lambda: _system(_graph_stats([])))
    s = _samples(metrics)
    assert _value(s, "parityserve_application_slo_seconds", app="a") == 0.02
    assert _value(s, "parityserve_model_slo_seconds", model="plain") == 0.5
    assert _value(s, "parityserve_reconstruction_expected_accuracy",
                  model="m", method="berrut") == 0.9
    assert _value(s, "parityserve_reconstruction_expected_accuracy",
                  model="plain", method="berrut") is None


def test_durability_per_stateful_operator():
    metrics = Metrics()
    metrics.watch_state(lambda: _system(_graph_stats([], recovering=True)))
    s = _samples(metrics)
    assert _value(s, "parityserve_graph_durable_lag_requests", graph="stocks",
                  operator="seq1") == 3
    # no durability held in this mode: no lag to report, not a lag of 0
    assert _value(s, "parityserve_graph_durable_lag_requests", graph="stocks",
                  operator="seq2") is None
    assert _value(s, "parityserve_graph_backup_synced", graph="stocks", operator="seq1") == 1
    assert _value(s, "parityserve_graph_backup_synced", graph="stocks", operator="seq2") == 0
    assert _value(s, "parityserve_graph_backup_synced", graph="stocks", operator="feat") is None
    assert _value(s, "parityserve_graph_recovering", graph="stocks") == 1
    # a stateful operator's failover counter exists at 0 before its first failover
    assert _value(s, "parityserve_graph_failovers_total", graph="stocks", operator="seq1",
                  detection="exit") == 0


def test_failovers_are_counted_with_their_phases():
    records = [{"op": "seq1", "detection": "exit", "detected_at": 10.0,
                "protocol_done_at": 10.25, "first_reply_at": 10.5},
               {"op": "seq1", "detection": "timeout", "detected_at": 20.0,
                "protocol_done_at": 20.5, "first_reply_at": None}]
    assert failover_phases(records[0]) == {"protocol": 0.25, "first_reply": 0.25}
    assert failover_phases(records[1]) == {"protocol": 0.5}
    metrics = Metrics()
    metrics.watch_state(lambda: _system(_graph_stats(records)))
    s = _samples(metrics)
    for detection in ("exit", "timeout"):
        assert _value(s, "parityserve_graph_failovers_total", graph="stocks", operator="seq1",
                      detection=detection) == 1
    labels = {"graph": "stocks", "operator": "seq1"}
    assert _value(s, "parityserve_graph_failover_phase_seconds_count", **labels,
                  phase="protocol") == 2
    assert _value(s, "parityserve_graph_failover_phase_seconds_sum", **labels,
                  phase="protocol") == 0.75
    assert _value(s, "parityserve_graph_failover_phase_seconds_count", **labels,
                  phase="first_reply") == 1


def test_member_nodes_per_stateful_operator():
    """The graph's placement (issue 41): on how many nodes each operator's members run."""
    stats = _graph_stats([])
    ops = stats["operators"]
    ops["seq1"].update(primary_node="n1", backup_node="n2", spare_node="n3")
    ops["seq2"].update(primary_node="n1", backup_node="n1", spare_node=None)  # spare pending
    metrics = Metrics()
    metrics.watch_state(lambda: _system(stats))
    s = _samples(metrics)
    assert _value(s, "parityserve_graph_member_nodes", graph="stocks", operator="seq1") == 3
    assert _value(s, "parityserve_graph_member_nodes", graph="stocks", operator="seq2") == 1
    assert _value(s, "parityserve_graph_member_nodes", graph="stocks", operator="feat") is None
    local = {"primary_node": "local", "backup_node": "local", "spare_node": "local"}
    assert member_nodes(local) == 1
