"""Coding groups (parityserve.core.redundancy): ParM, Berrut and systematic Berrut decisions.

The "model" in most tests is bias-free linear, f(x) = x @ W, for which a parity is exact, so
ParM decodes must match f(batch) to rounding. Berrut decodes are interpolations and only
approximate; their tolerances are stated relative to the size of the outputs (see the
Berrut section), measured over 1000 seeds and every straggler pattern, with a margin.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import deque
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parityserve.core import redundancy
from parityserve.core.coding.berrut import BerrutCode, SystematicBerrut, berrut_interpolate
from parityserve.core.coding.parity import LinearCode
from parityserve.core.redundancy import (
    BerrutGroup,
    Decoded,
    ParmGroup,
    SystematicGroup,
    pad_rows,
    softmax_subtraction,
    take_task,
)
from parityserve.errors import CodingError

FAST = settings(max_examples=40, deadline=None)
DIM, CLASSES = 6, 4

_W = np.random.default_rng(0).normal(size=(DIM, CLASSES)) / np.sqrt(DIM)


def linear(x: np.ndarray) -> np.ndarray:
    """A bias-free linear model: parities of its inputs are parities of its outputs."""
    return np.asarray(np.asarray(x) @ _W)


def _batches(seed: int, rows: list[int], dim: int = DIM) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(n, dim)) for n in rows]


def _curve(alpha: np.ndarray, rows: list[int], seed: int) -> list[np.ndarray]:
    """Batch j on a smooth, slowly varying curve in its node alpha_j (row by row).

    Berrut decoding approximates well only when the queries vary smoothly across a group;
    random queries give errors of the order of the outputs (a property of ApproxIFER).
    """
    rng = np.random.default_rng(seed)
    width = max(rows)
    freq = rng.uniform(0.3, 1.0, (width, DIM))
    phase = rng.uniform(0.0, 6.3, (width, DIM))
    return [np.sin(freq * a + phase)[:n] for a, n in zip(alpha, rows, strict=False)]


def test_public_names() -> None:
    assert sorted(redundancy.__all__) == [
        "BerrutGroup", "Decoded", "ParmGroup", "SystematicGroup", "pad_rows",
        "softmax_subtraction", "split_even", "take_task"]


@pytest.mark.parametrize(("n", "k", "sizes"), [
    (10, 3, [4, 3, 3]), (6, 3, [2, 2, 2]), (2, 4, [1, 1]), (1, 1, [1]), (7, 1, [7]),
])
def test_split_even_cuts_consecutive_near_equal_chunks(n: int, k: int, sizes: list[int]) -> None:
    chunks = redundancy.split_even(list(range(n)), k)
    assert [len(c) for c in chunks] == sizes
    assert [x for c in chunks for x in c] == list(range(n))  # order kept, nothing lost


# ---- take_task ------------------------------------------------------------------------------
class _Run:
    def __init__(self, *assigned: str) -> None:
        self.assigned = set(assigned)


class _Task:
    def __init__(self, name: str, group: _Run | None = None, needed: bool = True) -> None:
        self.name, self.group, self._needed = name, group, needed

    def needed(self) -> bool:
        return self._needed


def test_take_task_skips_groups_the_worker_served_and_drops_unneeded_tasks() -> None:
    run = _Run("w0")
    queue = deque([_Task("stale", needed=False), _Task("same group", run), _Task("plain"),
                   _Task("later")])
    taken = take_task(queue, "w0")
    assert taken is not None and taken.name == "plain"
    assert [t.name for t in queue] == ["same group", "later"]  # the stale one is gone
    again = take_task(queue, "w1")
    assert again is not None and again.name == "same group"
    assert take_task(deque([_Task("x", run)]), "w0") is None


def test_decoded_is_frozen_and_suspects_nobody_by_default() -> None:
    decoded = Decoded({0: np.zeros(2)}, "parm-subtraction")
    assert decoded.suspected == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        decoded.method = "other"  # type: ignore[misc]


# --- pad_rows --------------------------------------------------------------------------------


def test_pad_rows_zero_pads_short_batches() -> None:
    a, b = np.arange(6.0).reshape(3, 2), np.array([[7.0, 8.0]])
    out = pad_rows([a, b])
    assert out.shape == (2, 3, 2)
    np.testing.assert_array_equal(out[0], a)
    np.testing.assert_array_equal(out[1], [[7.0, 8.0], [0.0, 0.0], [0.0, 0.0]])


def test_pad_rows_handles_vectors_and_images() -> None:
    assert pad_rows([np.ones(3), np.ones(1)]).shape == (2, 3)
    images = pad_rows([np.ones((2, 1, 4, 4)), np.ones((1, 1, 4, 4))])
    assert images.shape == (2, 2, 1, 4, 4)
    assert images[1, 1].sum() == 0.0


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [(np.float32, np.float32), (np.float64, np.float64), (np.uint8, np.float32),
     (np.int64, np.float64)],
)
def test_pad_rows_dtype(dtype: type, expected: type) -> None:
    out = pad_rows([np.ones((2, 3), dtype), np.ones((1, 3), dtype)])
    assert out.dtype == expected


def test_pad_rows_rejects_empty_list() -> None:
    with pytest.raises(CodingError, match="at least one batch"):
        pad_rows([])


@pytest.mark.parametrize(
    "batches",
    [[np.ones((2, 3)), np.ones((2, 4))], [np.ones((2, 3)), np.ones((2, 3, 1))],
     [np.ones((2, 3)), np.float64(1.0)], [np.float64(1.0)]],
    ids=["width", "rank", "scalar-second", "scalar-first"],
)
def test_pad_rows_rejects_mismatched_row_shapes(batches: list[np.ndarray]) -> None:
    with pytest.raises(CodingError, match="rows of shape"):
        pad_rows(batches)


@pytest.mark.parametrize(
    "bad",
    [np.array([["a", "b"]]), np.array([[object(), object()]], dtype=object),
     np.array([[True, False]])],
    ids=["str", "object", "bool"],
)
def test_pad_rows_rejects_non_numeric_dtypes(bad: np.ndarray) -> None:
    with pytest.raises(CodingError, match="coding needs numbers"):
        pad_rows([np.ones((1, 2)), bad])


# --- ParmGroup: addition / linear codes ------------------------------------------------------


def _parm(code: LinearCode, rows: list[int], seed: int = 0, sent_at: float = 0.0,
          grace_s: float | None = None) -> tuple[ParmGroup, list[np.ndarray], list[np.ndarray]]:
    """A closed group of batches with ``rows`` rows; returns it, the batches and the parities."""
    group = ParmGroup(code, grace_s=grace_s)
    batches = _batches(seed, rows)
    for j, batch in enumerate(batches):
        assert group.add(batch, sent_at + j) == j
    parities = group.close()
    return group, batches, parities


def test_parm_close_returns_r_parities_of_the_padded_shape() -> None:
    group, batches, parities = _parm(LinearCode.addition(2), [3, 5])
    assert group.closed and group.k == 2
    assert len(parities) == 1 and parities[0].shape == (5, DIM)
    np.testing.assert_allclose(parities[0], pad_rows(batches).sum(axis=0))
    _, _, two = _parm(LinearCode.default(3, 2), [3, 5, 1])
    assert [p.shape for p in two] == [(5, DIM), (5, DIM)]


def test_parm_rebuilds_one_missing_output_by_subtraction() -> None:
    group, batches, parities = _parm(LinearCode.addition(2), [3, 5])
    assert group.decision(10.0) is None  # nothing arrived yet
    group.arrive(1, linear(batches[1]))
    assert group.missing() == [0]
    assert group.decision(10.0) is None  # the parity output has not arrived
    group.arrive_parity(0, linear(parities[0]))
    assert group.decision(10.0) == [0]
    decoded = group.decode([0])
    assert decoded.method == "parm-subtraction" and decoded.suspected == ()
    assert list(decoded.outputs) == [0]
    assert decoded.outputs[0].shape == (3, CLASSES)  # cut to the batch's real rows
    np.testing.assert_allclose(decoded.outputs[0], linear(batches[0]), atol=1e-12)
    assert group.rebuilt == {0} and group.missing() == []
    assert group.decision(11.0) is None  # nothing left to do


def test_parm_waits_for_every_other_output() -> None:
    group, batches, parities = _parm(LinearCode.addition(3), [2, 4, 3])
    group.arrive_parity(0, linear(parities[0]))
    group.arrive(0, linear(batches[0]))
    assert group.decision(1.0) is None  # two missing, one parity
    group.arrive(2, linear(batches[2]))
    assert group.decision(1.0) == [1]
    np.testing.assert_allclose(group.decode([1]).outputs[1], linear(batches[1]), atol=1e-12)


def test_parm_group_fills_up_to_k() -> None:
    group = ParmGroup(LinearCode.addition(3))
    for j, batch in enumerate(_batches(0, [2, 4, 1])):
        assert not group.full and group.size == j
        assert group.add(batch, float(j)) == j
    assert group.full and group.size == 3 and not group.closed
    assert group.missing() == [0, 1, 2]


def test_parm_open_group_never_decides() -> None:
    group = ParmGroup(LinearCode.addition(3))
    batches = _batches(1, [2, 2])
    group.add(batches[0], 0.0)
    group.add(batches[1], 0.0)
    group.arrive(0, linear(batches[0]))
    group.arrive_parity(0, np.zeros((2, CLASSES)))
    assert not group.closed and not group.full
    assert group.decision(5.0) is None


def test_parm_linear_code_rebuilds_two_missing() -> None:
    group, batches, parities = _parm(LinearCode.default(4, 2), [3, 5, 2, 4], seed=3)
    group.arrive(1, linear(batches[1]))
    group.arrive(3, linear(batches[3]))
    group.arrive_parity(0, linear(parities[0]))
    assert group.decision(0.0) is None  # 2 missing, 1 parity
    group.arrive_parity(1, linear(parities[1]))
    assert group.decision(0.0) == [0, 2]
    decoded = group.decode([0, 2])
    assert decoded.method == "parm-linear"
    for slot in (0, 2):
        assert decoded.outputs[slot].shape == (len(batches[slot]), CLASSES)
        np.testing.assert_allclose(decoded.outputs[slot], linear(batches[slot]), atol=1e-9)


def test_parm_linear_code_with_one_missing_uses_any_parity() -> None:
    group, batches, parities = _parm(LinearCode.default(3, 2), [4, 2, 3], seed=4)
    group.arrive(0, linear(batches[0]))
    group.arrive(2, linear(batches[2]))
    group.arrive_parity(1, linear(parities[1]))  # only the second parity came back
    assert group.decision(0.0) == [1]
    np.testing.assert_allclose(group.decode([1]).outputs[1], linear(batches[1]), atol=1e-9)


@st.composite
def _parm_case(draw: st.DrawFn) -> tuple[int, int, list[int], list[int], int]:
    k = draw(st.integers(2, 4))
    r = draw(st.integers(1, 2))
    rows = draw(st.lists(st.integers(1, 6), min_size=k, max_size=k))
    lost = draw(st.lists(st.integers(0, k - 1), min_size=1, max_size=r, unique=True))
    return k, r, rows, sorted(lost), draw(st.integers(0, 2**32 - 1))


@FAST
@given(_parm_case())
def test_parm_rebuilds_any_missing_slots_exactly(
    case: tuple[int, int, list[int], list[int], int],
) -> None:
    k, r, rows, lost, seed = case
    code = LinearCode.addition(k) if r == 1 else LinearCode.default(k, r)
    group, batches, parities = _parm(code, rows, seed=seed)
    for slot in range(k):
        if slot not in lost:
            group.arrive(slot, linear(batches[slot]))
    for j, parity in enumerate(parities):
        # Decodable as soon as as many parity outputs as missing ones have arrived.
        assert group.decision(0.0) == (lost if j >= len(lost) else None)
        group.arrive_parity(j, linear(parity))
    assert group.decision(0.0) == lost
    decoded = group.decode(lost)
    assert decoded.method == ("parm-subtraction" if r == 1 else "parm-linear")
    assert sorted(decoded.outputs) == lost
    for slot in lost:
        assert decoded.outputs[slot].shape == (rows[slot], CLASSES)
        np.testing.assert_allclose(decoded.outputs[slot], linear(batches[slot]), atol=1e-9)


@pytest.mark.parametrize(("k", "r", "rows", "lost"), [
    (4, 1, [3, 5], [0]), (4, 1, [2, 4, 1], [2]), (3, 2, [4, 2], [0, 1]), (4, 2, [1, 3, 2], [1])])
def test_parm_group_closed_early_still_decodes_exactly(
    k: int, r: int, rows: list[int], lost: list[int],
) -> None:
    code = LinearCode.addition(k) if r == 1 else LinearCode.default(k, r)
    group, batches, parities = _parm(code, rows, seed=5)
    assert group.closed
    assert len(parities) == r
    for slot in range(len(rows)):
        if slot not in lost:
            group.arrive(slot, linear(batches[slot]))
    for j, parity in enumerate(parities):
        group.arrive_parity(j, linear(parity))
    assert group.decision(0.0) == lost  # the unfilled slots are never "missing"
    decoded = group.decode(lost)
    for slot in lost:
        np.testing.assert_allclose(decoded.outputs[slot], linear(batches[slot]), atol=1e-9)


def test_parm_float32_round_trip() -> None:
    group = ParmGroup(LinearCode.addition(2))
    batches = [b.astype(np.float32) for b in _batches(6, [3, 3])]
    for batch in batches:
        group.add(batch, 0.0)
    (parity,) = group.close()
    assert parity.dtype == np.float32
    group.arrive(0, linear(batches[0]).astype(np.float32))
    group.arrive_parity(0, linear(parity).astype(np.float32))
    rebuilt = group.decode([1]).outputs[1]
    assert rebuilt.dtype == np.float32
    np.testing.assert_allclose(rebuilt, linear(batches[1]), atol=1e-5)


# --- ParmGroup: grace period -----------------------------------------------------------------


def test_parm_grace_delays_the_decision() -> None:
    group, batches, parities = _parm(LinearCode.addition(2), [3, 3], sent_at=10.0, grace_s=0.5)
    group.arrive(0, linear(batches[0]))  # slot 1 was sent at 11.0
    assert group.decision(11.2) is None  # no parity output yet: no time either
    group.arrive_parity(0, linear(parities[0]))
    for now in (11.0, 11.2, 11.49):
        wake = group.decision(now)
        assert isinstance(wake, float) and wake == pytest.approx(11.5)
    assert group.decision(11.5) == [1]
    assert group.decision(20.0) == [1]
    np.testing.assert_allclose(group.decode([1]).outputs[1], linear(batches[1]), atol=1e-12)


def test_parm_grace_counts_from_the_latest_missing_batch() -> None:
    group, batches, parities = _parm(LinearCode.default(3, 2), [2, 2, 2], sent_at=1.0,
                                     grace_s=2.0)
    group.arrive(1, linear(batches[1]))  # slots 0 (sent 1.0) and 2 (sent 3.0) are missing
    group.arrive_parity(0, linear(parities[0]))
    group.arrive_parity(1, linear(parities[1]))
    assert group.decision(3.5) == pytest.approx(5.0)
    assert group.decision(5.0) == [0, 2]


def test_parm_grace_is_moot_when_the_output_arrives() -> None:
    group, batches, parities = _parm(LinearCode.addition(2), [3, 3], grace_s=1.0)
    group.arrive(0, linear(batches[0]))
    group.arrive_parity(0, linear(parities[0]))
    assert isinstance(group.decision(0.5), float)
    group.arrive(1, linear(batches[1]))  # the straggler made it in time
    assert group.missing() == [] and group.decision(5.0) is None and group.rebuilt == set()


# --- ParmGroup: misuse -----------------------------------------------------------------------


def test_parm_adding_to_a_full_or_closed_group_raises() -> None:
    group = ParmGroup(LinearCode.addition(2))
    group.add(np.ones((1, 3)), 0.0)
    group.add(np.ones((1, 3)), 0.0)
    with pytest.raises(CodingError, match="closed"):
        group.add(np.ones((1, 3)), 0.0)
    early = ParmGroup(LinearCode.addition(3))
    early.add(np.ones((1, 3)), 0.0)
    early.close()
    with pytest.raises(CodingError, match="closed"):
        early.add(np.ones((1, 3)), 0.0)


def test_parm_closing_an_empty_group_raises() -> None:
    with pytest.raises(CodingError, match="empty"):
        ParmGroup(LinearCode.addition(2)).close()
    with pytest.raises(CodingError, match="empty"):
        ParmGroup(LinearCode.addition(2), "concat").close()


def test_parm_concat_needs_one_parity_and_k_2_or_4() -> None:
    with pytest.raises(CodingError, match="r = 1"):
        ParmGroup(LinearCode.default(2, 2), "concat")
    with pytest.raises(CodingError, match="k = 2 or k = 4"):
        ParmGroup(LinearCode.addition(3), "concat")


def test_parm_decode_without_enough_parity_outputs_raises() -> None:
    group, batches, parities = _parm(LinearCode.addition(2), [2, 2])
    group.arrive(0, linear(batches[0]))
    with pytest.raises(CodingError, match="0 parity outputs"):
        group.decode([1])
    group.arrive_parity(0, linear(parities[0]))
    with pytest.raises(CodingError, match="2 outputs from 1"):
        group.decode([0, 1])
    assert group.missing() == [1] and group.rebuilt == set()  # a failed decode settles nothing


def test_parm_nan_output_raises_coding_error() -> None:
    group, batches, parities = _parm(LinearCode.addition(2), [2, 2])
    group.arrive(0, np.full((2, CLASSES), np.nan))
    group.arrive_parity(0, linear(parities[0]))
    assert group.decision(0.0) == [1]
    with pytest.raises(CodingError, match="NaN"):
        group.decode([1])
    assert group.missing() == [1]


def test_parm_mismatched_output_width_raises() -> None:
    group, batches, parities = _parm(LinearCode.addition(2), [2, 2])
    group.arrive(0, np.ones((2, CLASSES + 1)))
    group.arrive_parity(0, linear(parities[0]))
    with pytest.raises(CodingError, match="shape"):
        group.decode([1])


# --- ParmGroup: parities summed as batches join, and the lean decode --------------------------


def _encode_at_close(code: LinearCode, batches: list[np.ndarray]) -> list[np.ndarray]:
    """What ParM does: wait for the group, stack it (zero-padding short batches), encode."""
    parities = code.encode(list(pad_rows(batches)))
    return [parities[j] for j in range(code.r)]


@FAST
@given(st.integers(2, 5), st.integers(1, 3), st.lists(st.integers(1, 4), min_size=1, max_size=5),
       st.sampled_from(["float32", "float64", "uint8"]), st.integers(0, 2**32 - 1))
def test_running_parities_equal_encoding_the_padded_group_at_close(
    k: int, r: int, rows: list[int], dtype: str, seed: int,
) -> None:
    rows = rows[:k]  # a short list is a group closed early
    rng = np.random.default_rng(seed)
    batches = [(rng.uniform(0, 200, (n, DIM))).astype(dtype) for n in rows]
    code = LinearCode.default(k, r)
    group = ParmGroup(code)
    for j, batch in enumerate(batches):
        group.add(batch, float(j))
    got = group.close()
    want = _encode_at_close(code, batches)
    assert [p.shape for p in got] == [p.shape for p in want]
    assert [p.dtype for p in got] == [p.dtype for p in want]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5 if dtype != "float64" else 1e-12)


def test_running_parities_promote_to_the_widest_dtype_that_joins() -> None:
    group = ParmGroup(LinearCode.addition(3))
    group.add(np.full((1, 2), 0.1, dtype=np.float32), 0.0)
    group.add(np.full((2, 2), 0.2, dtype=np.float64), 0.0)
    group.add(np.ones((1, 2), dtype=np.int64), 0.0)
    (parity,) = group.close()
    assert parity.dtype == np.float64 and parity.shape == (2, 2)
    np.testing.assert_allclose(parity, [[np.float32(0.1) + 0.2 + 1.0] * 2, [0.2, 0.2]])


@pytest.mark.parametrize(
    ("bad", "message"),
    [(np.ones((1, DIM + 1)), "rows of shape"), (np.array([["a"] * DIM]), "real numbers"),
     (np.ones((1, DIM), dtype=complex), "real numbers"), (np.float64(3.0), "real numbers")],
    ids=["width", "str", "complex", "scalar"],
)
def test_a_bad_batch_joins_but_the_group_cannot_encode(bad: np.ndarray, message: str) -> None:
    group = ParmGroup(LinearCode.addition(3))
    group.add(np.ones((1, DIM)), 0.0)
    assert group.add(bad, 0.0) == 1  # dispatch never fails on the group's account
    group.add(np.ones((1, DIM)), 0.0)
    with pytest.raises(CodingError, match=message):
        group.close()
    assert group.closed and group.missing() == [0, 1, 2]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", [2, 3, 4])
def test_lean_decode_equals_the_validating_path(k: int, dtype: type) -> None:
    rng = np.random.default_rng(k)
    outputs = [rng.normal(size=(1, 1000)).astype(dtype) for _ in range(k)]
    for coefficients in (np.ones((1, k)), np.arange(1.0, k + 1)[np.newaxis, :]):
        code = LinearCode(coefficients)
        group = ParmGroup(code)
        for _ in range(k):
            group.add(np.zeros((1, 3)), 0.0)
        group.close()
        for slot in range(1, k):
            group.arrive(slot, outputs[slot])
        parity = sum(c * y for c, y in zip(coefficients[0], outputs, strict=True))
        group.arrive_parity(0, np.asarray(parity, dtype=dtype))
        lean = group._rebuild_lean([0])
        assert lean is not None
        slow = group._rebuild([0])
        assert lean[0].dtype == slow[0].dtype == dtype
        np.testing.assert_allclose(lean[0], slow[0], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(group.decode([0]).outputs[0], outputs[0], rtol=1e-3, atol=1e-3)


def test_lean_decode_steps_aside_for_what_it_does_not_handle() -> None:
    def group_of(k: int, r: int = 1) -> ParmGroup:
        g = ParmGroup(LinearCode.default(k, r))
        for _ in range(k):
            g.add(np.zeros((2, 3)), 0.0)
        g.close()
        return g

    mixed = group_of(2)
    mixed.arrive(1, np.ones((2, 4), dtype=np.float32))
    mixed.arrive_parity(0, np.ones((2, 4)))
    assert mixed._rebuild_lean([0]) is None  # mixed dtypes
    np.testing.assert_allclose(mixed.decode([0]).outputs[0], 0.0)
    nan = group_of(2)
    nan.arrive(1, np.ones((2, 4)))
    nan.arrive_parity(0, np.full((2, 4), np.nan))
    assert nan._rebuild_lean([0]) is None
    with pytest.raises(CodingError, match="NaN"):
        nan.decode([0])
    # Two slots missing and one parity: a decode of one of them alone must not treat the
    # other as zero; the validating path refuses it.
    partial = group_of(3)
    partial.arrive(2, np.ones((2, 4)))
    partial.arrive_parity(0, np.ones((2, 4)))
    assert partial._rebuild_lean([0]) is None
    with pytest.raises(CodingError, match="neither given nor listed"):
        partial.decode([0])


# --- ParmGroup: concat encoder (MNIST-like images) -------------------------------------------


_W_IMG = np.random.default_rng(7).normal(size=(784, 10)) / 28.0


def _softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max(axis=-1, keepdims=True))
    return np.asarray(z / z.sum(axis=-1, keepdims=True))


@pytest.mark.parametrize(("k", "rows"), [(2, [3, 2]), (4, [2, 3, 1, 3])])
def test_concat_parity_has_the_image_shape_and_decodes_to_probabilities(
    k: int, rows: list[int],
) -> None:
    rng = np.random.default_rng(k)
    group = ParmGroup(LinearCode.addition(k), "concat")
    images = [rng.uniform(0, 1, (n, 784)).astype(np.float32) for n in rows]
    for image in images:
        group.add(image, 0.0)
    parities = group.close()
    assert len(parities) == 1 and parities[0].shape == (max(rows), 784)
    assert parities[0].dtype == np.float32
    for slot in range(1, k):
        group.arrive(slot, images[slot] @ _W_IMG)
    group.arrive_parity(0, parities[0] @ _W_IMG)  # a stand-in for a learned parity model
    assert group.decision(0.0) == [0]
    decoded = group.decode([0])
    assert decoded.method == "parm-concat" and list(decoded.outputs) == [0]
    probs = decoded.outputs[0]
    assert probs.shape == (rows[0], 10)
    assert np.all(probs >= 0.0)
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0, rtol=1e-9)
    assert group.rebuilt == {0} and group.missing() == []


def test_concat_is_exact_for_an_ideal_parity_model() -> None:
    # The parity model ParM trains targets sum_i softmax(f(x_i)) in probability space.
    rng = np.random.default_rng(8)
    group = ParmGroup(LinearCode.addition(4), "concat")
    images = [rng.uniform(0, 1, (3, 784)) for _ in range(4)]
    for image in images:
        group.add(image, 0.0)
    group.close()
    logits = [image @ _W_IMG for image in images]
    for slot in (0, 1, 3):
        group.arrive(slot, logits[slot])
    group.arrive_parity(0, np.log(sum(_softmax(x) for x in logits)))
    decoded = group.decode([2])
    np.testing.assert_allclose(decoded.outputs[2], _softmax(logits[2]), atol=1e-9)


def test_concat_nan_parity_output_raises_instead_of_a_uniform_guess() -> None:
    group = ParmGroup(LinearCode.addition(2), "concat")
    group.add(np.ones((1, 784)), 0.0)
    group.add(np.ones((1, 784)), 0.0)
    group.close()
    group.arrive(0, np.zeros((1, 10)))
    group.arrive_parity(0, np.full((1, 10), np.nan))
    with pytest.raises(CodingError, match="finite"):
        group.decode([1])
    assert group.missing() == [1]


# --- softmax_subtraction ---------------------------------------------------------------------


@FAST
@given(st.integers(2, 5), st.integers(1, 4), st.integers(2, 12), st.integers(0, 2**32 - 1))
def test_softmax_subtraction_recovers_the_missing_probabilities(
    k: int, rows: int, classes: int, seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    logits = [rng.normal(scale=3.0, size=(rows, classes)) for _ in range(k)]
    probs = [_softmax(x) for x in logits]
    parity = np.log(sum(probs))  # softmax(parity) = sum(probs) / k
    missing = int(rng.integers(k))
    # present logits are shifted by a constant, which softmax ignores
    present = [x + rng.normal() for i, x in enumerate(logits) if i != missing]
    rebuilt = softmax_subtraction(parity, present, k)
    np.testing.assert_allclose(rebuilt, probs[missing], atol=1e-9)
    np.testing.assert_allclose(rebuilt.sum(axis=-1), 1.0, rtol=1e-12)


@FAST
@given(st.integers(1, 4), st.integers(0, 3), st.integers(0, 2**32 - 1))
def test_softmax_subtraction_always_returns_probabilities(
    k: int, present_count: int, seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    parity = rng.normal(scale=5.0, size=(3, 7))
    present = [rng.normal(scale=5.0, size=(3, 7)) for _ in range(min(present_count, k))]
    out = softmax_subtraction(parity, present, k)
    assert out.shape == (3, 7) and np.all(out >= 0.0)
    np.testing.assert_allclose(out.sum(axis=-1), 1.0, rtol=1e-12)


def test_softmax_subtraction_falls_back_to_uniform_when_nothing_is_left() -> None:
    # k = 1 and the present output equals the parity: everything cancels to zero.
    logits = np.array([[1.0, 2.0, 3.0, 4.0]])
    np.testing.assert_allclose(softmax_subtraction(logits, [logits], 1), [[0.25] * 4])


def test_softmax_subtraction_is_stable_for_large_logits() -> None:
    parity = np.array([[1000.0, 0.0], [0.0, -1000.0]])
    out = softmax_subtraction(parity, [], 1)
    np.testing.assert_allclose(out, [[1.0, 0.0], [1.0, 0.0]])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_softmax_subtraction_rejects_non_finite_logits(bad: float) -> None:
    good = np.zeros((1, 3))
    with pytest.raises(CodingError, match="finite"):
        softmax_subtraction(np.array([[0.0, bad, 1.0]]), [good], 2)
    with pytest.raises(CodingError, match="finite"):
        softmax_subtraction(good, [np.array([[bad, 0.0, 0.0]])], 2)


# --- BerrutGroup (ApproxIFER) ----------------------------------------------------------------
#
# Tolerances: queries on a slowly varying curve (_curve), any `needed` of the n_workers
# results, S = 1. Worst relative error |decoded - truth| / |truth| over every case the
# property test can draw (seeds 0..999, 1..4 rows, every subset), checked exhaustively:
# linear f 0.26 (K = 3), 0.13 (K = 4), exact for K = 2; f = sin 0.26. BERRUT_REL is above.

BERRUT_REL = 0.35


def _run_berrut(group: BerrutGroup, batches: list[np.ndarray], f: Callable[..., np.ndarray],
                arrived: list[int]) -> list[np.ndarray]:
    coded = group.encode(batches)
    outputs = [f(c) for c in coded]
    for i in arrived:
        group.arrive(i, outputs[i])
    return outputs


def _relative_error(decoded: Decoded, truth: list[np.ndarray]) -> float:
    diff = np.concatenate([(decoded.outputs[s] - t).ravel() for s, t in enumerate(truth)])
    return float(np.linalg.norm(diff) / np.linalg.norm(np.concatenate([t.ravel() for t in truth])))


@pytest.mark.parametrize(("k", "s", "e"), [(2, 1, 0), (3, 1, 0), (4, 2, 0), (2, 1, 1)])
def test_berrut_encode_returns_one_batch_per_worker(k: int, s: int, e: int) -> None:
    code = BerrutCode(k, s, e)
    group = BerrutGroup(code)
    coded = group.encode(_batches(0, [3] * (k - 1) + [5]))
    assert code.n_workers == len(coded)
    assert all(c.shape == (5, DIM) for c in coded)


def test_berrut_ready_only_at_needed_results() -> None:
    code = BerrutCode(3, 2)
    group = BerrutGroup(code)
    batches = _curve(code.alpha, [2, 2, 2], seed=1)
    outputs = _run_berrut(group, batches, linear, [])
    for count, worker in enumerate((4, 0, 2), start=1):
        group.arrive(worker, outputs[worker])
        assert group.ready() == (count >= code.needed)
    decoded = group.decode()
    assert decoded.method == "berrut" and decoded.suspected == ()
    assert group.decoded and not group.ready()
    group.arrive(1, outputs[1])  # late results are ignored once decoded
    assert 1 not in group.results and not group.ready()


def test_berrut_with_extra_workers_waits_for_all_but_s() -> None:
    code = BerrutCode(3, 1, workers=6)
    group = BerrutGroup(code)
    outputs = _run_berrut(group, _curve(code.alpha, [2, 2, 2], seed=2), linear, [])
    for count, worker in enumerate((5, 0, 2, 3, 1), start=1):
        group.arrive(worker, outputs[worker])
        assert group.ready() == (count >= 5), count  # 6 workers - S, not the 3 it could use
    assert group.decode().method == "berrut"


@pytest.mark.parametrize("arrived", list(itertools.combinations(range(3), 2)))
def test_berrut_k2_is_exact_for_a_linear_model(arrived: tuple[int, int]) -> None:
    # Two data nodes: the coded queries lie on a line, and so do a linear model's outputs.
    code = BerrutCode(2, 1)
    group = BerrutGroup(code)
    batches = _batches(2, [3, 5])
    _run_berrut(group, batches, linear, list(arrived))
    assert group.ready()
    decoded = group.decode()
    for slot, batch in enumerate(batches):
        assert decoded.outputs[slot].shape == (len(batch), CLASSES)
        np.testing.assert_allclose(decoded.outputs[slot], linear(batch), atol=1e-9)


@st.composite
def _berrut_case(draw: st.DrawFn) -> tuple[int, list[int], list[int], str, int]:
    k = draw(st.integers(2, 4))
    rows = draw(st.lists(st.integers(1, 4), min_size=k, max_size=k))
    arrived = draw(st.lists(st.integers(0, k), min_size=k, max_size=k, unique=True))
    return k, rows, arrived, draw(st.sampled_from(["linear", "sin"])), draw(st.integers(0, 999))


@FAST
@given(_berrut_case())
def test_berrut_approximates_from_any_needed_results(
    case: tuple[int, list[int], list[int], str, int],
) -> None:
    k, rows, arrived, name, seed = case
    f = linear if name == "linear" else np.sin
    code = BerrutCode(k, 1)
    group = BerrutGroup(code)
    batches = _curve(code.alpha, [max(rows)] * k, seed)  # equal rows: no zero padding
    _run_berrut(group, batches, f, arrived)
    assert group.ready()
    decoded = group.decode()
    assert sorted(decoded.outputs) == list(range(k))
    assert _relative_error(decoded, [f(b) for b in batches]) < BERRUT_REL


@pytest.mark.parametrize(("k", "bad"), [(2, 0), (2, 3), (2, 6), (3, 0), (3, 4), (3, 8)])
def test_berrut_locates_a_byzantine_worker(k: int, bad: int) -> None:
    code = BerrutCode(k, 1, 1)
    group = BerrutGroup(code)
    batches = _curve(code.alpha, [3] * k, seed=k)
    clean = [linear(c) for c in group.encode(batches)]
    noise = np.random.default_rng(bad).normal(scale=100.0, size=clean[bad].shape)
    for i, out in enumerate(clean):
        group.arrive(i, out + noise if i == bad else out)
    assert group.ready()
    decoded = group.decode()
    assert decoded.suspected == (bad,)
    # The decode is the clean interpolation over the honest workers.
    honest = [i for i in range(code.n_workers) if i != bad]
    expected = berrut_interpolate(code.beta[honest], np.stack(clean)[honest], code.alpha)
    for slot in range(k):
        np.testing.assert_allclose(decoded.outputs[slot], expected[slot], atol=1e-9)
    truth = [linear(b) for b in batches]
    assert _relative_error(decoded, truth) < (1e-9 if k == 2 else BERRUT_REL)


def test_berrut_short_group_is_zero_padded_and_cut() -> None:
    code = BerrutCode(3, 1)
    group = BerrutGroup(code)
    batches = _batches(3, [4, 2])
    outputs = _run_berrut(group, batches, linear, [0, 1, 3])
    assert len(outputs) == code.n_workers and outputs[0].shape == (4, CLASSES)
    decoded = group.decode()
    assert sorted(decoded.outputs) == [0, 1]  # only the real slots
    assert [decoded.outputs[s].shape for s in (0, 1)] == [(4, CLASSES), (2, CLASSES)]


def test_berrut_short_group_is_exact_for_k2_linear() -> None:
    code = BerrutCode(2, 1)
    group = BerrutGroup(code)
    (batch,) = _batches(4, [3])
    _run_berrut(group, [batch], linear, [1, 2])
    decoded = group.decode()
    assert list(decoded.outputs) == [0]
    np.testing.assert_allclose(decoded.outputs[0], linear(batch), atol=1e-9)


def test_berrut_k1_is_replication() -> None:
    code = BerrutCode(1, 1)
    group = BerrutGroup(code)
    batch = np.array([[0.5, -1.0], [2.0, 3.0]])
    coded = group.encode([batch])
    assert len(coded) == 2 and code.needed == 1
    for c in coded:
        np.testing.assert_allclose(c, batch, rtol=1e-15)
    group.arrive(1, np.tanh(coded[1]))
    assert group.ready()
    np.testing.assert_allclose(group.decode().outputs[0], np.tanh(batch), rtol=1e-15)


@pytest.mark.parametrize("count", [0, 3])
def test_berrut_encode_rejects_wrong_batch_counts(count: int) -> None:
    with pytest.raises(CodingError, match="1 to 2 batches"):
        BerrutGroup(BerrutCode(2, 1)).encode(_batches(0, [2] * count))


def test_berrut_encode_rejects_degenerate_batches() -> None:
    group = BerrutGroup(BerrutCode(2, 1))
    with pytest.raises(CodingError, match="rows of shape"):
        group.encode([np.ones((2, 3)), np.ones((2, 4))])
    with pytest.raises(CodingError, match="NaN"):
        group.encode([np.ones((2, 3)), np.full((2, 3), np.nan)])


def test_berrut_decode_without_results_raises() -> None:
    group = BerrutGroup(BerrutCode(2, 1))
    group.encode(_batches(0, [2, 2]))
    assert not group.ready()
    with pytest.raises(CodingError, match="needs 2 results, got 0"):
        group.decode()


def test_berrut_nan_result_is_dropped_when_enough_remain() -> None:
    code = BerrutCode(2, 2)
    group = BerrutGroup(code)
    batches = _batches(5, [2, 2])
    outputs = _run_berrut(group, batches, linear, [0, 3])
    group.arrive(1, np.full_like(outputs[1], np.nan))
    decoded = group.decode()  # two finite results: linear interpolation, exact for K = 2
    for slot, batch in enumerate(batches):
        assert np.all(np.isfinite(decoded.outputs[slot]))
        np.testing.assert_allclose(decoded.outputs[slot], linear(batch), atol=1e-9)


def test_berrut_too_few_finite_results_raise_then_recover() -> None:
    code = BerrutCode(2, 1)
    group = BerrutGroup(code)
    batches = _batches(6, [3, 3])
    outputs = _run_berrut(group, batches, linear, [1])
    group.arrive(0, np.full_like(outputs[0], np.nan))
    assert group.ready()  # two results, but one is unusable
    with pytest.raises(CodingError, match=r"workers \[0\] returned NaN"):
        group.decode()
    assert not group.decoded  # a failed decode keeps listening
    group.arrive(2, outputs[2])
    assert group.ready()
    decoded = group.decode()
    np.testing.assert_allclose(decoded.outputs[0], linear(batches[0]), atol=1e-9)


# --- SystematicGroup -------------------------------------------------------------------------
#
# Tolerance: K - 1 originals and one coded result, queries on the slow curve; worst error of
# the rebuilt slot relative to the group's outputs over 1000 seeds: exact for K = 2, 0.18
# for K = 4. (K = 3 reaches 0.6: its one coded node can sit on the far side of the missing
# data node, which makes the decode an extrapolation; a property of the node layout.)

SYSTEMATIC_REL = 0.3


@pytest.mark.parametrize(("k", "s"), [(1, 1), (2, 1), (3, 2), (4, 3)])
def test_systematic_encode_returns_the_coded_batches(k: int, s: int) -> None:
    code = SystematicBerrut(k, s)
    group = SystematicGroup(code)
    coded = group.encode(_batches(0, [2] * (k - 1) + [4]))
    assert code.n_workers == k + s and len(coded) == s
    assert all(c.shape == (4, DIM) for c in coded)
    assert group.missing() == list(range(k))
    assert not group.ready()


def test_systematic_nothing_to_decode_when_every_original_arrives() -> None:
    group = SystematicGroup(SystematicBerrut(3, 1))
    batches = _batches(1, [2, 3, 1])
    coded = group.encode(batches)
    group.arrive_coded(0, linear(coded[0]))
    for slot, batch in enumerate(batches):
        group.arrive(slot, linear(batch))
    assert group.missing() == [] and not group.ready()


@pytest.mark.parametrize(("k", "s", "missing", "coded_slot", "tol"), [
    (2, 1, 0, 0, 1e-9), (2, 2, 1, 1, 1e-9), (4, 1, 0, 0, SYSTEMATIC_REL),
    (4, 2, 2, 1, SYSTEMATIC_REL), (4, 2, 3, 0, SYSTEMATIC_REL)])
def test_systematic_rebuilds_the_missing_original(
    k: int, s: int, missing: int, coded_slot: int, tol: float,
) -> None:
    code = SystematicBerrut(k, s)
    group = SystematicGroup(code)
    rows = [3, 2, 3, 1][:k]
    batches = _curve(code.alpha, rows, seed=k + s)
    coded = group.encode(batches)
    for slot in range(k):
        if slot != missing:
            group.arrive(slot, linear(batches[slot]))
    assert group.missing() == [missing] and not group.ready()
    group.arrive_coded(coded_slot, linear(coded[coded_slot]))
    assert group.ready()
    decoded = group.decode()
    assert decoded.method == "systematic-berrut" and decoded.suspected == ()
    assert list(decoded.outputs) == [missing]  # arrived originals are delivered as they are
    rebuilt = decoded.outputs[missing]
    assert rebuilt.shape == (rows[missing], CLASSES)
    scale = np.linalg.norm(np.concatenate([linear(b) for b in batches]))
    assert np.linalg.norm(rebuilt - linear(batches[missing])) / scale < tol
    assert group.missing() == [] and not group.ready()


def test_systematic_short_group_counts_the_zero_batches() -> None:
    code = SystematicBerrut(2, 1)
    group = SystematicGroup(code)
    (batch,) = _batches(2, [3])
    (coded,) = group.encode([batch])
    assert group.missing() == [0]
    group.arrive_coded(0, linear(coded))  # the zero batch is known: one result suffices
    assert group.ready()
    decoded = group.decode()
    assert list(decoded.outputs) == [0]
    np.testing.assert_allclose(decoded.outputs[0], linear(batch), atol=1e-9)


def test_systematic_short_group_of_three_decodes_real_slots_only() -> None:
    group = SystematicGroup(SystematicBerrut(3, 1))
    batches = _batches(3, [4, 2])
    (coded,) = group.encode(batches)
    group.arrive(0, linear(batches[0]))
    assert not group.ready()
    group.arrive_coded(0, linear(coded))
    assert group.ready()
    decoded = group.decode()
    assert list(decoded.outputs) == [1] and decoded.outputs[1].shape == (2, CLASSES)


@pytest.mark.parametrize("count", [0, 3])
def test_systematic_encode_rejects_wrong_batch_counts(count: int) -> None:
    with pytest.raises(CodingError, match="1 to 2 batches"):
        SystematicGroup(SystematicBerrut(2, 1)).encode(_batches(0, [2] * count))


def test_systematic_decode_without_outputs_raises() -> None:
    group = SystematicGroup(SystematicBerrut(2, 1))
    group.encode(_batches(0, [2, 2]))
    with pytest.raises(CodingError, match="no outputs"):
        group.decode()


def test_systematic_nan_result_raises_then_recovers() -> None:
    code = SystematicBerrut(2, 2)
    group = SystematicGroup(code)
    batches = _batches(4, [2, 2])
    coded = group.encode(batches)
    group.arrive(0, linear(batches[0]))
    group.arrive_coded(0, np.full((2, CLASSES), np.nan))
    assert group.ready()
    with pytest.raises(CodingError, match="NaN"):
        group.decode()
    assert group.missing() == [1]
    group.arrive_coded(1, linear(coded[1]))
    decoded = group.decode()
    np.testing.assert_allclose(decoded.outputs[1], linear(batches[1]), atol=1e-9)


def test_systematic_k1_is_replication() -> None:
    group = SystematicGroup(SystematicBerrut(1, 2))
    batch = np.array([[1.0, -2.0]])
    coded = group.encode([batch])
    assert len(coded) == 2
    group.arrive_coded(1, np.tanh(coded[1]))
    assert group.ready()
    np.testing.assert_allclose(group.decode().outputs[0], np.tanh(batch), rtol=1e-15)
