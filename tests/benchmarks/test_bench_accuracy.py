"""``benchmarks.accuracy``: metric formulas, coded-accuracy trials and tables, on synthetic data."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks import accuracy_eval as ev
from benchmarks import accuracy_report as rep
from parityserve.core.coding import (
    AdditionEncoder,
    BerrutCode,
    ConcatEncoder,
    SystematicBerrut,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def identity(batch: np.ndarray) -> np.ndarray:
    return np.asarray(batch, dtype=np.float64)


def one_hot_data(n: int, classes: int = 10, seed: int = 0,
                 scale: float = 10.0) -> tuple[np.ndarray, np.ndarray]:
    """Inputs that are their own (perfect) logits: a scaled one-hot row per label."""
    y = np.random.default_rng(seed).integers(0, classes, size=n)
    return scale * np.eye(classes)[y], y


# --- metrics --------------------------------------------------------------------------------


def test_accuracy_counts_argmax_hits() -> None:
    outputs = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
    assert ev.accuracy(outputs, np.array([1, 0, 0, 0])) == 0.75
    assert ev.accuracy(outputs.reshape(2, 2, 2), np.array([[1, 0], [0, 0]])) == 0.75
    with pytest.raises(ValueError):
        ev.accuracy(outputs, np.array([1, 0]))


def test_overall_accuracy_interpolates_between_available_and_degraded() -> None:
    f = [0.0, 0.05, 0.1, 1.0]
    a_o = ev.overall_accuracy(0.98, 0.90, f)
    assert a_o == pytest.approx([0.98, 0.976, 0.972, 0.90])
    with pytest.raises(ValueError):
        ev.overall_accuracy(0.9, 0.8, [1.5])


def test_default_bound_uses_the_default_answers_hit_rate() -> None:
    assert ev.default_bound(0.9, 0.1, [0.1])[0] == pytest.approx(0.9 * 0.9 + 0.1 * 0.1)
    cls, rate = ev.majority_rate(np.array([3, 3, 1, 3, 0]), 10)
    assert (cls, rate) == (3, 0.6)
    assert ev.default_bound(1.0, rate, [0.1])[0] == pytest.approx(0.96)


def test_mean_spread() -> None:
    got = ev.mean_spread([0.9, 0.8, 0.7])
    assert got["mean"] == pytest.approx(0.8)
    assert got["std"] == pytest.approx(0.1)  # sample standard deviation
    assert (got["min"], got["max"], got["n"]) == (0.7, 0.9, 3)
    assert ev.mean_spread([0.5])["std"] == 0.0
    with pytest.raises(ValueError):
        ev.mean_spread([])


def test_groupings_are_random_partitions() -> None:
    rng = np.random.default_rng(0)
    groups = ev.groupings(23, 4, 3, rng)
    assert len(groups) == 3
    for g in groups:
        assert g.shape == (5, 4)
        assert len(set(g.ravel().tolist())) == 20  # no sample twice in one grouping
    assert not np.array_equal(groups[0], groups[1])
    with pytest.raises(ValueError):
        ev.groupings(3, 4, 1, rng)


# --- ApproxIFER -----------------------------------------------------------------------------


@pytest.mark.parametrize(("K", "S", "E"), [(3, 1, 0), (4, 2, 0), (3, 0, 1)])
def test_coded_outputs_match_the_codes_own_encoder(K: int, S: int, E: int) -> None:
    x = np.random.default_rng(1).normal(size=(4 * K, 5))
    groups = ev.groupings(len(x), K, 1, np.random.default_rng(2))[0]
    code = BerrutCode(K, S, E)
    outs = ev.coded_outputs(identity, x, groups, code, batch=7)
    assert outs.shape == (len(groups), code.n_workers, 5)
    for g, group in enumerate(groups):
        np.testing.assert_allclose(outs[g], code.encode(x[group]), atol=1e-12)


def test_coded_outputs_systematic_keeps_the_originals() -> None:
    x = np.random.default_rng(3).normal(size=(12, 4))
    groups = ev.groupings(len(x), 3, 1, np.random.default_rng(4))[0]
    code = SystematicBerrut(3, 2)
    outs = ev.systematic_outputs(identity, x, groups, code)
    for g, group in enumerate(groups):
        np.testing.assert_allclose(outs[g], code.encode(x[group]), atol=1e-12)
        np.testing.assert_allclose(outs[g, :3], x[group], atol=1e-12)


def test_straggler_decode_matches_the_codes_decoder() -> None:
    code = BerrutCode(4, 2)
    outputs = np.random.default_rng(5).normal(size=(6, code.n_workers, 3))
    decoded = ev.berrut_decode_stragglers(code, outputs, 0, np.random.default_rng(0))
    for g in range(len(outputs)):
        expect = code.decode({w: outputs[g, w] for w in range(code.n_workers)})
        np.testing.assert_allclose(decoded[g], expect, atol=1e-12)
    # With stragglers, each group is decoded from the K fastest: constants stay exact.
    const = np.broadcast_to(np.arange(3.0), outputs.shape)
    got = ev.berrut_decode_stragglers(code, const, 2, np.random.default_rng(1))
    np.testing.assert_allclose(got, np.broadcast_to(np.arange(3.0), got.shape), atol=1e-12)
    with pytest.raises(ValueError):
        ev.berrut_decode_stragglers(code, outputs, 3, np.random.default_rng(1))


def test_straggler_trial_replication_is_exact() -> None:
    # K = 1: every coded query is the query itself, so accuracy is the model's own.
    x, y = one_hot_data(40)
    code = BerrutCode(1, 2)
    groups = ev.groupings(len(x), 1, 1, np.random.default_rng(0))[0]
    outs = ev.coded_outputs(identity, x, groups, code)
    for space in ("logits", "probs"):
        assert ev.straggler_trial(code, outs, y[groups], 2, np.random.default_rng(0),
                                  space=space) == 1.0
    with pytest.raises(ValueError):
        ev.straggler_trial(code, outs, y[groups], 2, np.random.default_rng(0), space="x")


def test_byzantine_trial_locates_large_corruptions() -> None:
    # The identity model's coded outputs are exactly the rational Berrut interpolant, which
    # is what the locator fits: huge noise on E workers must be found and excluded.
    x, y = one_hot_data(60, seed=6)
    code = BerrutCode(3, 0, 1)
    groups = ev.groupings(len(x), 3, 1, np.random.default_rng(7))[0]
    outs = ev.coded_outputs(identity, x, groups, code)
    got = ev.byzantine_trial(code, outs, y[groups], 1e4, np.random.default_rng(8))
    assert got.located == 1.0
    clean = ev.accuracy(ev.berrut_decode_stragglers(code, outs, 0, np.random.default_rng(0)),
                        y[groups])
    assert got.accuracy == pytest.approx(clean, abs=0.05)


def test_systematic_trial_without_stragglers_is_exact() -> None:
    x, y = one_hot_data(30, seed=9)
    code = SystematicBerrut(3, 0)
    groups = ev.groupings(len(x), 3, 1, np.random.default_rng(0))[0]
    outs = ev.systematic_outputs(identity, x, groups, code)
    got = ev.systematic_trial(code, outs, y[groups], np.random.default_rng(0))
    assert got == {"group": 1.0, "degraded": None, "rebuilt": 0}


def test_systematic_trial_counts_rebuilt_queries() -> None:
    x, y = one_hot_data(300, seed=10)
    code = SystematicBerrut(3, 2)
    groups = ev.groupings(len(x), 3, 1, np.random.default_rng(0))[0]
    outs = ev.systematic_outputs(identity, x, groups, code)
    got = ev.systematic_trial(code, outs, y[groups], np.random.default_rng(1))
    assert 0 < got["rebuilt"] <= 2 * len(groups)
    assert 0.0 <= got["degraded"] <= 1.0 and 0.0 <= got["group"] <= 1.0
    # Originals that arrived are exact, so every miss is a rebuilt one.
    misses = (1 - got["group"]) * y[groups].size
    assert misses <= got["rebuilt"] * (1 - got["degraded"]) + 1e-9



def test_systematic_trial_with_the_subtract_decoder_rebuilds_a_linear_model_exactly() -> None:
    # identity is linear, so subtracting the arrived originals leaves exactly the missing one;
    # interpolation over unrelated one-hot rows gets some of the same queries wrong.
    x, y = one_hot_data(400, seed=11)
    groups = ev.groupings(len(x), 8, 1, np.random.default_rng(0))[0]
    sub, interp = SystematicBerrut(8, 1, decoder="subtract"), SystematicBerrut(8, 1)
    outs = ev.systematic_outputs(identity, x, groups, sub)
    got = ev.systematic_trial(sub, outs, y[groups], np.random.default_rng(2))
    assert got["rebuilt"] > 0 and got["degraded"] == 1.0 and got["group"] == 1.0
    plain = ev.systematic_trial(interp, outs, y[groups], np.random.default_rng(2))
    assert plain["rebuilt"] == got["rebuilt"] and plain["degraded"] < 1.0


# --- ParM -----------------------------------------------------------------------------------


def test_parity_queries_use_the_core_encoders() -> None:
    x = np.random.default_rng(11).random((8, 784)).astype(np.float32)
    groups = np.arange(8).reshape(4, 2)
    add = ev.parity_queries(x, groups, "addition")
    np.testing.assert_allclose(add[1], AdditionEncoder(2).encode(list(x[2:4])), rtol=1e-6)
    cat = ev.parity_queries(x, groups, "concat")
    np.testing.assert_allclose(cat[1], ConcatEncoder(2).encode(list(x[2:4])), rtol=1e-6)
    assert add.dtype == cat.dtype == np.float32
    with pytest.raises(ValueError):
        ev.parity_queries(x, groups, "xor")


@pytest.mark.parametrize("encoder", ["addition", "concat"])
def test_parm_degraded_with_a_perfect_parity_model(encoder: str) -> None:
    outputs, y = one_hot_data(60, seed=12)
    groups = ev.groupings(len(y), 3, 1, np.random.default_rng(0))[0]
    if encoder == "addition":
        parity = outputs[groups].sum(axis=1)
    else:  # logits whose softmax is the mean of the k softmaxes
        parity = np.log(ev.softmax(outputs[groups]).mean(axis=1))
    assert ev.parm_degraded(outputs, parity, groups, y, encoder,
                            np.random.default_rng(0)) == 1.0
    # A parity model that outputs zeros rebuilds minus the others: wrong for these outputs.
    assert ev.parm_degraded(outputs, np.zeros_like(parity), groups, y, "addition",
                            np.random.default_rng(0)) < 0.5


# --- report ---------------------------------------------------------------------------------


def _cell(kind: str, mean: float, a_a: float = 0.98, dataset: str = "mnist",
          model: str = "mlp", **fields: object) -> dict[str, object]:
    cell = {"kind": kind, "dataset": dataset, "model": model, "a_available": a_a,
            "trials": [mean] * 3, "stats": ev.mean_spread([mean - 0.01, mean, mean + 0.01]),
            "test_samples": 100, **fields}
    cell["id"] = rep.cell_id(cell)
    return cell


def _payload(*cells: dict[str, object]) -> dict[str, object]:
    bases = {}
    for c in cells:
        bases[f"{c['dataset']}|{c['model']}"] = {
            "dataset": c["dataset"], "model": c["model"], "a_available": c["a_available"],
            "majority_rate": 0.11, "weights": "w.npz", "test_samples": 100}
    return {"bases": bases, "cells": rep.merge_cells([], cells)}


def test_cell_ids_and_merge() -> None:
    a = _cell("byzantine", 0.9, K=12, S=0, E=2, sigma=10.0)
    assert rep.cell_id(a) == "byzantine|mnist|mlp|K12|S0|E2|sigma10"
    assert rep.cell_id(_cell("parm", 0.9, K=2, encoder="concat")) == "parm|mnist|mlp|K2|concat"
    b = {**a, "stats": ev.mean_spread([0.5])}
    other = _cell("approxifer", 0.8, K=8, S=1, E=0)
    merged = rep.merge_cells([a, other], [b])
    assert len(merged) == 2
    assert merged[0]["kind"] == "approxifer"  # table order: approxifer before byzantine
    assert merged[1]["stats"]["mean"] == 0.5  # the re-run replaced the old cell


def test_verdicts() -> None:
    assert rep.verdict_at_most(3.0, 9.4) == "beat"
    assert rep.verdict_at_most(9.0, 9.4) == "met"
    assert rep.verdict_at_most(9.5, 9.4) == "missed"
    assert rep.verdict_at_most(None, 9.4) == "not run"
    assert rep.verdict_gap_range(1.0, 1.7, 9.8) == "beat"
    assert rep.verdict_gap_range(5.0, 1.7, 9.8) == "met"
    assert rep.verdict_gap_range(12.0, 1.7, 9.8) == "missed"
    assert rep.verdict_up_to(60.0, 58.0) == "beat"
    assert rep.verdict_up_to(50.0, 58.0) == "met"
    assert rep.verdict_up_to(20.0, 58.0) == "missed"


def test_parm_rows_overall_and_default_bound() -> None:
    payload = _payload(_cell("parm", 0.90, K=2, encoder="addition", epochs=3))
    (row,) = rep.parm_rows(payload)
    assert row["loss"] == pytest.approx(8.0)
    assert row["a_o_0.1"] == pytest.approx(100 * (0.9 * 0.98 + 0.1 * 0.90))
    assert row["def_0.1"] == pytest.approx(100 * (0.9 * 0.98 + 0.1 * 0.11))


def test_comparison_gain_and_claims() -> None:
    payload = _payload(
        _cell("parm", 0.50, K=12, encoder="addition"),
        _cell("approxifer", 0.80, K=12, S=1, E=0),
        _cell("approxifer", 0.93, K=8, S=1, E=0),
        _cell("approxifer", 0.95, K=8, S=3, E=0),
        _cell("byzantine", 0.925, K=12, S=0, E=3, sigma=100.0),
        _cell("parm", 0.85, K=2, encoder="addition", dataset="fashion-mnist", a_a=0.89),
    )
    rows = {(r["K"], r["model"]): r for r in rep.comparison_rows(payload)}
    assert rows[(12, "mlp")]["gain"] == pytest.approx(60.0)
    assert rows[(8, "mlp")]["parm"] is None
    verdicts = {(c["claim"], c["scope"]): c["verdict"] for c in rep.claims(payload)}
    assert verdicts[("parm-fmnist-k2", "Fashion-MNIST mlp, addition")] == "met"  # 4 points
    assert verdicts[("parm-fmnist-k2", "Fashion-MNIST lenet5, addition")] == "not run"
    assert verdicts[("approxifer-vs-parm-k12", "K = 12, S = 1 vs ParM k = 12 addition")] == "beat"
    assert verdicts[("approxifer-stragglers-k8", "MNIST mlp")] == "beat"  # worst 5 points
    assert verdicts[("approxifer-byzantine-k12", "MNIST mlp")] == "met"  # 5.5 points vs 6
    text = rep.markdown(payload)
    for heading in ("## Claims", "## ParM", "## ApproxIFER with stragglers",
                    "## ApproxIFER with Byzantine workers"):
        assert heading in text
    assert "60.0%" in text


def test_markdown_marks_lossy_cifar_and_missing_systematic_values() -> None:
    cell = _cell("systematic", float("nan"), dataset="cifar10", model="resnet20", K=8, S=1,
                 E=0, group=ev.mean_spread([0.7]), rebuilt=0)
    cell["stats"] = {"mean": math.nan, "std": math.nan, "min": math.nan, "max": math.nan,
                     "n": 1}
    payload = _payload(cell)
    payload["bases"]["cifar10|resnet20"]["lossy"] = True
    text = rep.markdown(payload)
    assert "lossy copy" in text
    assert "## Systematic Berrut" in text


def test_systematic_decoders_are_kept_side_by_side() -> None:
    old = _cell("systematic", 0.19, K=8, S=1, E=0, group=ev.mean_spread([0.9]), rebuilt=9)
    sub = _cell("systematic", 0.24, K=8, S=1, E=0, group=ev.mean_spread([0.9]), rebuilt=9,
                decoder="subtract")
    assert old["id"] == "systematic|mnist|mlp|K8|S1|E0"  # cells from before keep their id
    assert sub["id"] != old["id"]
    merged = rep.merge_cells([old], [sub])
    assert [c.get("decoder", "interpolate") for c in merged] == ["interpolate", "subtract"]
    text = rep.markdown(_payload(old, sub))
    assert "| interpolate |" in text and "| subtract |" in text


def test_plots_write_pngs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    payload = _payload(_cell("parm", 0.9, K=2, encoder="addition"),
                       _cell("approxifer", 0.8, K=8, S=1, E=0),
                       _cell("approxifer", 0.85, K=8, S=2, E=0))
    for plot in (rep.plot_overall, rep.plot_approxifer):
        path = plot(payload, tmp_path / f"{plot.__name__}.png")
        assert path is not None and path.read_bytes().startswith(PNG_MAGIC)
    assert rep.plot_overall({"bases": {}, "cells": []}, tmp_path / "none.png") is None


def test_not_run_lists_missing_cells_of_the_grid() -> None:
    grid = rep.expected_cells()
    assert len({rep.cell_id(c) for c in grid}) == len(grid)
    payload = _payload(_cell("byzantine", 0.9, K=12, S=0, E=1, sigma=1.0))
    lines = rep.not_run(payload)
    byz = next(line for line in lines if line.startswith("MNIST mlp byzantine"))
    assert "E=1 sigma=1," not in byz + "," and "E=3 sigma=100" in byz
    assert any(line.startswith("CIFAR-10 (lossy) resnet20 parm: k=2 addition") for line in lines)
    full = {"bases": {}, "cells": [{**c, "stats": ev.mean_spread([0.5]), "a_available": 0.9}
                                   for c in grid]}
    assert rep.not_run(full) == []
    assert "Every cell of the grid has a result" in rep.markdown(full)


def test_cells_with_extra_workers_sit_beside_the_minimum_ones() -> None:
    base = _cell("approxifer", 0.80, K=8, S=3, E=0, workers=11)
    wide = _cell("approxifer", 0.95, K=8, S=3, E=0, workers=19, extra_workers=8)
    old = {**base}
    old.pop("extra_workers", None)  # cells written before the option existed
    assert rep.cell_id(base) == rep.cell_id(old) == "approxifer|mnist|mlp|K8|S3|E0"
    assert rep.cell_id(wide) == "approxifer|mnist|mlp|K8|S3|E0|+8w"
    payload = _payload(base, wide, _cell("parm", 0.5, K=8, encoder="addition"),
                       _cell("approxifer", 0.7, K=8, S=1, E=0, workers=9))
    assert len(payload["cells"]) == 4  # merged side by side, not replaced
    claims = {(c["claim"], c["scope"]): c for c in rep.claims(payload)}
    assert claims[("approxifer-stragglers-k8", "MNIST mlp")]["verdict"] == "missed"  # 28 pts
    wide_claim = claims[("approxifer-stragglers-k8", "MNIST mlp, 8 workers over the minimum")]
    assert wide_claim["verdict"] == "beat"  # 3 points
    # The ParM comparison stays at the minimum: K + 1 instances against ParM's k + 1.
    (row,) = [r for r in rep.comparison_rows(payload, ks=(8,))]
    assert row["apx"] == pytest.approx(70.0)
    rows = rep.approxifer_rows(payload)
    assert sorted(r["workers"] for r in rows) == [9, 11, 19]


def test_negative_extra_workers_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import argparse

    from benchmarks import accuracy

    parser = argparse.ArgumentParser()
    accuracy.add_arguments(parser)
    args = parser.parse_args(["--extra-workers", "-1", "--results-dir", str(tmp_path)])
    with pytest.raises(SystemExit, match="--extra-workers must be >= 0"):
        accuracy.run(args)
