"""The admission decision (core/admission.py) and the one-pass JSON scan (core/inputs.py)."""

from __future__ import annotations

import math

import pytest

from parityserve.core import admission, inputs
from parityserve.core.admission import (
    UNMEASURED_BATCHES,
    ServiceEstimate,
    admit,
    can_finish,
    pooled,
    queue_bound,
    retry_after,
)
from parityserve.core.inputs import Leaves, scan
from parityserve.errors import LimitExceeded

# 10 rows per 50 ms batch: 5 ms per query, 200 queries/s per replica.
MEASURED = ServiceEstimate(batch_s=0.05, rows=10.0, batches=3)
UNMEASURED = ServiceEstimate()


def test_public_names() -> None:
    assert sorted(admission.__all__) == sorted([
        "UNMEASURED_BATCHES", "Admission", "ServiceEstimate", "admit", "can_finish", "pooled",
        "queue_bound", "retry_after"])
    assert sorted(inputs.__all__) == [
        "BYTES_PREFIX", "EXACT_IN_FLOAT64", "Leaves", "array_dtype", "as_array", "check_leaves",
        "check_raw_size", "decoded_one_by_one", "depth_error", "element_count", "scan",
        "take_elements"]


@pytest.mark.parametrize(("estimate", "slo_s", "replicas", "max_batch", "bound"), [
    (UNMEASURED, 0.1, 1, 64, UNMEASURED_BATCHES * 64),      # conservative before measuring
    (UNMEASURED, 0.1, 3, 8, UNMEASURED_BATCHES * 8 * 3),
    (UNMEASURED, 0.1, 0, 8, UNMEASURED_BATCHES * 8),        # no replica yet counts as one
    (MEASURED, 0.55, 1, 64, 100),                           # (0.55 - 0.05) / 0.005
    (MEASURED, 0.55, 2, 64, 200),                           # twice the replicas, twice
    (MEASURED, 0.05, 1, 64, 1),                             # SLO = one batch: one may wait
    (MEASURED, 0.01, 4, 64, 4),                             # SLO below one batch: one each
])
def test_queue_bound(estimate: ServiceEstimate, slo_s: float, replicas: int, max_batch: int,
                     bound: int) -> None:
    assert queue_bound(estimate, slo_s, replicas, max_batch) == bound


@pytest.mark.parametrize(("depth", "count", "deadline_in", "admitted", "why"), [
    (0, 1, 0.55, True, ""),
    (99, 1, 0.55, True, ""),          # the 100th fits the bound of 100 and its deadline
    (100, 1, 0.55, False, "holds 100 of the 100"),
    (90, 20, 0.55, False, "holds 90 of the 100"),  # a batch request is admitted whole or not
    (10, 1, 0.09, False, "past the deadline"),      # 10*5 ms + 50 ms > 90 ms
    (8, 1, 0.09, True, ""),                         # 8*5 ms + 50 ms = 90 ms: just in time
    (0, 1, 0.01, True, ""),                         # an empty queue always takes a probe
    (1, 1, 0.01, False, "past the deadline"),
    (0, 2, 0.01, False, "past the deadline"),      # a batch is no probe
])
def test_admit_measured(depth: int, count: int, deadline_in: float, admitted: bool,
                        why: str) -> None:
    decision = admit(MEASURED, depth=depth, count=count, now=100.0,
                     deadline=100.0 + deadline_in, slo_s=0.55, replicas=1, max_batch_size=64)
    assert decision.admitted is admitted
    assert why in decision.reason
    assert decision.bound == 100
    assert decision.retry_after_s == (0.0 if admitted else 1.0)


def test_admit_unmeasured_checks_only_the_conservative_bound() -> None:
    bound = UNMEASURED_BATCHES * 4
    near = admit(UNMEASURED, depth=bound - 1, count=1, now=0.0, deadline=1e-9, slo_s=0.1,
                 replicas=1, max_batch_size=4)
    assert near.admitted  # no measurement: nothing to say about its deadline yet
    full = admit(UNMEASURED, depth=bound, count=1, now=0.0, deadline=10.0, slo_s=0.1,
                 replicas=1, max_batch_size=4)
    assert not full.admitted and full.retry_after_s == 1.0


@pytest.mark.parametrize(("depth", "replicas", "seconds"), [
    (0, 1, 1.0),       # at least 1
    (100, 1, 1.0),     # 0.5 s to drain rounds up to 1
    (1000, 1, 5.0),    # 5 s
    (1001, 1, 6.0),    # 5.005 s rounds up
    (1000, 5, 1.0),
])
def test_retry_after_is_whole_seconds_at_least_one(depth: int, replicas: int,
                                                   seconds: float) -> None:
    assert retry_after(MEASURED, depth, replicas) == seconds


@pytest.mark.parametrize(("estimate", "deadline_in", "fits"), [
    (MEASURED, 0.05, True),
    (MEASURED, 0.049, False),
    (UNMEASURED, -1.0, True),  # unmeasured: dispatch (expiry is the queue's business)
])
def test_can_finish(estimate: ServiceEstimate, deadline_in: float, fits: bool) -> None:
    assert can_finish(estimate, 10.0, 10.0 + deadline_in) is fits


