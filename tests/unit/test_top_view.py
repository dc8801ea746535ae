"""parityserve/top_view.py: rows from two scrapes and the admin state (no I/O, no clock)."""

from __future__ import annotations

import math

from parityserve.top_view import graph_rows, increase, model_rows, parse, quantile, window_base

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
# TYPE parityserve_graph_failovers counter
parityserve_graph_failovers_total{graph="g",operator="s",detection="exit"} 3.0
parityserve_graph_failovers_total{graph="g",operator="s",detection="timeout"} 1.0
# TYPE parityserve_requests counter
parityserve_requests_total{route="predict",target="g",outcome="ok"} 50.0
parityserve_requests_total{route="predict",target="a",outcome="ok"} 7.0
# TYPE parityserve_request_latency_seconds histogram
parityserve_request_latency_seconds_bucket{route="predict",target="g",le="0.01"} 0.0
parityserve_request_latency_seconds_bucket{route="predict",target="g",le="0.1"} 40.0
parityserve_request_latency_seconds_bucket{route="predict",target="g",le="+Inf"} 50.0
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


GRAPH_BEFORE = """\
# TYPE parityserve_graph_failovers counter
parityserve_graph_failovers_total{graph="g",operator="s",detection="exit"} 1.0
parityserve_graph_failovers_total{graph="g",operator="s",detection="timeout"} 1.0
# TYPE parityserve_requests counter
parityserve_requests_total{route="predict",target="g",outcome="ok"} 10.0
"""


def test_graph_rows_count_failovers_as_the_counter_grows_not_by_server_timestamps():
    # STATE's failover records carry server-clock times; they must not be what is counted
    (row,) = graph_rows(parse(GRAPH_BEFORE), parse(AFTER), 10.0, STATE,
                        base=parse(GRAPH_BEFORE))
    assert (row.graph, row.lag, row.synced, row.failovers) == ("g", 3.0, "0/1", 2)
    assert row.rate == 4.0  # 40 graph requests in 10 s; application a's are not the graph's
    assert math.isclose(row.p50_s, 0.01 + 0.09 * 25 / 40)


def test_one_scrape_knows_no_rate_but_knows_replicas_and_state():
    (model,) = model_rows(None, parse(AFTER), 0.0, STATE)
    assert (model.rate, model.p50_s, model.p99_s, model.defaults_per_s,
            model.rebuilt_per_s) == (None,) * 5
    assert (model.replicas_up, model.replicas, model.parallelism) == (1, 2, "c=2 intra=1")
    (graph,) = graph_rows(None, parse(AFTER), 0.0, STATE, base=None)
    assert (graph.rate, graph.p50_s, graph.failovers) == (None, None, None)
    assert (graph.lag, graph.synced) == (3.0, "0/1")


def test_increase_reads_a_counter_that_went_down_as_a_restart():
    before = parse(GRAPH_BEFORE.replace("exit\"} 1.0", "exit\"} 5.0"))
    # exit: 5 -> 3 is a reset, so 3 new; timeout: 1 -> 1, none
    assert increase(before, parse(AFTER), "parityserve_graph_failovers_total", graph="g") == 3
    # a series first seen after the base counts from zero
    assert increase(parse(BEFORE), parse(AFTER), "parityserve_graph_failovers_total") == 4


def test_window_base_is_the_newest_scrape_a_minute_old_else_the_oldest():
    a, b, c, d = (parse(f"# TYPE x counter\nx_total {v}\n") for v in (1, 2, 3, 4))
    assert window_base([(0.0, a)], now=0.0) is None
    assert window_base([(0.0, a), (2.0, b)], now=2.0) is a  # top ran 2 s: since it started
    assert window_base([(0.0, a), (30.0, b), (70.0, c), (95.0, d)], now=95.0) is b
    assert window_base([(0.0, a), (30.0, b), (90.0, c)], now=90.0, window_s=60.0) is b


def test_parity_replicas_are_counted_apart_from_the_models_own():
    """A ParM model configured with 2 replicas and k=2 has a third, parity, replica: the
    replicas column reads 2/2 (as configured), the parity one apart (before: 3/3)."""
    state = {"models": [{"name": "m", "slo_ms": 50.0, "replicas": [
        {"state": "ready", "pool": "data"}, {"state": "ready", "pool": "data"},
        {"state": "starting", "pool": "parity0"}]}]}
    (row,) = model_rows(None, parse(AFTER), 0.0, state)
    assert (row.replicas_up, row.replicas, row.parity_up, row.parity) == (2, 2, 0, 1)
