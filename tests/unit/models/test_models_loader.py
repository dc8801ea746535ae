"""load_model: every backend loads a real file made here, and every failure says what to fix."""

from __future__ import annotations

import warnings
from pathlib import Path

import joblib
import numpy as np
import pytest

from parityserve.config import TensorSpec
from parityserve.errors import ModelLoadError, PredictError
from parityserve.models import Model, load_model

torch = pytest.importorskip("torch")


class TinyNet(torch.nn.Module):
    """A torch: source under test: Linear(4, n_out)."""

    def __init__(self, n_out: int = 3) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, n_out)

    def forward(self, x):
        return self.fc(x)


class Doubler(Model):
    """A python: source under test."""

    input_spec = TensorSpec(datatype="FP32", shape=(2,))

    def __init__(self, factor: float = 2.0) -> None:
        self.factor = factor
        self.ready = False

    def setup(self) -> None:
        self.ready = True

    def predict(self, batch):
        assert self.ready, "setup() must run before predict()"
        return batch * self.factor


class ShortChanged:
    """Duck-typed model that drops a query."""

    def predict(self, batch):
        return list(batch)[1:]


class BrokenSetup(Model):
    def setup(self) -> None:
        raise OSError("weights.bin not found")

    def predict(self, batch):
        return batch


X4 = np.arange(12, dtype=np.float32).reshape(3, 4) / 10


# --- torch ---------------------------------------------------------------------------------


def _tiny_state(n_out: int = 3) -> dict[str, np.ndarray]:
    torch.manual_seed(1)
    return {k: v.numpy() for k, v in TinyNet(n_out).state_dict().items()}


def _expected(state: dict[str, np.ndarray]) -> np.ndarray:
    return X4 @ state["fc.weight"].T + state["fc.bias"]


def test_torch_class_with_npz_weights_relative_to_base_dir(tmp_path: Path) -> None:
    state = _tiny_state()
    np.savez(tmp_path / "w.npz", **state)
    model = load_model(f"torch:{__name__}:TinyNet", weights="w.npz", base_dir=tmp_path)
    out = model.predict(X4.astype(np.float64))
    assert model.platform == "pytorch" and out.dtype == np.float32
    np.testing.assert_allclose(out, _expected(state), rtol=1e-5)


def test_torch_class_with_pt_weights_and_options(tmp_path: Path) -> None:
    state = _tiny_state(n_out=2)
    torch.save({k: torch.from_numpy(v) for k, v in state.items()}, tmp_path / "w.pt")
    model = load_model(
        f"torch:{__name__}:TinyNet", weights=str(tmp_path / "w.pt"), options={"n_out": 2}
    )
    np.testing.assert_allclose(model.predict(X4), _expected(state), rtol=1e-5)


def test_torch_bad_state_dict_lists_the_problems(tmp_path: Path) -> None:
    state = _tiny_state(n_out=5)
    state["extra.weight"] = np.zeros(1, np.float32)
    del state["fc.bias"]
    np.savez(tmp_path / "bad.npz", **state)
    with pytest.raises(ModelLoadError) as info:
        load_model(f"torch:{__name__}:TinyNet", weights=str(tmp_path / "bad.npz"))
    msg = str(info.value)
    assert "missing keys fc.bias" in msg and "unexpected keys extra.weight" in msg
    assert "fc.weight: file (5, 4) vs model (3, 4)" in msg


def test_torch_source_that_is_not_a_module(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not a torch.nn.Module"):
        load_model(f"torch:{__name__}:Doubler")


def test_torchscript_file(tmp_path: Path) -> None:
    net = TinyNet().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch deprecates jit.trace
        torch.jit.trace(net, torch.zeros(2, 4)).save(str(tmp_path / "net.ts"))
    model = load_model("torchscript:net.ts", base_dir=tmp_path)
    state = {k: v.detach().numpy() for k, v in net.state_dict().items()}
    assert model.platform == "torchscript"
    np.testing.assert_allclose(model.predict(X4), _expected(state), rtol=1e-5)


def test_torchscript_garbage_file(tmp_path: Path) -> None:
    (tmp_path / "junk.ts").write_bytes(b"not a zip")
    with pytest.raises(ModelLoadError, match="as TorchScript"):
        load_model(f"torchscript:{tmp_path / 'junk.ts'}")


# --- sklearn -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sklearn_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)
    path = tmp_path_factory.mktemp("sk") / "clf.joblib"
    joblib.dump(LogisticRegression().fit(x, y), path)
    return path, x


def test_sklearn_predict(sklearn_file) -> None:
    path, x = sklearn_file
    model = load_model(f"sklearn:{path}")
    assert model.platform == "sklearn"
    assert model.input_spec == TensorSpec(name="input", datatype="FP32", shape=(4,))
    assert set(model.predict(x.astype(np.float64))) <= {0, 1, 2}


def test_sklearn_predict_proba(sklearn_file) -> None:
    path, x = sklearn_file
    options = {"method": "predict_proba"}
    model = load_model("sklearn:clf.joblib", base_dir=path.parent, options=options)
    out = model.predict(x[:5])
    assert out.shape == (5, 3) and out.dtype == np.float32
    assert model.output_spec.shape == (3,)
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-5)


