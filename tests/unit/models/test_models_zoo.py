"""The zoo: published weights reach their published accuracy; built-ins behave."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from parityserve.config import TensorSpec
from parityserve.errors import ModelLoadError
from parityserve.models import ZOO_NAMES, load_model
from parityserve.models.datasets import load_cifar10, load_mnist
from parityserve.models.zoo import check_zoo


def test_zoo_names() -> None:
    assert ZOO_NAMES == (
        "parm-mlp",
        "lenet5",
        "resnet20",
        "resnet32",
        "resnet44",
        "resnet56",
        "digits-mlp",
        "noop",
        "sleep",
        "echo",
    )


def test_unknown_zoo_name_lists_the_valid_ones() -> None:
    match = "unknown zoo model 'resnet18'; choose one of: parm-mlp, lenet5"
    with pytest.raises(ModelLoadError, match=match):
        load_model("zoo:resnet18")


# --- built-ins (numpy only) ----------------------------------------------------------------


def test_noop_accepts_anything() -> None:
    model = load_model("zoo:noop")
    out = model.predict(["a", {"b": 1}, None])
    assert out.dtype == np.float32 and out.tolist() == [0, 0, 0]
    assert model.predict(np.ones((2, 3, 4))).shape == (2,)


def test_echo_returns_the_batch() -> None:
    batch = np.arange(6).reshape(3, 2)
    np.testing.assert_array_equal(load_model("zoo:echo").predict(batch), batch)


def test_sleep_sleeps() -> None:
    model = load_model("zoo:sleep", options={"sleep_ms": 20})
    start = time.perf_counter()
    assert model.predict([1, 2]).tolist() == [0, 0]
    assert time.perf_counter() - start >= 0.019


@pytest.mark.parametrize(
    ("options", "match"),
    [({"sleep_ms": -1}, "sleep_ms must be >= 0"), ({"delay": 1}, r"unknown options \['delay'\]")],
)
def test_bad_builtin_options(options: dict, match: str) -> None:
    with pytest.raises(ModelLoadError, match=match):
        load_model("zoo:sleep", options=options)


# --- torch networks ------------------------------------------------------------------------


def test_lenet5_forward_shapes() -> None:
    pytest.importorskip("torch")
    model = load_model("zoo:lenet5")
    assert model.input_spec == TensorSpec(name="input", datatype="FP32", shape=(1, 28, 28))
    assert model.predict(np.zeros((5, 1, 28, 28), np.float32)).shape == (5, 10)
    flat = np.random.default_rng(0).random((3, 784), dtype=np.float32)
    out = model.predict(flat)
    assert out.shape == (3, 10) and out.dtype == np.float32
    # Untrained weights are seeded, so every replica process computes the same function.
    np.testing.assert_array_equal(load_model("zoo:lenet5").predict(flat), out)


def test_published_weights_need_a_data_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    monkeypatch.delenv("PARITYSERVE_DATA", raising=False)
    with pytest.raises(ModelLoadError, match="pass `weights` or set PARITYSERVE_DATA"):
        load_model("zoo:resnet20")


def test_parm_mlp_bad_dataset_option() -> None:
    with pytest.raises(ModelLoadError, match="dataset='cifar'"):
        load_model("zoo:parm-mlp", options={"dataset": "cifar"})


@pytest.mark.parametrize(("kind", "floor"), [("mnist", 0.975), ("fashion-mnist", 0.89)])
def test_parm_mlp_published_accuracy(data_dir: Path, kind: str, floor: float) -> None:
    pytest.importorskip("torch")
    x, y = load_mnist("test", kind=kind, data_dir=data_dir)
    model = load_model("zoo:parm-mlp", options={"dataset": kind}, data_dir=data_dir)
    assert (model.predict(x).argmax(axis=1) == y).mean() >= floor


def test_resnet20_accuracy_on_lossy_cifar(data_dir: Path) -> None:
    pytest.importorskip("torch")
    x, y = load_cifar10("test", data_dir=data_dir)
    # The file is sorted by class: every 10th image gives 100 of each class.
    x, y = x[::10], y[::10]
    model = load_model("zoo:resnet20", data_dir=data_dir)
    assert model.output_spec.shape == (10,)
    assert (model.predict(x).argmax(axis=1) == y).mean() > 0.75


def test_resnet56_loads_with_explicit_weights(data_dir: Path) -> None:
    pytest.importorskip("torch")
    weights = data_dir / "weights" / "cifar10-resnet56.npz"
    model = load_model("zoo:resnet56", weights=str(weights))
    assert model.predict(np.zeros((2, 3, 32, 32), np.float32)).shape == (2, 10)


def test_resnet_weights_of_the_wrong_depth(data_dir: Path) -> None:
    pytest.importorskip("torch")
    weights = data_dir / "weights" / "cifar10-resnet20.npz"
    with pytest.raises(ModelLoadError, match="missing keys layer1.3"):
        load_model("zoo:resnet32", weights=str(weights))


# --- what a frontend checks before a deploy is made (check_zoo) ----------------------------


@pytest.mark.parametrize(("name", "options", "weights", "match"), [
    ("resnet18", {}, False, "unknown zoo model 'resnet18'; choose one of: parm-mlp"),
    ("sleep", {"sleep_ms": -1}, False, "sleep_ms must be >= 0"),
    ("sleep", {"sleep_ms": "slow"}, False, r"zoo:sleep: bad options \{'sleep_ms': 'slow'\}"),
    ("sleep", {"delay": 1}, False, r"unknown options \['delay'\]; it takes \['sleep_ms'\]"),
    ("noop", {}, True, "zoo:noop takes no weights"),
    ("echo", {"x": 1}, False, r"unknown options \['x'\]; it takes none"),
    ("parm-mlp", {"dataset": "cifar"}, False, "dataset='cifar'"),
    ("parm-mlp", {"depth": 3}, False, r"unknown options \['depth'\]; it takes \['dataset'\]"),
    ("resnet20", {"depth": 56}, False, r"zoo:resnet20: unknown options \['depth'\]"),
    ("lenet5", {"seed": 1}, False, r"unknown options \['seed'\]"),
])
def test_check_zoo_refuses_what_load_zoo_would(name: str, options: dict, weights: bool,
                                               match: str) -> None:
    with pytest.raises(ModelLoadError, match=match):
        check_zoo(name, options, weights=weights)


def test_check_zoo_passes_what_load_zoo_takes_and_imports_no_framework() -> None:
    takes = [("noop", {}, False), ("sleep", {"sleep_ms": 0}, False), ("echo", {}, False),
             ("parm-mlp", {"dataset": "fashion-mnist"}, True), ("resnet56", {}, True),
             ("lenet5", {}, False), ("digits-mlp", {}, True)]
    code = ("import sys; from parityserve.models.zoo import check_zoo\n"
            f"for name, options, weights in {takes!r}: check_zoo(name, options, weights=weights)\n"
            "print([m for m in ('torch', 'onnxruntime') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"
