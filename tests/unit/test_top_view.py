"""parityserve/top_view.py: rows from two scrapes and the admin state (no I/O, no clock)."""

from __future__ import annotations

import math

from parityserve.top_view import graph_rows, model_rows, parse, quantile

BEFORE = """\
# TYPE parityserve_queue_time_seconds histogram
parityserve_queue_time_seconds_count{model="m"} 10.0
# TYPE parityserve_model_latency_seconds histogram
parityserve_model_latency_seconds_bucket{model="m",le="0.01"} 5.0
parityserve_model_latency_seconds_bucket{model="m",le="0.1"} 10.0
parityserve_model_latency_seconds_bucket{model="m",le="+Inf"} 10.0
# TYPE parityserve_reconstructed_total counter
parityserve_reconstructed_total{model="m",method="berrut"} 1.0
# TYPE parityserve_default_outputs_total counter
parityserve_default_outputs_total{app="a",reason="deadline"} 0.0
"""
AFTER = """\
# TYPE parityserve_queue_time_seconds histogram
parityserve_queue_time_seconds_count{model="m"} 30.0
# TYPE parityserve_model_latency_seconds histogram
parityserve_model_latency_seconds_bucket{model="m",le="0.01"} 15.0
parityserve_model_latency_seconds_bucket{model="m",le="0.1"} 30.0
parityserve_model_latency_seconds_bucket{model="m",le="+Inf"} 30.0
# TYPE parityserve_reconstructed_total counter
parityserve_reconstructed_total{model="m",method="berrut"} 5.0
# TYPE parityserve_default_outputs_total counter
parityserve_default_outputs_total{app="a",reason="deadline"} 2.0
# TYPE parityserve_parallelism_config gauge
parityserve_parallelism_config{model="m",knob="c"} 2.0
parityserve_parallelism_config{model="m",knob="intra"} 1.0
# TYPE parityserve_graph_durable_lag_requests gauge
parityserve_graph_durable_lag_requests{graph="g",operator="s"} 3.0
"""
STATE = {
    "applications": [{"name": "a", "models": ["m"]}],
    "models": [{"name": "m", "slo_ms": 50.0,
                "replicas": [{"state": "ready"}, {"state": "starting"}]}],
    "graphs": {"g": {"operators": {"s": {"stateful": True, "backup_synced": False},
                                   "f": {"stateful": False}},
                     "failovers": [{"detected_at": 100.0}, {"detected_at": 30.0}]}},
}


def test_quantile_is_prometheus_histogram_quantile():
    assert quantile(0.5, [(0.01, 10), (0.1, 20), (math.inf, 20)]) == 0.01
    assert math.isclose(quantile(0.75, [(0.01, 10), (0.1, 20), (math.inf, 20)]), 0.055)
    assert math.isnan(quantile(0.5, []))
    assert quantile(0.99, [(0.01, 0), (math.inf, 4)]) == 0.01  # all past the last bound


def test_model_rows_take_rates_over_the_window_between_scrapes():
    (row,) = model_rows(parse(BEFORE), parse(AFTER), 10.0, STATE)
    assert row.model == "m" and row.rate == 2.0  # 20 queries in 10 s
    assert row.rebuilt_per_s == 0.4 and row.defaults_per_s == 0.2
    assert math.isclose(row.p50_s, 0.01)  # 10 of 20 in the window at or under 10 ms
    assert row.slo_s == 0.05 and (row.replicas_up, row.replicas) == (1, 2)
    assert row.parallelism == "c=2 intra=1"


def test_graph_rows_count_failovers_in_the_last_minute():
    (row,) = graph_rows(parse(AFTER), STATE, now=120.0)
    assert (row.graph, row.lag, row.synced, row.failovers_last_minute) == ("g", 3.0, "0/1", 1)
