"""Fault-injection decisions (parityserve.core.faults)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from parityserve.config import FaultConfig
from parityserve.core import faults
from parityserve.core.faults import BurstSpec, FaultAction, FaultPlan, FaultSpec, FaultStats
from parityserve.errors import ConfigError


def plan(seed: int = 0, start: float = 0.0, **spec: object) -> FaultPlan:
    return FaultPlan(FaultSpec.from_mapping(spec), np.random.default_rng(seed), start)


def test_public_names() -> None:
    assert sorted(faults.__all__) == [
        "BurstSpec", "DelayDistribution", "FaultAction", "FaultPlan", "FaultSpec", "FaultStats",
        "WrongKind", "check_delay_shape", "draw_delay", "lomax_draw"]


def test_core_does_not_import_config_or_pydantic() -> None:
    tree = ast.parse(Path(faults.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {m for m in imported if "pydantic" in m or m.endswith("config")}


# --- specs ------------------------------------------------------------------------------


def test_spec_fields_mirror_fault_config() -> None:
    assert [f.name for f in dataclasses.fields(FaultSpec)] == list(FaultConfig.model_fields)
    assert FaultSpec.from_mapping(FaultConfig().model_dump()) == FaultSpec()
    assert FaultSpec().is_noop and FaultSpec(seed=3).is_noop
    assert not FaultSpec(delay_ms=1.0).is_noop


def test_from_mapping_takes_a_full_model_dump() -> None:
    cfg = FaultConfig(
        delay_ms=5, delay_distribution="uniform",
        burst={"every_ms": 100, "duration_ms": 20, "delay_ms": 50},  # type: ignore[arg-type]
        wrong_probability=0.25, wrong_kind="labels", noise_sigma=0.5,
        crash_after_batches=7, hang_after_batches=9, seed=42,
    )
    spec = FaultSpec.from_mapping(cfg.model_dump())
    assert spec == FaultSpec(
        delay_ms=5.0, delay_distribution="uniform", burst=BurstSpec(100.0, 20.0, 50.0),
        wrong_probability=0.25, wrong_kind="labels", noise_sigma=0.5,
        crash_after_batches=7, hang_after_batches=9, seed=42,
    )


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"delay": 5}, "unknown fault settings: delay"),
        ({"burst": {"every_ms": 1, "duration_ms": 1, "delay_ms": 1, "x": 2}}, "unknown burst"),
        ({"burst": {"every_ms": 0, "duration_ms": 1, "delay_ms": 1}}, "every_ms"),
        ({"burst": {"every_ms": 1, "duration_ms": 1}}, "burst"),
        ({"delay_ms": -1}, "delay_ms"),
        ({"delay_ms": "fast"}, "invalid fault settings"),
        ({"delay_distribution": "lognormal"}, "delay_distribution"),
        ({"delay_distribution": "pareto", "delay_tail_index": 1.0}, "delay_tail_index"),
        ({"delay_tail_index": float("inf")}, "delay_tail_index"),
        ({"wrong_kind": "lies"}, "wrong_kind"),
        ({"wrong_probability": 1.5}, "wrong_probability"),
        ({"noise_sigma": -0.1}, "noise_sigma"),
        ({"crash_after_batches": -1}, "crash_after_batches"),
        ({"hang_after_batches": -2}, "hang_after_batches"),
    ],
)
def test_bad_settings_are_config_errors(mapping: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        FaultSpec.from_mapping(mapping)


# --- delays, crashes, hangs ---------------------------------------------------------------


def test_no_faults_means_no_delay() -> None:
    p = plan()
    actions = [p.next_batch(t * 0.01) for t in range(5)]
    assert actions == [FaultAction(0.0, False, False, i) for i in range(1, 6)]
    assert p.statistics() == FaultStats(batches=5, delayed=0, bursts_seen=0, corrupted_rows=0)


def test_constant_delay() -> None:
    p = plan(delay_ms=12.5)
    assert {p.next_batch(float(t)).delay_s for t in range(10)} == {0.0125}
    assert p.statistics().delayed == 10


@pytest.mark.parametrize("distribution", ["exponential", "uniform", "pareto"])
def test_random_delays_have_the_configured_mean(distribution: str) -> None:
    p = plan(seed=1, delay_ms=10.0, delay_distribution=distribution, delay_tail_index=3.0)
    delays = np.array([p.next_batch(0.0).delay_s for _ in range(20_000)])
    assert delays.mean() == pytest.approx(0.010, rel=0.03)
    assert delays.min() >= 0.0
    if distribution == "uniform":
        assert delays.max() <= 0.020
        assert delays.std() == pytest.approx(0.020 / np.sqrt(12), rel=0.05)
    elif distribution == "pareto":  # a = 3 here: a finite variance, so the mean settles
        assert np.median(delays) == pytest.approx(0.020 * (2 ** (1 / 3) - 1), rel=0.05)
    else:
        assert delays.std() == pytest.approx(0.010, rel=0.05)


def test_pareto_tail_follows_its_index() -> None:
    """P(D > d) = (1 + d/s)^-a with s = mean (a - 1): a heavier tail than the exponential
    with the same mean, which is the point of offering it."""
    mean_ms, a = 10.0, 2.0
    p = plan(seed=2, delay_ms=mean_ms, delay_distribution="pareto", delay_tail_index=a)
    delays_ms = 1000 * np.array([p.next_batch(0.0).delay_s for _ in range(50_000)])
    s = mean_ms * (a - 1)
    for d in (10.0, 50.0, 100.0):
        assert (delays_ms > d).mean() == pytest.approx((1 + d / s) ** -a, rel=0.15)
    assert (delays_ms > 60.0).mean() > 5 * np.exp(-60.0 / mean_ms)


@pytest.mark.parametrize("after", [0, 1, 3])
def test_crash_after_n_batches(after: int) -> None:
    p = plan(crash_after_batches=after)
    crashes = [p.next_batch(0.0).crash for _ in range(after + 3)]
    assert crashes == [False] * after + [True] * 3
    assert crashes.index(True) + 1 == after + 1  # batch number after+1 is the first to crash


def test_hang_after_n_batches_independently_of_crash() -> None:
    p = plan(hang_after_batches=2, crash_after_batches=4)
    actions = [p.next_batch(0.0) for _ in range(5)]
    assert [a.hang for a in actions] == [False, False, True, True, True]
    assert [a.crash for a in actions] == [False, False, False, False, True]
    assert [a.batch_index for a in actions] == [1, 2, 3, 4, 5]


# --- bursts -------------------------------------------------------------------------------

BURST = {"every_ms": 10.0, "duration_ms": 5.0, "delay_ms": 40.0}


def test_bursts_cover_the_expected_fraction_of_time() -> None:
    p = plan(seed=3, burst=BURST)
    horizon_s, step_s = 60.0, 0.0005
    times = np.arange(0.0, horizon_s, step_s)
    covered = np.mean([p.in_burst(float(t)) for t in times])
    assert covered == pytest.approx(5.0 / 15.0, abs=0.02)
    expected_bursts = horizon_s / 0.015
    assert p.statistics().bursts_seen == pytest.approx(expected_bursts, rel=0.05)


def test_burst_delay_is_added_inside_bursts_only() -> None:
    p = plan(seed=4, delay_ms=1.0, burst=BURST)
    probe = plan(seed=4, burst=BURST)  # same seed: the same burst timeline
    inside = 0
    for t in np.arange(0.0, 2.0, 0.001):
        action = p.next_batch(float(t))
        burst = probe.in_burst(float(t))
        assert action.delay_s == pytest.approx(0.041 if burst else 0.001)
        inside += burst
    assert 0 < inside < 2000
    assert p.statistics().delayed == 2000


def test_burst_timeline_does_not_depend_on_other_draws() -> None:
    busy = plan(seed=5, delay_ms=3.0, delay_distribution="exponential", burst=BURST,
                wrong_probability=0.5)
    quiet = plan(seed=5, burst=BURST)
    outputs = np.zeros((4, 3))
    for t in np.arange(0.0, 1.0, 0.0007):
        busy.next_batch(float(t))
        busy.corrupt(outputs)
        assert busy.in_burst(float(t)) == quiet.in_burst(float(t))


def test_burst_windows_start_after_the_plan_start() -> None:
    p = plan(seed=6, start=100.0, burst={"every_ms": 1.0, "duration_ms": 1000.0, "delay_ms": 1})
    assert not p.in_burst(100.0)  # the process starts in a gap
    assert p.in_burst(100.5)  # the first gap is ~1 ms, then a 1 s burst


def test_long_idle_jump_is_fast_and_keeps_the_coverage() -> None:
    in_burst = []
    for seed in range(400):
        p = plan(seed=seed, burst={"every_ms": 1.0, "duration_ms": 1.0, "delay_ms": 1.0})
        p.in_burst(0.0)
        in_burst.append(p.in_burst(1e5))  # 5e7 burst cycles later
        assert p.statistics().bursts_seen == pytest.approx(5e7, rel=0.01)
    assert np.mean(in_burst) == pytest.approx(0.5, abs=0.1)


def test_burst_state_stays_constant_in_size() -> None:
    p = plan(seed=7, burst=BURST)
    clock = p._bursts  # internal: the point is that it keeps no history
    before = set(vars(clock))
    for t in np.arange(0.0, 5.0, 0.001):
        p.in_burst(float(t))
    assert set(vars(clock)) == before
    assert all(
        isinstance(v, int | float | bool | np.random.Generator) for v in vars(clock).values())


# --- corruption --------------------------------------------------------------------------


def test_seeded_plans_are_reproducible() -> None:
    spec: dict[str, Any] = {"delay_ms": 5.0, "delay_distribution": "exponential", "burst": BURST,
            "wrong_probability": 0.3}
    a, b = plan(seed=11, **spec), plan(seed=11, **spec)
    other = plan(seed=12, **spec)
    x = np.random.default_rng(0).random((50, 10))
    times = [i * 0.003 for i in range(100)]
    assert [a.next_batch(t) for t in times] == [b.next_batch(t) for t in times]
    (ya, ma), (yb, mb) = a.corrupt(x), b.corrupt(x)
    assert np.array_equal(ya, yb) and np.array_equal(ma, mb)
    assert [other.next_batch(t) for t in times] != [a.next_batch(t) for t in times]


def test_corruption_rate_within_tolerance() -> None:
    p = plan(seed=2, wrong_probability=0.3)
    mask = p.corrupt(np.zeros((20_000, 2)))[1]
    assert mask.mean() == pytest.approx(0.3, abs=0.015)
    assert p.statistics().corrupted_rows == int(mask.sum())


def test_noise_changes_only_masked_rows_and_never_the_input() -> None:
    p = plan(seed=8, wrong_probability=0.5, noise_sigma=2.0)
    x = np.ones((4000, 3), dtype=np.float32)
    original = x.copy()
    y, mask = p.corrupt(x)
    assert np.array_equal(x, original) and y is not x
    assert y.dtype == np.float32
    assert np.array_equal(y[~mask], x[~mask])
    assert np.all(y[mask] != x[mask])
    assert (y[mask] - 1.0).std() == pytest.approx(2.0, rel=0.05)


def test_no_corruption_returns_an_equal_copy() -> None:
    p = plan(wrong_probability=0.0)
    x = np.arange(6.0).reshape(3, 2)
    y, mask = p.corrupt(x)
    assert np.array_equal(y, x) and y is not x and not mask.any()
    assert mask.dtype == np.bool_ and mask.shape == (3,)


def test_labels_kind_moves_every_argmax_to_a_uniform_other_class() -> None:
    p = plan(seed=9, wrong_probability=1.0, wrong_kind="labels")
    x = np.random.default_rng(1).random((6000, 4))
    y, mask = p.corrupt(x)
    assert mask.all()
    before, after = x.argmax(axis=1), y.argmax(axis=1)
    assert np.all(before != after)
    assert np.allclose(np.sort(y, axis=1), np.sort(x, axis=1))  # still the same scores
    # The new class is uniform over the 3 others: each gets about a third.
    shift = (after - before) % 4
    assert np.bincount(shift, minlength=4)[1:] / 6000 == pytest.approx([1 / 3] * 3, abs=0.03)


def test_labels_kind_handles_ties() -> None:
    p = plan(seed=10, wrong_probability=1.0, wrong_kind="labels")
    x = np.array([[0.5, 0.5, 0.5], [1.0, 1.0, 0.0], [0.0, 2.0, 2.0]], dtype=np.float32)
    y, mask = p.corrupt(x)
    assert mask.all() and np.all(y.argmax(axis=1) != x.argmax(axis=1))


def test_single_class_rows_cannot_be_corrupted() -> None:
    p = plan(wrong_probability=1.0, wrong_kind="labels")
    y, mask = p.corrupt(np.ones((5, 1)))
    assert not mask.any() and np.array_equal(y, np.ones((5, 1)))
    assert p.statistics().corrupted_rows == 0


@pytest.mark.parametrize("kind", ["labels", "noise"])
def test_integer_labels_get_a_different_label(kind: str) -> None:
    p = plan(seed=12, wrong_probability=1.0, wrong_kind=kind)
    x = np.array([0, 1, 2, 9, 3] * 200, dtype=np.int64)
    y, mask = p.corrupt(x)
    assert mask.all() and y.dtype == np.int64
    assert np.all(y != x)
    assert y.min() >= 0 and y.max() <= 9  # within [0, max + 1)
    wide = p.corrupt(x, num_classes=100)[0]
    assert np.all(wide != x) and wide.max() >= 10 and wide.max() < 100


def test_binary_and_boolean_labels_flip() -> None:
    p = plan(seed=13, wrong_probability=1.0, wrong_kind="labels")
    zeros = np.zeros(50, dtype=np.uint8)
    assert np.all(p.corrupt(zeros)[0] == 1)  # only one other label exists: 1
    flags = np.array([True, False] * 10)
    assert np.array_equal(p.corrupt(flags)[0], ~flags)


def test_corrupt_rejects_unusable_outputs() -> None:
    p = plan(wrong_probability=1.0)
    with pytest.raises(ValueError, match="batch dimension"):
        p.corrupt(np.float64(1.0))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dtype"):
        p.corrupt(np.array(["a", "b"]))


score_rows = hnp.arrays(
    dtype=st.sampled_from([np.float32, np.float64, np.int8, np.int64]),
    shape=hnp.array_shapes(min_dims=2, max_dims=3, min_side=1, max_side=6),
    elements={"min_value": -3, "max_value": 3},
)


@given(outputs=score_rows, seed=st.integers(0, 2**16))
def test_labels_kind_always_changes_the_argmax(outputs: npt.NDArray[np.float64], seed: int) -> None:
    p = plan(seed=seed, wrong_probability=1.0, wrong_kind="labels")
    original = outputs.copy()
    y, mask = p.corrupt(outputs)
    assert np.array_equal(outputs, original)
    rows_x = outputs.reshape(len(outputs), -1)
    rows_y = y.reshape(len(y), -1)
    changed = rows_x.argmax(axis=1) != rows_y.argmax(axis=1)
    assert np.array_equal(mask, changed)
    assert mask.all() == (rows_x.shape[1] > 1)  # small values: there is always room to lift
