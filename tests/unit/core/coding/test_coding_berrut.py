"""ApproxIFER's Berrut codes (parityserve.core.coding.berrut).

Accuracy claims are stated as tolerances. Berrut interpolation converges like O(1/N) in
the number of nodes, so for queries on a smooth curve and a model f with Lipschitz
constant L the decode error is bounded here by TOL_C * L * (S + 1)**2 / K: it shrinks with
K, and grows when S stragglers leave a gap (the worst pattern drops S adjacent nodes at an
end, which turns interpolation into extrapolation). Measured over exhaustive straggler
patterns for K in {8, 16, 24}, S <= 3 and f in {sin, tanh MLP, x**3 - x}, the largest
observed error was 0.6 * L * (S + 1)**2 / K (systematic mode: 0.65); TOL_C = 1.5 leaves
room. Queries drawn at random, not from a curve, are not smooth in the node, and the
decode is then much rougher (errors of the order of the outputs themselves): that is a
property of ApproxIFER, not of this code, and no accuracy is claimed for it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parityserve.core.coding import berrut
from parityserve.core.coding.berrut import (
    BerrutCode,
    SystematicBerrut,
    berrut_interpolate,
    berrut_weights,
    chebyshev_first_kind,
    chebyshev_second_kind,
    minimum_workers,
)
from parityserve.errors import CodingError

FAST = settings(max_examples=50, deadline=None)
TOL_C = 1.5
DIM = 5

_MLP_W = np.random.default_rng(0).normal(size=(4, DIM)) / np.sqrt(DIM)
MODELS: dict[str, tuple[Callable[[np.ndarray], np.ndarray], float]] = {
    # name: (f applied to a batch of queries, Lipschitz constant of f)
    "sin": (np.sin, 1.0),
    "mlp": (lambda x: np.tanh(x @ _MLP_W.T + 0.1), float(np.linalg.norm(_MLP_W, 2))),
    "cubic": (lambda x: x**3 - x, 2.0),
}


def test_public_names() -> None:
    assert sorted(berrut.__all__) == [
        "BerrutCode", "BerrutDecoding", "SystematicBerrut", "berrut_interpolate",
        "berrut_weights", "chebyshev_first_kind", "chebyshev_second_kind",
        "minimum_workers"]


def _curve(nodes: np.ndarray, seed: int) -> np.ndarray:
    """Queries on a smooth curve: x_j = sin(freq * node_j + phase), per coordinate."""
    rng = np.random.default_rng(seed)
    return np.sin(rng.uniform(0.5, 2.0, DIM) * nodes[:, np.newaxis] + rng.uniform(0, 6.3, DIM))


# The reference the codes are checked against, written from the papers and not from the
# package: Berrut's interpolant evaluated point by point from its formula, with plain loops,
# and the paper's nodes (ApproxIFER: data at Chebyshev points of the first kind, workers at
# those of the second). A decoder that is off anywhere (zeros, nodes mis-indexed) misses it;
# tolerances left from the implementation's own errors did not (issue 44).
def _reference_berrut(nodes: np.ndarray, values: np.ndarray, points: np.ndarray) -> np.ndarray:
    rank = {m: r for r, m in enumerate(sorted(range(len(nodes)), key=lambda m: nodes[m]))}
    out = []
    for z in points:
        on_node = [m for m in range(len(nodes)) if abs(z - nodes[m]) < 1e-12]
        if on_node:
            out.append(values[on_node[0]])
            continue
        terms = [(-1.0) ** rank[m] / (z - nodes[m]) for m in range(len(nodes))]
        out.append(sum(t * v for t, v in zip(terms, values, strict=True)) / sum(terms))
    return np.array(out)


def _paper_alpha(k: int) -> np.ndarray:
    return np.cos((2 * np.arange(k) + 1) * np.pi / (2 * k))


def _paper_beta(workers: int) -> np.ndarray:
    return np.cos(np.arange(workers) * np.pi / max(1, workers - 1))


def _reference_decode(k: int, workers: int, f: Callable[[np.ndarray], np.ndarray],
                      queries: np.ndarray, arrived: list[int]) -> np.ndarray:
    """ApproxIFER end to end on the reference: encode, f on the coded queries, decode from
    the workers that ``arrived``."""
    alpha, beta = _paper_alpha(k), _paper_beta(workers)
    coded_out = f(_reference_berrut(alpha, queries, beta))
    return _reference_berrut(beta[arrived], coded_out[arrived], alpha)


# --- nodes and sizes --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("k", "s", "e", "workers", "needed"),
    [(1, 0, 0, 1, 1), (1, 2, 0, 3, 1), (4, 0, 0, 4, 4), (4, 2, 0, 6, 4), (4, 1, 2, 13, 12),
     (3, 0, 1, 8, 8)],
)
def test_worker_counts(k: int, s: int, e: int, workers: int, needed: int) -> None:
    code = BerrutCode(k, s, e)
    assert (code.n_workers, code.needed) == (workers, needed)
    assert len(code.beta) == workers and len(code.alpha) == k


def test_nodes_follow_the_paper() -> None:
    code = BerrutCode(3, 2)
    np.testing.assert_allclose(code.alpha, np.cos([np.pi / 6, np.pi / 2, 5 * np.pi / 6]))
    np.testing.assert_allclose(code.beta, np.cos(np.arange(5) * np.pi / 4))
    np.testing.assert_array_equal(chebyshev_second_kind(0), [1.0])
    assert np.all(np.abs(chebyshev_first_kind(7)) < 1.0)
    with pytest.raises(ValueError, match="read-only"):
        code.alpha[0] = 0.0


# --- Berrut's interpolant ------------------------------------------------------------------


_distinct_nodes = st.lists(
    st.floats(-1, 1, allow_nan=False), min_size=1, max_size=12, unique=True
).filter(lambda z: len(z) == 1 or np.min(np.diff(np.sort(z))) > 1e-6)


@FAST
@given(_distinct_nodes, st.integers(0, 2**32 - 1))
def test_interpolant_is_exact_at_the_nodes_and_reproduces_constants(
    nodes: list[float], seed: int
) -> None:
    values = np.random.default_rng(seed).normal(size=(len(nodes), 2, 3))
    np.testing.assert_array_equal(berrut_interpolate(nodes, values, nodes), values)
    points = np.linspace(-1.5, 1.5, 31)
    constant = berrut_interpolate(nodes, np.full(len(nodes), 2.5), points)
    np.testing.assert_allclose(constant, 2.5, rtol=1e-9)
    np.testing.assert_allclose(berrut_weights(nodes, points).sum(axis=1), 1.0, rtol=1e-9)


@FAST
@given(_distinct_nodes, st.integers(0, 2**32 - 1))
def test_interpolant_ignores_node_order_and_handles_vectors(nodes: list[float], seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = rng.normal(size=(len(nodes), 4))
    points = rng.uniform(-1, 1, 9)
    perm = rng.permutation(len(nodes))
    joint = berrut_interpolate(nodes, values, points)
    shuffled = berrut_interpolate(np.asarray(nodes)[perm], values[perm], points)
    np.testing.assert_allclose(joint, shuffled, rtol=1e-9, atol=1e-9)
    one_column = berrut_interpolate(nodes, values[:, 2], points)
    np.testing.assert_allclose(joint[:, 2], one_column, rtol=1e-12, atol=1e-12)
    assert np.all(np.isfinite(joint))  # no real poles


@pytest.mark.parametrize(
    ("f", "bound"), [(lambda z: np.sin(3 * z), 1.5), (np.exp, 2.5)]
)
def test_interpolation_error_shrinks_like_one_over_n(
    f: Callable[[np.ndarray], np.ndarray], bound: float
) -> None:
    # Measured N * max error: 0.60-0.80 for sin(3z), 1.3-1.5 for exp(z), N = 4..128.
    points = np.linspace(-1, 1, 501)
    errors = []
    for n in (4, 8, 16, 32, 64, 128):
        nodes = chebyshev_second_kind(n)
        errors.append(np.max(np.abs(berrut_interpolate(nodes, f(nodes), points) - f(points))))
        assert errors[-1] <= bound / n
    assert all(later < earlier for earlier, later in zip(errors, errors[1:], strict=False))


def test_interpolation_rejects_bad_nodes() -> None:
    with pytest.raises(CodingError, match="distinct"):
        berrut_interpolate([0.1, 0.1], np.ones(2), [0.0])
    with pytest.raises(CodingError, match="non-empty"):
        berrut_interpolate([], np.ones(0), [0.0])
    with pytest.raises(CodingError, match="values for"):
        berrut_interpolate([0.1, 0.2], np.ones(3), [0.0])
    with pytest.raises(CodingError, match="finite"):
        berrut_weights([0.1, 0.2], [np.nan])


# --- coded inference with stragglers (E = 0) ----------------------------------------------


@st.composite
def _straggler_case(draw: st.DrawFn) -> tuple[str, int, int, list[int], int]:
    k = draw(st.sampled_from([8, 12, 16, 24]))
    s = draw(st.integers(0, 3))
    late = draw(st.lists(st.integers(0, k + s - 1), min_size=s, max_size=s, unique=True))
    return draw(st.sampled_from(sorted(MODELS))), k, s, late, draw(st.integers(0, 2**32 - 1))


@FAST
@given(_straggler_case())
def test_smooth_models_are_recovered_with_any_stragglers_missing(
    case: tuple[str, int, int, list[int], int],
) -> None:
    name, k, s, late, seed = case
    f, lipschitz = MODELS[name]
    code = BerrutCode(k, s)
    queries = _curve(code.alpha, seed)
    coded_out = f(code.encode(queries))
    results = {i: coded_out[i] for i in range(code.n_workers) if i not in late}
    decoded = code.decode(results)
    expected = _reference_decode(k, code.n_workers, f, queries, sorted(results))
    np.testing.assert_allclose(decoded, expected, rtol=1e-9, atol=1e-9)
    error = np.max(np.abs(decoded - f(queries)))
    assert error <= TOL_C * lipschitz * (s + 1) ** 2 / k


@pytest.mark.parametrize("name", sorted(MODELS))
def test_errors_shrink_as_nodes_increase(name: str) -> None:
    f, _ = MODELS[name]
    errors = []
    for k in (8, 16, 32, 64):
        code = BerrutCode(k, 1)
        queries = np.sin(1.5 * code.alpha[:, np.newaxis] + np.arange(DIM))  # one fixed curve
        coded_out = f(code.encode(queries))
        decoded = code.decode(dict(enumerate(coded_out)))
        errors.append(np.max(np.abs(decoded - f(queries))))
    assert all(later < earlier for earlier, later in zip(errors, errors[1:], strict=False))
    assert errors[-1] < errors[0] / 4


@FAST
@given(st.lists(st.integers(0, 5), min_size=2, max_size=2, unique=True), st.integers(0, 2**32))
def test_two_queries_and_an_affine_model_decode_exactly(arrived: list[int], seed: int) -> None:
    # With K = 2 the encoder's interpolant is a straight line, an affine model keeps it a
    # line, and a two-node Berrut interpolant is linear interpolation: exact recovery.
    rng = np.random.default_rng(seed)
    weights, bias = rng.normal(size=(3, 4)), rng.normal(size=3)
    code = BerrutCode(2, 4)
    queries = rng.normal(size=(2, 4))
    coded_out = code.encode(queries) @ weights.T + bias
    results = {i: coded_out[i] for i in arrived}
    np.testing.assert_allclose(code.decode(results), queries @ weights.T + bias, atol=1e-9)


@FAST
@given(st.sampled_from([2, 3, 4, 8]), st.sampled_from(sorted(MODELS)), st.data())
def test_decoding_is_exact_where_the_data_nodes_are_worker_nodes(
    k: int, name: str, data: st.DataObject,
) -> None:
    """With 2K + 1 workers the odd worker nodes cos((2j + 1) pi / 2K) are the data nodes: those
    workers compute f(x_j) itself and the decoder evaluates on their nodes, so any model is
    decoded exactly whichever even workers straggle. Mis-indexed nodes or zeros are wrong."""
    f, _ = MODELS[name]
    late = data.draw(st.lists(st.sampled_from(range(0, 2 * k + 1, 2)), max_size=k + 1,
                              unique=True))
    code = BerrutCode(k, len(late), workers=2 * k + 1)
    queries = np.random.default_rng(k).normal(size=(k, DIM))  # any queries, not a curve
    coded_out = f(code.encode(queries))
    decoded = code.decode({i: coded_out[i] for i in range(2 * k + 1) if i not in late})
    np.testing.assert_allclose(decoded, f(queries), rtol=1e-12, atol=1e-12)


@FAST
@given(_straggler_case())
def test_a_constant_model_is_decoded_exactly_with_any_stragglers(
    case: tuple[str, int, int, list[int], int],
) -> None:
    """Berrut's interpolant reproduces constants: a model that answers the same vector to every
    query is decoded to that vector, not approximately."""
    _, k, s, late, seed = case
    answer = np.random.default_rng(seed).normal(size=DIM)
    code = BerrutCode(k, s)
    results = {i: answer for i in range(code.n_workers) if i not in late}
    np.testing.assert_allclose(code.decode(results), np.tile(answer, (k, 1)), rtol=1e-12,
                               atol=1e-12)


def test_k_1_is_replication() -> None:
    code = BerrutCode(1, 2)
    query = np.array([[0.3, -1.2, 4.0]])
    coded = code.encode(query)
    np.testing.assert_allclose(coded, np.repeat(query, 3, axis=0), rtol=1e-15)
    np.testing.assert_allclose(code.decode({2: np.tanh(coded[2])}), np.tanh(query), rtol=1e-15)


def test_encode_keeps_float32_and_shapes() -> None:
    code = BerrutCode(3, 1)
    coded = code.encode(np.ones((3, 2, 2), np.float32))
    assert coded.shape == (4, 2, 2) and coded.dtype == np.float32
    assert code.decode({i: coded[i] for i in (0, 1, 3)}).shape == (3, 2, 2)


# --- degenerate input ------------------------------------------------------------------------


@pytest.mark.parametrize(("k", "s", "e"), [(0, 0, 0), (2, -1, 0), (2, 0, -1), (2.5, 0, 0)])
def test_bad_parameters_are_rejected(k: int, s: int, e: int) -> None:
    with pytest.raises(CodingError, match="must be an integer"):
        BerrutCode(k, s, e)


def test_too_few_results_and_no_results() -> None:
    code = BerrutCode(3, 2)
    with pytest.raises(CodingError, match="needs 3 results, got 2"):
        code.decode({0: np.ones(2), 4: np.ones(2)})
    with pytest.raises(CodingError, match="needs 3 results, got 0"):
        code.decode({})


def test_nan_result_is_dropped_when_enough_remain() -> None:
    code = BerrutCode(2, 2)
    coded_out = np.sin(code.encode(np.array([[0.1, 0.2], [0.3, -0.4]])))
    results = {i: coded_out[i] for i in range(4)}
    results[1] = np.array([np.nan, 0.0])
    decoding = code.decode_detailed(results)
    assert decoding.non_finite == (1,) and decoding.used == (0, 2, 3)
    assert np.all(np.isfinite(decoding.outputs))


def test_nan_result_names_the_worker_when_too_few_remain() -> None:
    code = BerrutCode(2, 1)
    with pytest.raises(CodingError, match=r"workers \[2\] returned NaN or inf"):
        code.decode({0: np.ones(2), 2: np.array([np.inf, 1.0])})


def test_mismatched_and_out_of_range_results_are_rejected() -> None:
    code = BerrutCode(2, 1)
    with pytest.raises(CodingError, match="shape"):
        code.decode({0: np.ones(2), 1: np.ones(3)})
    with pytest.raises(CodingError, match="out of range"):
        code.decode({0: np.ones(2), 7: np.ones(2)})
    with pytest.raises(CodingError, match="exactly K = 2"):
        code.encode(np.ones((3, 2)))
    with pytest.raises(CodingError, match="query 0 contains NaN"):
        code.encode(np.array([[np.nan], [1.0]]))


# --- systematic mode ---------------------------------------------------------------------------


@pytest.mark.parametrize(("k", "s"), [(1, 1), (1, 5), (3, 4), (4, 3), (5, 20), (8, 2), (30, 31)])
def test_systematic_nodes_avoid_the_data_nodes(k: int, s: int) -> None:
    code = SystematicBerrut(k, s)
    assert len(code.coded_nodes) == s and len(np.unique(code.nodes)) == k + s
    gaps = np.abs(code.coded_nodes[:, np.newaxis] - code.alpha[np.newaxis, :])
    assert gaps.min() > 1e-3
    assert np.all(np.abs(code.coded_nodes) <= 1.0)


def test_systematic_is_exact_when_all_originals_arrive() -> None:
    code = SystematicBerrut(4, 2)
    queries = np.random.default_rng(1).normal(size=(4, 3))
    coded = code.encode(queries)
    np.testing.assert_array_equal(coded[:4], queries)
    outputs = np.tanh(coded)
    results = {i: outputs[i] for i in range(4)}
    results[5] = np.array([np.nan, 0.0, 0.0])  # a broken coded worker does not matter
    np.testing.assert_array_equal(code.decode(results), outputs[:4])


@st.composite
def _systematic_case(draw: st.DrawFn) -> tuple[str, int, int, list[int], int]:
    k = draw(st.sampled_from([8, 12, 16]))
    s = draw(st.integers(1, 3))
    late = draw(st.lists(st.integers(0, k + s - 1), min_size=1, max_size=s, unique=True))
    return draw(st.sampled_from(sorted(MODELS))), k, s, late, draw(st.integers(0, 2**32 - 1))


@FAST
@given(_systematic_case())
def test_systematic_is_approximate_when_originals_are_missing(
    case: tuple[str, int, int, list[int], int],
) -> None:
    name, k, s, late, seed = case
    f, lipschitz = MODELS[name]
    code = SystematicBerrut(k, s)
    queries = _curve(code.alpha, seed)
    outputs = f(code.encode(queries))
    decoded = code.decode({i: outputs[i] for i in range(k + s) if i not in late})
    arrived = [j for j in range(k) if j not in late]
    np.testing.assert_array_equal(decoded[arrived], outputs[arrived])
    # The missing ones: the reference interpolant through every result that arrived, the
    # originals at the paper's data nodes and the coded ones at theirs.
    nodes = np.concatenate([_paper_alpha(k), code.coded_nodes])
    np.testing.assert_allclose(code.encode(queries)[k:], _reference_berrut(
        _paper_alpha(k), queries, code.coded_nodes), rtol=1e-6, atol=1e-6)
    came = [i for i in range(k + s) if i not in late]
    expected = _reference_berrut(nodes[came], outputs[came], _paper_alpha(k))
    np.testing.assert_allclose(decoded, expected, rtol=1e-9, atol=1e-9)
    assert np.max(np.abs(decoded - f(queries))) <= TOL_C * lipschitz * (s + 1) ** 2 / k


def test_systematic_degenerate_input() -> None:
    code = SystematicBerrut(3, 1)
    with pytest.raises(CodingError, match="needs 3 results, got 2"):
        code.decode({0: np.ones(2), 3: np.ones(2)})
    with pytest.raises(CodingError, match=r"workers \[1\] returned NaN"):
        code.decode({0: np.ones(2), 1: np.full(2, np.nan), 3: np.ones(2)})
    with pytest.raises(CodingError, match="S must be"):
        SystematicBerrut(3, -1)
    replica = SystematicBerrut(1, 2)
    np.testing.assert_allclose(replica.encode(np.array([[2.0, 3.0]])), [[2.0, 3.0]] * 3)
    np.testing.assert_allclose(replica.decode({2: np.array([5.0])}), [[5.0]])


# ---- more workers than the minimum ---------------------------------------------------------


def test_minimum_workers_tolerate_s_and_e():
    assert minimum_workers(8, 2) == 10
    assert minimum_workers(12, 0, 2) == 28
    assert minimum_workers(4, 1, 1) == 11


def test_workers_default_to_the_minimum_and_the_group_waits_for_all_but_s():
    code = BerrutCode(8, 2)
    assert (code.n_workers, code.needed, code.decode_at) == (10, 8, 8)
    wide = BerrutCode(8, 2, workers=16)
    assert (wide.n_workers, wide.needed, wide.decode_at) == (16, 8, 14)
    assert BerrutCode(4, 0, 1, workers=12).decode_at == 12


@pytest.mark.parametrize("workers", [9, 0, 2.5, True])
def test_fewer_workers_than_the_minimum_is_refused(workers):
    with pytest.raises(CodingError, match="needs at least 10 workers"):
        BerrutCode(8, 2, workers=workers)


def test_extra_workers_decode_a_nonlinear_model_more_accurately():
    rng = np.random.default_rng(7)
    weights, queries = rng.normal(size=(10, 20)), rng.normal(size=(8, 20))

    def model(x):
        return np.tanh(x @ weights.T)

    def mean_error(workers: int) -> float:
        code = BerrutCode(8, 2, workers=workers)
        outputs = model(code.encode(queries))
        errors = []
        for _ in range(20):
            late = set(rng.choice(code.n_workers, 2, replace=False).tolist())
            decoded = code.decode({w: outputs[w] for w in range(code.n_workers)
                                   if w not in late})
            errors.append(np.abs(decoded - model(queries)).mean())
        return float(np.mean(errors))

    assert mean_error(22) < 0.8 * mean_error(10)


# --- systematic mode, the subtraction decoder ----------------------------------------------------


@pytest.mark.parametrize(("k", "s"), [(2, 1), (8, 1), (8, 2), (8, 3), (12, 3), (16, 2)])
def test_subtraction_rebuilds_an_affine_model_exactly_from_unrelated_queries(k: int,
                                                                            s: int) -> None:
    # Unrelated random queries (not on a smooth curve), like a group of different digits:
    # interpolation has nothing smooth to follow, but the subtraction decoder uses the
    # originals that arrived exactly and is exact for any affine model.
    rng = np.random.default_rng(k * 10 + s)
    weight, bias = rng.normal(size=(3, DIM)), rng.normal(size=3)
    code = SystematicBerrut(k, s, decoder="subtract")
    queries = rng.normal(size=(k, DIM))
    outputs = code.encode(queries) @ weight.T + bias
    truth = queries @ weight.T + bias
    for late in [list(range(s)), list(range(k - s, k)), list(range(k, k + s)),
                 sorted(rng.choice(k + s, size=s, replace=False).tolist())]:
        decoded = code.decode({i: outputs[i] for i in range(k + s) if i not in late})
        np.testing.assert_allclose(decoded, truth, atol=1e-8)
        arrived = [j for j in range(k) if j not in late]
        np.testing.assert_array_equal(decoded[arrived], outputs[arrived])


def test_subtraction_uses_the_arrived_originals_and_interpolation_does_not_rebuild_exactly(
) -> None:
    rng = np.random.default_rng(7)
    queries, weight = rng.normal(size=(8, DIM)), rng.normal(size=(2, DIM))
    results = {i: out for i, out in enumerate(SystematicBerrut(8, 1).encode(queries) @ weight.T)}
    del results[3]
    sub = SystematicBerrut(8, 1, decoder="subtract").decode(results)
    interp = SystematicBerrut(8, 1).decode(results)
    truth = queries[3] @ weight.T
    np.testing.assert_allclose(sub[3], truth, atol=1e-9)
    assert np.max(np.abs(interp[3] - truth)) > 0.1  # the default is approximate here
    # Query 3's rebuild is the coded result minus the others' known contributions: a change
    # in one arrived original moves it by that original's weight ratio.
    moved = dict(results)
    moved[0] = results[0] + 1.0
    shift = SystematicBerrut(8, 1, decoder="subtract").decode(moved)[3] - sub[3]
    mix = berrut_weights(chebyshev_first_kind(8), SystematicBerrut(8, 1).coded_nodes)[0]
    np.testing.assert_allclose(shift, -mix[0] / mix[3] * np.ones(2), atol=1e-9)


def test_subtraction_with_every_original_arriving_returns_them_as_they_are() -> None:
    code = SystematicBerrut(4, 2, decoder="subtract")
    outputs = np.tanh(code.encode(np.random.default_rng(2).normal(size=(4, 3))))
    results = {i: outputs[i] for i in range(4)}
    np.testing.assert_array_equal(code.decode(results), outputs[:4])
    assert code.decoder == "subtract" and SystematicBerrut(4, 2).decoder == "interpolate"


def test_an_unknown_systematic_decoder_is_refused() -> None:
    with pytest.raises(CodingError, match="decoder must be one of interpolate, subtract"):
        SystematicBerrut(4, 1, decoder="average")
