"""The five models of ``python -m benchmarks.selection``, and the test stream they are asked about.

cifar10: the published CIFAR ResNet-20/32/44/56 (zoo models, weights from the data folder) plus a
weak scikit-learn model trained here on ``cifar10-train-20k.npz``. mnist: the ParM MLP plus four
weaker scikit-learn models trained here on subsets of the MNIST training set. The trained models
are saved with joblib under the cache folder (named by recipe and scikit-learn version) and
served as ``sklearn:FILE`` with ``method: predict_proba``, so every model answers with class
scores.

The feature functions below are module-level so that a pickled pipeline finds them by name in
the worker process.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DATASETS",
    "ModelSpec",
    "StreamData",
    "build_models",
    "distinct_variants",
    "load_stream_data",
    "pool_cifar",
    "pool_mnist",
    "variant_inputs",
]

DATASETS = ("cifar10", "mnist")
_RECIPE = "v1"  # bump when a training recipe changes, so stale cached files are not reused


@dataclass(frozen=True)
class ModelSpec:
    """One deployed model: its name, a human label and the deployment mapping."""

    name: str
    label: str
    deployment: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StreamData:
    """The held-out inputs (as served: float32) and their labels."""

    dataset: str
    x: np.ndarray
    y: np.ndarray


# ---- features (picklable, used inside the served pipelines) --------------------------------
def pool_cifar(x: np.ndarray, factor: int = 4) -> np.ndarray:
    """(N, 3, 32, 32) -> (N, 3 * (32 / factor)^2): average pooling, then flattened."""
    x = np.asarray(x, dtype=np.float32)
    n, side = len(x), 32 // factor
    out: np.ndarray = x.reshape(n, 3, side, factor, side, factor).mean(axis=(3, 5))
    return out.reshape(n, -1)


def pool_mnist(x: np.ndarray, factor: int = 7) -> np.ndarray:
    """(N, 784) -> (N, (28 / factor)^2): average pooling of the 28x28 image, flattened."""
    x = np.asarray(x, dtype=np.float32)
    n, side = len(x), 28 // factor
    out: np.ndarray = x.reshape(n, side, factor, side, factor).mean(axis=(2, 4))
    return out.reshape(n, -1)


# ---- the test stream -----------------------------------------------------------------------
def load_stream_data(dataset: str, data_dir: Path) -> StreamData:
    from parityserve.models.datasets import load_cifar10, load_mnist

    if dataset == "cifar10":
        x, y = load_cifar10("test", data_dir=data_dir)
    elif dataset == "mnist":
        x, y = load_mnist("test", data_dir=data_dir)
    else:
        raise ValueError(f"unknown dataset {dataset!r}; use one of {DATASETS}")
    return StreamData(dataset, x, y)


def distinct_variants(dataset: str) -> int:
    """How many label-preserving versions of each test input the stream may use.

    CIFAR-10 images may be mirrored left-right (the ResNets were trained with random flips);
    MNIST digits have no such symmetry, so a second pass over MNIST repeats inputs.
    """
    return 2 if dataset == "cifar10" else 1


def variant_inputs(data: StreamData, indices: np.ndarray, variant: int) -> np.ndarray:
    """The inputs at ``indices`` in version ``variant`` (0: as is; 1 on CIFAR: mirrored)."""
    x = data.x[indices]
    if variant % distinct_variants(data.dataset) == 1:
        x = x[..., ::-1]  # NCHW: the last axis is the width
    return np.ascontiguousarray(x)


# ---- the models ----------------------------------------------------------------------------
def build_models(dataset: str, data_dir: Path, cache_dir: Path) -> list[ModelSpec]:
    """The five models, strongest first by their published/expected accuracy."""
    if dataset == "cifar10":
        return _cifar_models(data_dir, cache_dir)
    if dataset == "mnist":
        return _mnist_models(data_dir, cache_dir)
    raise ValueError(f"unknown dataset {dataset!r}; use one of {DATASETS}")


_CIFAR_INPUT = {"name": "input", "datatype": "FP32", "shape": [3, 32, 32]}
_MNIST_INPUT = {"name": "input", "datatype": "FP32", "shape": [784]}


def _cifar_models(data_dir: Path, cache_dir: Path) -> list[ModelSpec]:
    resnets = [ModelSpec(f"resnet{d}", f"ResNet-{d} (published weights)",
                         {"source": f"zoo:resnet{d}"}) for d in (56, 44, 32, 20)]
    path = _cached(cache_dir, "cifar10-logreg-pool4", lambda: _train_cifar_logreg(data_dir))
    weak = ModelSpec("logreg", "logistic regression on 8x8-pooled pixels (trained here)",
                     _sklearn_deployment(path, _CIFAR_INPUT))
    return [*resnets, weak]


def _mnist_models(data_dir: Path, cache_dir: Path) -> list[ModelSpec]:
    mlp = ModelSpec("parm-mlp", "ParM base MLP (published weights)", {"source": "zoo:parm-mlp"})
    recipes = [
        ("mlp64", "MLP, 64 hidden units, 5k training images (trained here)", _mnist_mlp64),
        ("logreg", "logistic regression, 2k training images (trained here)", _mnist_logreg),
        ("logreg-4x4", "logistic regression on 4x4-pooled pixels (trained here)",
         _mnist_logreg_pooled),
        ("gauss-nb", "Gaussian naive Bayes, 10k training images (trained here)", _mnist_nb),
    ]
    out = [mlp]
    for name, label, train in recipes:
        path = _cached(cache_dir, f"mnist-{name}", partial(train, data_dir))
        out.append(ModelSpec(name, label, _sklearn_deployment(path, _MNIST_INPUT)))
    return out


def _sklearn_deployment(path: Path, input_spec: dict[str, Any]) -> dict[str, Any]:
    return {"source": f"sklearn:{path.resolve()}", "options": {"method": "predict_proba"},
            "input": input_spec}


def _cached(cache_dir: Path, stem: str, train: Callable[[], Any]) -> Path:
    """``cache_dir/selection/<stem>-<recipe>-sk<version>.joblib``, trained on first use."""
    import joblib
    import sklearn

    path = cache_dir / "selection" / f"{stem}-{_RECIPE}-sk{sklearn.__version__}.joblib"
    if not path.is_file():
        print(f"training {stem} (cached as {path}) ...", flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        joblib.dump(train(), tmp)
        tmp.replace(path)
    return path


def _train_cifar_logreg(data_dir: Path) -> Any:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import FunctionTransformer, StandardScaler

    from parityserve.models.datasets import load_cifar10

    x, y = load_cifar10("train", data_dir=data_dir)
    x = np.concatenate([x, x[..., ::-1]])  # mirrored copies, as the ResNets were trained
    y = np.concatenate([y, y])
    model = make_pipeline(FunctionTransformer(pool_cifar, kw_args={"factor": 4}),
                          StandardScaler(), LogisticRegression(max_iter=300, C=0.01))
    return model.fit(x, y)


def _mnist_train(data_dir: Path, n: int) -> tuple[np.ndarray, np.ndarray]:
    from parityserve.models.datasets import load_mnist

    x, y = load_mnist("train", data_dir=data_dir)
    idx = np.random.default_rng(0).permutation(len(x))[:n]
    return x[idx], y[idx]


def _mnist_mlp64(data_dir: Path) -> Any:
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    x, y = _mnist_train(data_dir, 5000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return MLPClassifier((64,), max_iter=60, random_state=0).fit(x, y)


def _mnist_logreg(data_dir: Path) -> Any:
    from sklearn.linear_model import LogisticRegression

    x, y = _mnist_train(data_dir, 2000)
    return LogisticRegression(max_iter=200, C=0.1).fit(x, y)


def _mnist_logreg_pooled(data_dir: Path) -> Any:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import FunctionTransformer

    x, y = _mnist_train(data_dir, 10000)
    model = make_pipeline(FunctionTransformer(pool_mnist, kw_args={"factor": 7}),
                          LogisticRegression(max_iter=300))
    return model.fit(x, y)


def _mnist_nb(data_dir: Path) -> Any:
    from sklearn.naive_bayes import GaussianNB

    x, y = _mnist_train(data_dir, 10000)
    return GaussianNB().fit(x, y)