def test_service_estimate_is_an_ewma_of_batch_time_and_rows() -> None:
    first = ServiceEstimate().observe(0.1, 4)
    assert (first.batch_s, first.rows, first.batches) == (0.1, 4.0, 1)
    assert first.per_query_s == pytest.approx(0.025)
    second = first.observe(0.2, 8, alpha=0.5)
    assert (second.batch_s, second.rows, second.batches) == (pytest.approx(0.15), 6.0, 2)
    assert UNMEASURED.per_query_s == 0.0 and not UNMEASURED.measured


@pytest.mark.parametrize(("batch_s", "rows"), [(0.1, 0), (-1.0, 3), (math.nan, 3),
                                                (math.inf, 3)])
def test_service_estimate_ignores_unusable_samples(batch_s: float, rows: int) -> None:
    assert MEASURED.observe(batch_s, rows) is MEASURED


# ---- the JSON scan -----------------------------------------------------------------------


@pytest.mark.parametrize(("value", "leaves"), [
    (1.5, Leaves(frozenset({float}), 1)),
    ([1.0, 2, 3.0], Leaves(frozenset({float, int}), 3, containers=1)),
    ([[1.0, 2.0], [3.0, True]], Leaves(frozenset({float, bool}), 4, containers=3)),
    ([[1.0], 2.0], Leaves(frozenset({float}), 2, ragged=True, containers=2)),
    ({"a": [1, 2], "b": None}, Leaves(frozenset({int, type(None)}), 3, ragged=True,
                                      objects=True, containers=2)),
    ([[1.0], {"a": 2.0}], Leaves(frozenset({float}), 2, objects=True, containers=3)),
    ({"a": 1}, Leaves(frozenset({int}), 1, objects=True, containers=1)),
    ([], Leaves(frozenset(), 0, containers=1)),
    ([["x"], [None]], Leaves(frozenset({str, type(None)}), 2, containers=3)),
    ([[1], [[2]]], Leaves(frozenset({int}), 2, ragged=True, containers=4)),  # 2 depths
    ([[], [[]]], Leaves(frozenset(), 0, containers=4)),
])
def test_scan_reports_leaf_types_and_count(value: object, leaves: Leaves) -> None:
    assert scan(value, max_depth=8, max_elements=100) == leaves


@pytest.mark.parametrize(("value", "depth", "ok"), [
    ([[[1.0]]], 1, True),   # three lists at depths 1..3
    ([[[[1.0]]]], 1, False),
    ([[1.0]], 2, True),     # found at depth 2: lists at 2 and 3
    ([[[1.0]]], 2, False),
    ({"a": {"b": {"c": 1}}}, 1, True),
    ({"a": {"b": {"c": {}}}}, 1, False),
])
def test_scan_refuses_nesting_past_max_depth(value: object, depth: int, ok: bool) -> None:
    if ok:
        scan(value, max_depth=3, max_elements=100, depth=depth)
    else:
        with pytest.raises(LimitExceeded, match="max_json_depth = 3"):
            scan(value, max_depth=3, max_elements=100, depth=depth)


@pytest.mark.parametrize(("value", "ok"), [
    ([0.0] * 10, True),
    ([0.0] * 11, False),
    ([[0.0] * 5, [0.0] * 5], True),
    ([[0.0] * 5, [0.0] * 6], False),
    ([[0.0] * 6, [[0.0] * 6]], False),  # stops early: the budget left for the second is 4
])
def test_scan_refuses_more_elements_than_allowed(value: object, ok: bool) -> None:
    if ok:
        assert scan(value, max_depth=8, max_elements=10).count <= 10
    else:
        with pytest.raises(LimitExceeded, match="max_input_elements = 10"):
            scan(value, max_depth=8, max_elements=10)


def test_the_model_pools_its_replicas_rates_so_a_straggler_adds_little() -> None:
    """Guards the pooled estimate: one replica slowed to 3 s beside two answering in 5 ms is a
    model that serves about 400 queries a second, not one whose batches take 3 s (which made
    admission shed the queries a ParM model rebuilds in time, on a loaded machine)."""
    fast = ServiceEstimate(batch_s=0.005, rows=1.0, batches=20)
    slow = ServiceEstimate(batch_s=3.0, rows=1.0, batches=1)
    model = pooled([fast, slow, fast, ServiceEstimate()])  # the unmeasured one is left out
    assert model.batch_s == 0.005 and model.batches == 41
    assert 3 / model.per_query_s == pytest.approx(2 / 0.005 + 1 / 3.0)  # the rates' sum
    assert queue_bound(model, 10.0, 3, 4) > queue_bound(fast, 10.0, 2, 4)  # it adds, a bit
    # of two, the straggler's batch time does not speak for the model; one is its own
    assert pooled([slow, fast]).batch_s == 0.005
    assert pooled([slow]) == slow and pooled([]) == ServiceEstimate()
    assert not pooled([ServiceEstimate()]).measured