def test_sklearn_bad_method(sklearn_file) -> None:
    with pytest.raises(ModelLoadError, match="use one of"):
        load_model(f"sklearn:{sklearn_file[0]}", options={"method": "transform"})


def test_sklearn_file_that_is_not_joblib(tmp_path: Path) -> None:
    (tmp_path / "x.joblib").write_text("hello")
    with pytest.raises(ModelLoadError, match="cannot load .* with joblib"):
        load_model(f"sklearn:{tmp_path / 'x.joblib'}")


# --- onnx ----------------------------------------------------------------------------------


def _write_onnx(path: Path, w: np.ndarray, b: np.ndarray) -> None:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["y"]),
        ],
        "affine",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        initializer=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def test_onnx_file(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 7
    b = np.array([1, -1, 0.5], dtype=np.float32)
    _write_onnx(tmp_path / "affine.onnx", w, b)
    model = load_model("onnx:affine.onnx", base_dir=tmp_path, threads=1)
    assert model.platform == "onnxruntime"
    assert model.input_spec == TensorSpec(name="x", datatype="FP32", shape=(4,))
    assert model.output_spec == TensorSpec(name="y", datatype="FP32", shape=(3,))
    np.testing.assert_allclose(model.predict(X4.astype(np.float64)), X4 @ w + b, rtol=1e-5)


def test_onnx_garbage_file(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    (tmp_path / "bad.onnx").write_bytes(b"\x00garbage")
    with pytest.raises(ModelLoadError, match="onnxruntime cannot load"):
        load_model(f"onnx:{tmp_path / 'bad.onnx'}")


# --- python --------------------------------------------------------------------------------


def test_python_class_gets_options_and_setup() -> None:
    model = load_model(f"python:{__name__}:Doubler", options={"factor": 3})
    assert model.platform == "python" and model.input_spec.shape == (2,)
    out = model.predict(np.ones((2, 2), dtype=np.float64))
    assert out.dtype == np.float32 and out.tolist() == [[3, 3], [3, 3]]


def test_python_module_next_to_the_config(tmp_path: Path) -> None:
    (tmp_path / "ps_user_model_xyz.py").write_text(
        "class Plus1:\n    def predict(self, batch):\n        return [x + 1 for x in batch]\n"
    )
    model = load_model("python:ps_user_model_xyz:Plus1", base_dir=tmp_path)
    assert model.predict([1, 2]) == [2, 3]


def test_python_file_source_relative_to_the_config(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "ps_helper_xyz.py").write_text("STEP = 5\n")
    (tmp_path / "models" / "plus.py").write_text(
        "from ps_helper_xyz import STEP\n\n"
        "class Plus:\n    def predict(self, batch):\n        return [x + STEP for x in batch]\n"
    )
    model = load_model("python:models/plus.py:Plus", base_dir=tmp_path)
    assert model.predict([1, 2]) == [6, 7]  # the file's folder is importable: the helper


def test_python_file_that_fails_to_run_or_is_absent(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("raise RuntimeError('no GPU here')\n")
    with pytest.raises(ModelLoadError, match=r"broken.py: RuntimeError: no GPU here"):
        load_model("python:broken.py:Model", base_dir=tmp_path)
    with pytest.raises(ModelLoadError, match=r"Python file .*absent.py does not exist"):
        load_model("python:absent.py:Model", base_dir=tmp_path)


def test_python_model_returning_too_few_outputs() -> None:
    model = load_model(f"python:{__name__}:ShortChanged")
    with pytest.raises(PredictError, match="2 outputs for 3 queries"):
        model.predict([1, 2, 3])


def test_python_setup_failure_is_a_load_error() -> None:
    with pytest.raises(ModelLoadError, match=r"setup\(\) raised OSError: weights.bin"):
        load_model(f"python:{__name__}:BrokenSetup")


def test_python_bad_options() -> None:
    with pytest.raises(ModelLoadError, match="cannot construct with options"):
        load_model(f"python:{__name__}:Doubler", options={"nope": 1})


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["tensorflow:model.pb", "resnet20", "zoo:", "python:"])
def test_unknown_or_malformed_scheme(source: str) -> None:
    with pytest.raises(ModelLoadError, match="SCHEME one of zoo, torch, torchscript"):
        load_model(source)


@pytest.mark.parametrize("scheme", ["sklearn", "onnx", "torchscript"])
def test_missing_file(scheme: str, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=f"{tmp_path / 'absent.bin'} does not exist"):
        load_model(f"{scheme}:absent.bin", base_dir=tmp_path)


def test_missing_weights_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="weights file .*nope.npz does not exist"):
        load_model(f"torch:{__name__}:TinyNet", weights="nope.npz", base_dir=tmp_path)


@pytest.mark.parametrize(
    ("ref", "match"),
    [
        ("no_such_module_ps:Thing", "cannot import module 'no_such_module_ps'"),
        (f"{__name__}:NoSuchClass", "has no attribute 'NoSuchClass'"),
        ("justamodule", "expected 'package.module:Name'"),
    ],
)
def test_import_failures(ref: str, match: str) -> None:
    with pytest.raises(ModelLoadError, match=match):
        load_model(f"python:{ref}")


def test_formats_with_embedded_weights_reject_a_weights_file(sklearn_file) -> None:
    with pytest.raises(ModelLoadError, match="takes no separate weights"):
        load_model(f"sklearn:{sklearn_file[0]}", weights="w.npz")
