"""Expected accuracy of rebuilt answers and the application's floor (core/reconstruction.py),
where the numbers come from (runtime/serving/expected.py), and their settings (config.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from parityserve.config import Application, Deployment
from parityserve.core.reconstruction import (
    ExpectedAccuracy,
    Rebuilt,
    below_floor,
    parm_method,
)
from parityserve.runtime.serving.expected import expected_accuracy, sidecar_path


# ---- the floor -------------------------------------------------------------------------------
def test_no_floor_serves_every_reconstruction() -> None:
    assert below_floor(None, [Rebuilt("m", "berrut", None), Rebuilt("m", "berrut", 0.1)]) is None


@pytest.mark.parametrize(("expected", "served"), [(0.95, True), (0.9, True), (0.89, False)])
def test_a_reconstruction_at_or_above_the_floor_is_served(expected: float,
                                                          served: bool) -> None:
    reason = below_floor(0.9, [Rebuilt("mlp", "parm-subtraction", expected)])
    assert (reason is None) is served
    if not served:
        assert reason is not None and reason.startswith("low expected accuracy:")
        assert "'mlp'" in reason and "parm-subtraction" in reason and "0.89" in reason


def test_an_unmeasured_reconstruction_fails_any_floor() -> None:
    reason = below_floor(0.0, [Rebuilt("mlp", "berrut", None)])
    assert reason is not None and "not measured" in reason


def test_every_rebuilt_part_must_clear_the_floor() -> None:
    parts = [Rebuilt("a", "parm-subtraction", 0.97), Rebuilt("b", "berrut", 0.5)]
    reason = below_floor(0.9, parts)
    assert reason is not None and "'b'" in reason


# ---- the table ---------------------------------------------------------------------------------
def test_the_table_answers_per_method() -> None:
    table = ExpectedAccuracy({"parm-subtraction": 0.9358}, "parity-curve-mnist-k2.md")
    assert table.of("parm-subtraction") == 0.9358 and table.of("berrut") is None


@pytest.mark.parametrize(("by_method", "source", "message"), [
    ({"parm-magic": 0.9}, "x", "unknown decoding method"),
    ({"berrut": 1.5}, "x", r"must be in \[0, 1\]"),
    ({"berrut": -0.1}, "x", r"must be in \[0, 1\]"),
    ({"berrut": 0.5}, "  ", "say where"),
])
def test_bad_tables_name_the_problem(by_method: dict, source: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ExpectedAccuracy(by_method, source)


@pytest.mark.parametrize(("r", "encoder", "method"), [
    (1, "addition", "parm-subtraction"), (2, "addition", "parm-linear"),
    (1, "concat", "parm-concat")])
def test_parm_methods_are_those_the_decoder_flags(r: int, encoder: str, method: str) -> None:
    assert parm_method(r, encoder) == method


# ---- settings --------------------------------------------------------------------------------
def _dep(**extra: object) -> Deployment:
    return Deployment.model_validate({"name": "m", "source": "zoo:echo", "replicas": 2,
                                      **extra})


@pytest.mark.parametrize(("table", "message"), [
    ({"expected_accuracy": {"parm-subtraction": 0.9}}, "source"),
    ({"expected_accuracy": {}, "source": "x"}, "at least 1"),
    ({"expected_accuracy": {"parm-magic": 0.9}, "source": "x"}, "unknown decoding method"),
    ({"expected_accuracy": {"berrut": 2}, "source": "x"}, r"\[0, 1\]"),
    ({"expected_accuracy": {"berrut": 0.5}, "source": "x", "extra": 1}, "extra"),
])
def test_bad_reconstruction_settings_name_the_problem(table: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        _dep(reconstruction=table)


@pytest.mark.parametrize("floor", [-0.1, 1.1])
def test_the_floor_is_a_fraction(floor: float) -> None:
    with pytest.raises(ValidationError, match="min_expected_accuracy"):
        Application.model_validate({"name": "a", "models": ["m"],
                                    "min_expected_accuracy": floor})


# ---- where the numbers come from -----------------------------------------------------------------
def test_the_deployments_table_wins_and_names_its_source(tmp_path: Path) -> None:
    _sidecar(tmp_path / "p.json", 0.5)
    dep = _dep(parity={"k": 2, "weights": str(tmp_path / "p.npz")},
               reconstruction={"expected_accuracy": {"parm-subtraction": 0.93},
                               "source": "benchmarks/results/parity-curve-mnist-k2.md"})
    table = expected_accuracy(dep, None)
    assert table is not None and table.of("parm-subtraction") == 0.93
    assert "parity-curve-mnist-k2.md" in table.source and "'m'" in table.source


def _sidecar(path: Path, accuracy: float) -> None:
    path.write_text(json.dumps({"accuracy_degraded": accuracy, "dataset": "mnist",
                                "epochs": 100}))


def test_parm_reads_the_train_parity_sidecar_beside_its_weights(tmp_path: Path) -> None:
    _sidecar(tmp_path / "parity.json", 0.9358)
    dep = _dep(parity={"k": 2, "weights": "parity.npz"})  # relative to the config's folder
    table = expected_accuracy(dep, tmp_path)
    assert table is not None and table.of("parm-subtraction") == 0.9358
    assert "parity.json" in table.source and "100 epochs" in table.source


def test_r_parity_models_share_one_sidecar(tmp_path: Path) -> None:
    assert sidecar_path(Path("/w/p-p0.npz"), 2, None) == Path("/w/p.json")
    assert sidecar_path(Path("/w/p-p0.npz"), 1, None) == Path("/w/p-p0.json")
    _sidecar(tmp_path / "p.json", 0.8)
    dep = _dep(parity={"k": 2, "r": 2, "weights": [str(tmp_path / "p-p0.npz"),
                                                   str(tmp_path / "p-p1.npz")]})
    table = expected_accuracy(dep, None)
    assert table is not None and table.of("parm-linear") == 0.8


def test_nothing_measured_is_none(tmp_path: Path) -> None:
    assert expected_accuracy(_dep(), None) is None  # no redundancy
    assert expected_accuracy(_dep(parity={"k": 2}), None) is None  # no parity weights
    assert expected_accuracy(_dep(parity={"k": 2, "weights": str(tmp_path / "x.npz")}),
                             None) is None  # no sidecar
    berrut = _dep(replicas=3, redundancy={"mode": "berrut"})
    assert expected_accuracy(berrut, None) is None


def test_a_broken_sidecar_is_ignored_with_a_warning(tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "p.json").write_text("{not json")
    (tmp_path / "q.json").write_text(json.dumps({"accuracy_degraded": 7, "dataset": "mnist",
                                                 "epochs": 1}))
    for name in ("p", "q"):
        dep = _dep(parity={"k": 2, "weights": str(tmp_path / f"{name}.npz")})
        assert expected_accuracy(dep, None) is None
    assert caplog.text.count("ignoring parity sidecar") == 2
