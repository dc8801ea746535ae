"""ParM parity codes (parityserve.core.coding.parity)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parityserve.core import coding
from parityserve.core.coding import parity
from parityserve.core.coding.parity import (
    AdditionEncoder,
    ConcatEncoder,
    LinearCode,
    SubtractionDecoder,
)
from parityserve.errors import CodingError

FAST = settings(max_examples=60, deadline=None)


def test_public_names() -> None:
    assert sorted(parity.__all__) == [
        "AdditionEncoder", "ConcatEncoder", "LinearCode", "SubtractionDecoder"]
    assert sorted(coding.__all__) == [
        "AdditionEncoder", "BerrutCode", "BerrutDecoding", "ConcatEncoder", "LinearCode",
        "SubtractionDecoder", "SystematicBerrut", "berrut_interpolate", "berrut_weights",
        "chebyshev_first_kind", "chebyshev_second_kind", "locate_rational_errors",
        "minimum_workers"]
    for name in coding.__all__:
        assert getattr(coding, name) is not None


def _queries(seed: int, k: int, shape: tuple[int, ...] = (7,)) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=shape) for _ in range(k)]


# --- AdditionEncoder / SubtractionDecoder ---------------------------------------------


def test_addition_encoder_sums_the_group() -> None:
    qs = _queries(0, 3)
    np.testing.assert_allclose(AdditionEncoder(3).encode(qs), qs[0] + qs[1] + qs[2])


def test_short_group_is_zero_padded() -> None:
    qs = _queries(1, 2)
    padded = [*qs, np.zeros(7), np.zeros(7)]
    np.testing.assert_array_equal(AdditionEncoder(4).encode(qs), AdditionEncoder(4).encode(padded))


def test_encoders_keep_float32_and_do_not_overflow_small_ints() -> None:
    assert AdditionEncoder(2).encode([np.ones(3, np.float32)] * 2).dtype == np.float32
    pixels = [np.full((2, 2), 200, np.uint8)] * 2
    summed = AdditionEncoder(2).encode(pixels)
    assert summed.dtype == np.float32
    assert np.all(summed == 400.0)


def test_subtraction_decoder_rebuilds_the_missing_output() -> None:
    outs = _queries(2, 4)
    rebuilt = SubtractionDecoder().decode({0: outs[0], 1: outs[1], 3: outs[3]}, sum(outs), 4)
    np.testing.assert_allclose(rebuilt, outs[2], atol=1e-12)


def test_subtraction_decoder_with_k_1_is_replication() -> None:
    out = np.arange(3.0)
    np.testing.assert_array_equal(SubtractionDecoder().decode({}, out, 1), out)


@pytest.mark.parametrize("present", [{0: 1.0, 1: 2.0, 2: 3.0}, {0: 1.0}])
def test_subtraction_decoder_needs_exactly_one_missing(present: dict[int, float]) -> None:
    outs = {i: np.array([v]) for i, v in present.items()}
    with pytest.raises(CodingError, match="exactly one missing"):
        SubtractionDecoder().decode(outs, np.array([6.0]), 3)


def test_subtraction_decoder_rejects_bad_input() -> None:
    dec = SubtractionDecoder()
    with pytest.raises(CodingError, match="out of range"):
        dec.decode({0: np.ones(2), 5: np.ones(2)}, np.ones(2), 3)
    with pytest.raises(CodingError, match="shape"):
        dec.decode({0: np.ones(2)}, np.ones(3), 2)
    with pytest.raises(CodingError, match="NaN"):
        dec.decode({0: np.array([np.nan, 1.0])}, np.ones(2), 2)
    with pytest.raises(CodingError, match="k >= 1"):
        dec.decode({}, np.ones(2), 0)


# --- LinearCode: exact for bias-free linear models ------------------------------------


@st.composite
def _erasures(draw: st.DrawFn) -> tuple[int, int, list[int], list[int], int]:
    """k, r, the missing outputs (at most r), the parities that arrived (at least as many)."""
    k = draw(st.integers(2, 5))
    r = draw(st.integers(1, 3))
    lost = draw(st.lists(st.integers(0, k - 1), min_size=1, max_size=min(r, k), unique=True))
    arrived = draw(st.lists(st.integers(0, r - 1), min_size=len(lost), max_size=r, unique=True))
    return k, r, lost, arrived, draw(st.integers(0, 2**32 - 1))


@FAST
@given(_erasures())
def test_default_code_rebuilds_any_erasure_of_a_linear_model_exactly(
    case: tuple[int, int, list[int], list[int], int],
) -> None:
    k, r, lost, arrived, seed = case
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=(3, 6))
    queries = [rng.normal(size=6) for _ in range(k)]
    code = LinearCode.default(k, r)
    outputs = {i: weights @ q for i, q in enumerate(queries) if i not in lost}
    parities = {j: weights @ p for j, p in enumerate(code.encode(queries)) if j in arrived}
    rebuilt = code.decode(outputs, parities, lost)
    assert sorted(rebuilt) == sorted(lost)
    for i in lost:
        np.testing.assert_allclose(rebuilt[i], weights @ queries[i], rtol=1e-8, atol=1e-8)


def test_affine_model_is_off_by_k_minus_1_biases() -> None:
    # Documents why ParM needs a learned parity model: with f(x) = Wx + b the parity
    # output f(sum x) lacks (k - 1) copies of b, and the decode inherits that offset.
    rng = np.random.default_rng(3)
    weights, bias, k = rng.normal(size=(2, 4)), np.array([0.5, -1.0]), 4
    qs = [rng.normal(size=4) for _ in range(k)]
    code = LinearCode.addition(k)
    outputs = {i: weights @ q + bias for i, q in enumerate(qs) if i != 1}
    parity_out = {0: weights @ code.encode(qs)[0] + bias}
    rebuilt = code.decode(outputs, parity_out, [1])[1]
    np.testing.assert_allclose(rebuilt - (weights @ qs[1] + bias), -(k - 1) * bias, atol=1e-12)


def test_addition_code_matches_the_subtraction_decoder() -> None:
    outs = _queries(4, 3, (2, 5))
    parity_out = outs[0] + outs[1] + outs[2]
    by_lstsq = LinearCode.addition(3).decode({0: outs[0], 2: outs[2]}, {0: parity_out}, [1])[1]
    by_sub = SubtractionDecoder().decode({0: outs[0], 2: outs[2]}, parity_out, 3)
    np.testing.assert_allclose(by_lstsq, by_sub, atol=1e-12)
    assert by_lstsq.shape == (2, 5)


def test_default_code_coefficients() -> None:
    np.testing.assert_array_equal(
        LinearCode.default(3, 3).coefficients, [[1, 1, 1], [1, 2, 3], [1, 4, 9]])
    assert LinearCode.addition(4).coefficients.tolist() == [[1.0] * 4]
    with pytest.raises(ValueError, match="read-only"):
        LinearCode.addition(2).coefficients[0, 0] = 5.0


def test_all_outputs_missing_is_fine_when_parities_suffice() -> None:
    qs = _queries(5, 2)
    code = LinearCode.default(2, 2)
    rebuilt = code.decode({}, dict(enumerate(code.encode(qs))), [0, 1])
    np.testing.assert_allclose(rebuilt[0], qs[0], atol=1e-12)
    np.testing.assert_allclose(rebuilt[1], qs[1], atol=1e-12)


def test_nothing_missing_decodes_to_nothing() -> None:
    qs = _queries(6, 2)
    assert LinearCode.addition(2).decode(dict(enumerate(qs)), {}, []) == {}


def test_too_few_parities_is_a_clear_error() -> None:
    code = LinearCode.default(4, 2)
    with pytest.raises(CodingError, match="3 outputs are missing but only 2 parity"):
        code.decode({0: np.ones(2)}, {0: np.ones(2), 1: np.ones(2)}, [1, 2, 3])
    with pytest.raises(CodingError, match="only 0 parity"):
        LinearCode.addition(3).decode({}, {}, [0, 1, 2])


def test_rank_deficient_system_is_a_clear_error() -> None:
    code = LinearCode([[1.0, 1.0], [2.0, 2.0]])  # both parities see x0 + x1 only
    with pytest.raises(CodingError, match="rank 1 < 2"):
        code.decode({}, {0: np.ones(2), 1: np.ones(2)}, [0, 1])


@pytest.mark.parametrize(
    ("outputs", "missing", "message"),
    [
        ({0: 1.0, 1: 1.0}, [1], "both given and listed as missing"),
        ({0: 1.0}, [1], "neither given nor listed"),
        ({0: 1.0, 1: 1.0}, [2, 2], "duplicates"),
        ({0: 1.0, 1: 1.0}, [3], "out of range"),
        ({0: 1.0, 1: np.nan}, [2], "output 1 contains NaN"),
    ],
)
def test_inconsistent_positions_are_rejected(
    outputs: dict[int, float], missing: list[int], message: str
) -> None:
    arrays = {i: np.array([v, 0.0]) for i, v in outputs.items()}
    with pytest.raises(CodingError, match=message):
        LinearCode.default(3, 1).decode(arrays, {0: np.ones(2)}, missing)


def test_mismatched_shapes_are_rejected() -> None:
    code = LinearCode.addition(2)
    with pytest.raises(CodingError, match="shape"):
        code.decode({0: np.ones(3)}, {0: np.ones(2)}, [1])
    with pytest.raises(CodingError, match="shape"):
        code.encode([np.ones(3), np.ones(2)])


def test_linear_code_rejects_bad_construction_and_groups() -> None:
    for bad in ([1.0, 2.0], np.zeros((0, 3)), [[1.0, np.inf]]):
        with pytest.raises(CodingError):
            LinearCode(bad)
    with pytest.raises(CodingError, match="r >= 1"):
        LinearCode.default(3, 0)
    with pytest.raises(CodingError, match="k >= 1"):
        LinearCode.addition(0)
    with pytest.raises(CodingError, match="at most k = 2"):
        LinearCode.addition(2).encode(_queries(7, 3))
    with pytest.raises(CodingError, match="no query"):
        AdditionEncoder(2).encode([])
    with pytest.raises(CodingError, match="query 1 contains NaN"):
        AdditionEncoder(2).encode([np.ones(2), np.array([1.0, np.nan])])


def test_linear_code_encode_shape_and_short_group() -> None:
    qs = _queries(8, 2, (3, 4))
    parities = LinearCode.default(4, 3).encode(qs)
    assert parities.shape == (3, 3, 4)
    np.testing.assert_allclose(parities[2], qs[0] + 4 * qs[1])


# --- ConcatEncoder ----------------------------------------------------------------------


def _pool2(image: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Reference stride-2 average pooling by reshaping (even sizes only)."""
    c, h, w = image.shape
    return image.reshape(c, h // rows, rows, w // cols, cols).mean(axis=(2, 4))


@pytest.mark.parametrize("shape", [(3, 32, 32), (28, 28), (784,), (1, 6, 10)])
@pytest.mark.parametrize("k", [2, 4])
def test_concat_keeps_the_shape_and_tiles_hold_the_downsampled_images(
    shape: tuple[int, ...], k: int
) -> None:
    qs = _queries(9, k, shape)
    encoded = ConcatEncoder(k).encode(qs)
    assert encoded.shape == shape
    images = [q.reshape(-1, 28, 28) if len(shape) == 1 else q.reshape(-1, *q.shape[-2:])
              for q in qs]
    plane = encoded.reshape(images[0].shape)
    tiles = ConcatEncoder(k).tile_slices(*images[0].shape[-2:])
    for image, (rows, cols) in zip(images, tiles, strict=True):
        expected = _pool2(image, 1 if k == 2 else 2, 2)
        np.testing.assert_allclose(plane[:, rows, cols], expected, atol=1e-12)


def test_concat_short_group_leaves_empty_tiles_zero() -> None:
    qs = _queries(10, 3, (2, 8, 8))
    encoded = ConcatEncoder(4).encode(qs)
    assert np.all(encoded[:, 4:, 4:] == 0.0)
    assert np.any(encoded[:, 4:, :4] != 0.0)


@FAST
@given(
    st.integers(2, 11),
    st.integers(2, 11),
    st.sampled_from([2, 4]),
    st.lists(st.floats(-5, 5), min_size=1, max_size=4),
)
def test_concat_odd_sizes_keep_shape_and_constants(
    height: int, width: int, k: int, levels: list[float]
) -> None:
    levels = levels[:k]
    qs = [np.full((2, height, width), level) for level in levels]
    encoded = ConcatEncoder(k).encode(qs)
    assert encoded.shape == (2, height, width)
    tiles = ConcatEncoder(k).tile_slices(height, width)
    covered = np.zeros((height, width), int)
    for i, (rows, cols) in enumerate(tiles):
        covered[rows, cols] += 1
        expected = levels[i] if i < len(levels) else 0.0
        np.testing.assert_allclose(encoded[:, rows, cols], expected, atol=1e-12)
    assert np.all(covered == 1)  # the tiles partition the image exactly


@pytest.mark.parametrize(
    ("k", "shape", "message"),
    [
        (2, (5,), "flat square image"),
        (2, (2, 3, 4, 5), "flat square image"),
        (4, (1, 8), "too small"),
        (2, (8, 1), "too small"),
    ],
)
def test_concat_rejects_unusable_layouts(k: int, shape: tuple[int, ...], message: str) -> None:
    with pytest.raises(CodingError, match=message):
        ConcatEncoder(k).encode([np.ones(shape)])


def test_concat_supports_only_k_2_and_4() -> None:
    with pytest.raises(CodingError, match="k = 2 or k = 4"):
        ConcatEncoder(3)


# ---- the fast path (no stack, result checked instead of inputs) agrees with the checked one --
@pytest.mark.parametrize("k", [2, 3, 4])
def test_fast_encode_matches_a_float64_sum_for_float32_images(k: int) -> None:
    rng = np.random.default_rng(k)
    xs = [rng.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(k)]
    want = np.sum(np.stack(xs).astype(np.float64), axis=0)
    for got in (LinearCode.addition(k).encode(xs)[0], AdditionEncoder(k).encode(xs)):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_fast_decode_with_general_coefficients_and_int_inputs() -> None:
    code = LinearCode([[2.0, -3.0, 0.5]])
    ys = [np.arange(4, dtype=np.int64) + i for i in range(3)]
    parity = code.encode(ys)[0]
    assert parity.dtype == np.float64
    rebuilt = code.decode({0: ys[0], 2: ys[2]}, {0: parity}, [1])[1]
    np.testing.assert_allclose(rebuilt, ys[1], rtol=1e-12, atol=1e-12)


def test_a_nan_with_a_zero_coefficient_is_still_refused() -> None:
    code = LinearCode([[1.0, 0.0]])
    with pytest.raises(CodingError, match="query 1 contains NaN"):
        code.encode([np.ones(3), np.array([1.0, np.nan, 1.0])])
