"""AIMD adaptive batch sizing and delayed batching (parityserve.core.batching)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parityserve.core import batching
from parityserve.core.batching import AIMDController, AIMDStats, BatchDecision, decide_batch
from parityserve.errors import ConfigError

SLO = 0.1
ON_TIME = 0.05
LATE = 0.2


def test_public_names() -> None:
    assert sorted(batching.__all__) == [
        "AIMDController", "AIMDStats", "BatchDecision", "decide_batch"]


# --- AIMD -----------------------------------------------------------------------------


def test_full_on_time_batches_grow_additively_up_to_the_ceiling() -> None:
    c = AIMDController(ceiling=5, slo_s=SLO, additive_step=2)
    sizes = []
    for _ in range(5):
        c.observe(c.max_batch_size, ON_TIME)
        sizes.append(c.max_batch_size)
    assert sizes == [3, 5, 5, 5, 5]
    assert c.statistics().increases == 2


def test_non_full_on_time_batch_changes_nothing() -> None:
    c = AIMDController(ceiling=64, slo_s=SLO, initial=10)
    c.observe(9, ON_TIME)
    assert c.max_batch_size == 10
    c.observe(10, ON_TIME)
    assert c.max_batch_size == 11


def test_late_batch_backs_off_multiplicatively() -> None:
    c = AIMDController(ceiling=1000, slo_s=SLO, initial=100)
    c.observe(100, LATE)
    assert c.max_batch_size == 90
    c.observe(3, LATE)  # back-off applies whatever the batch size was
    assert c.max_batch_size == 81
    assert c.statistics().backoffs == 2


@pytest.mark.parametrize(
    ("size", "expected"), [(1, 1), (2, 1), (5, 4), (9, 8), (10, 9), (11, 9), (20, 18)]
)
def test_back_off_always_shrinks_small_sizes(size: int, expected: int) -> None:
    c = AIMDController(ceiling=64, slo_s=SLO, initial=size)
    c.observe(size, LATE)
    assert c.max_batch_size == expected


def test_latency_equal_to_slo_is_on_time() -> None:
    c = AIMDController(ceiling=8, slo_s=SLO, initial=4)
    c.observe(4, SLO)
    assert c.max_batch_size == 5


def test_sawtooth_sequence_around_a_latency_knee() -> None:
    # A model whose batches take 10 ms per query: batches above 10 queries miss 100 ms.
    c = AIMDController(ceiling=64, slo_s=SLO, initial=1)
    history = []
    for _ in range(30):
        size = c.max_batch_size
        c.observe(size, 0.01 * size)
        history.append(c.max_batch_size)
    assert history[:10] == list(range(2, 12))
    assert history[10] == 9  # 11 queries took 110 ms: floor(11 * 0.9) = 9
    assert max(history) == 11 and min(history[10:]) >= 9


def test_set_ceiling_clamps_and_set_slo_changes_the_target() -> None:
    c = AIMDController(ceiling=32, slo_s=SLO, initial=20)
    c.set_ceiling(8)
    assert c.max_batch_size == 8
    c.observe(8, ON_TIME)
    assert c.max_batch_size == 8  # cannot grow past the new ceiling
    c.set_slo(0.01)
    c.observe(8, ON_TIME)  # 50 ms is now late
    assert c.max_batch_size == 7
    c.set_ceiling(100)
    assert c.max_batch_size == 7  # a larger ceiling does not itself grow the size


def test_statistics_is_a_frozen_snapshot() -> None:
    c = AIMDController(ceiling=4, slo_s=SLO)
    c.observe(1, ON_TIME)
    c.observe(2, LATE)
    stats = c.statistics()
    assert stats == AIMDStats(max_batch_size=1, ceiling=4, slo_s=SLO, increases=1, backoffs=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.max_batch_size = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ceiling": 0, "slo_s": SLO}, "ceiling"),
        ({"ceiling": 4, "slo_s": 0.0}, "SLO"),
        ({"ceiling": 4, "slo_s": SLO, "additive_step": 0}, "additive_step"),
        ({"ceiling": 4, "slo_s": SLO, "backoff": 1.0}, "backoff"),
        ({"ceiling": 4, "slo_s": SLO, "backoff": 0.0}, "backoff"),
        ({"ceiling": 4, "slo_s": SLO, "initial": 5}, "initial"),
        ({"ceiling": 4, "slo_s": SLO, "initial": 0}, "initial"),
    ],
)
def test_invalid_settings_are_config_errors(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        AIMDController(**kwargs)  # type: ignore[arg-type]


def test_setters_validate() -> None:
    c = AIMDController(ceiling=4, slo_s=SLO)
    with pytest.raises(ValueError, match="SLO"):
        c.set_slo(-1.0)
    with pytest.raises(ConfigError, match="ceiling"):
        c.set_ceiling(0)
    assert c.statistics().ceiling == 4


@given(
    ceiling=st.integers(1, 200),
    backoff=st.floats(0.05, 0.95),
    step=st.integers(1, 10),
    events=st.lists(st.tuples(st.integers(0, 300), st.booleans()), max_size=100),
)
def test_size_always_within_bounds(
    ceiling: int, backoff: float, step: int, events: list[tuple[int, bool]]
) -> None:
    c = AIMDController(ceiling, SLO, additive_step=step, backoff=backoff)
    for batch_size, late in events:
        before = c.max_batch_size
        c.observe(batch_size, LATE if late else ON_TIME)
        after = c.max_batch_size
        assert 1 <= after <= ceiling
        if late:
            assert after == 1 or after < before
        else:
            assert after >= before


# --- delayed batching -------------------------------------------------------------------

DISPATCH_CASES = [
    # queue_len, oldest, now, max_batch, max_delay, expected
    pytest.param(0, None, 5.0, 8, 0.01, BatchDecision(False, 0, None), id="empty"),
    pytest.param(0, None, 5.0, 8, 0.0, BatchDecision(False, 0, None), id="empty-no-delay"),
    pytest.param(8, 5.0, 5.0, 8, 0.01, BatchDecision(True, 8, None), id="exactly-full"),
    pytest.param(20, 5.0, 5.0, 8, 0.01, BatchDecision(True, 8, None), id="over-full"),
    pytest.param(3, 5.0, 5.0, 8, 0.0, BatchDecision(True, 3, None), id="no-delay"),
    pytest.param(3, 5.0, 5.004, 8, 0.01, BatchDecision(False, 0, 5.01), id="waiting"),
    pytest.param(3, 5.0, 5.01, 8, 0.01, BatchDecision(True, 3, None), id="delay-elapsed"),
    pytest.param(3, 5.0, 9.0, 8, 0.01, BatchDecision(True, 3, None), id="long-overdue"),
    pytest.param(1, 5.0, 5.0, 1, 0.5, BatchDecision(True, 1, None), id="batch-of-one"),
]


@pytest.mark.parametrize(
    ("queue_len", "oldest", "now", "max_batch", "max_delay", "expected"), DISPATCH_CASES
)
def test_decide_batch_table(
    queue_len: int,
    oldest: float | None,
    now: float,
    max_batch: int,
    max_delay: float,
    expected: BatchDecision,
) -> None:
    decision = decide_batch(queue_len, oldest, now, max_batch, max_delay)
    assert decision.dispatch == expected.dispatch
    assert decision.size == expected.size
    if expected.wake_at is None:
        assert decision.wake_at is None
    else:
        assert decision.wake_at == pytest.approx(expected.wake_at)


@given(
    oldest=st.floats(0, 1e6, allow_nan=False),
    delay=st.floats(1e-6, 10, allow_nan=False),
    queue_len=st.integers(1, 7),
)
def test_waking_at_wake_at_always_dispatches(oldest: float, delay: float, queue_len: int) -> None:
    # Float rounding of ``now - oldest`` must not leave the dispatcher spinning.
    waiting = decide_batch(queue_len, oldest, oldest, 8, delay)
    assert not waiting.dispatch and waiting.wake_at is not None
    woken = decide_batch(queue_len, oldest, waiting.wake_at, 8, delay)
    assert woken == BatchDecision(True, queue_len, None)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((-1, None, 0.0, 8, 0.0), ValueError),
        ((1, None, 0.0, 8, 0.0), ValueError),
        ((1, 0.0, 0.0, 0, 0.0), ConfigError),
        ((1, 0.0, 0.0, 8, -0.1), ConfigError),
    ],
)
def test_decide_batch_rejects_bad_arguments(
    args: tuple[int, float | None, float, int, float], error: type[Exception]
) -> None:
    with pytest.raises(error):
        decide_batch(*args)
