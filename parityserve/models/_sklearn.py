"""scikit-learn backend: a joblib-saved estimator served by ``predict`` or ``predict_proba``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import joblib
import numpy as np

from parityserve.config import TensorSpec
from parityserve.datatypes import dtype_to_datatype
from parityserve.errors import ModelLoadError
from parityserve.models.base import Batch, LoadedModel

__all__ = ["load_sklearn"]

_METHODS = ("predict", "predict_proba")


def load_sklearn(
    path: Path, options: Mapping[str, Any], *, source: str, threads: int
) -> LoadedModel:
    method = _method(options, source)
    estimator = _read(path)
    fn = getattr(estimator, method, None)
    if fn is None:
        raise ModelLoadError(f"{source}: {type(estimator).__name__} has no {method}() method")
    _limit_threads(threads)
    return LoadedModel(
        _proba_fn(fn) if method == "predict_proba" else fn,
        platform="sklearn",
        source=source,
        input_spec=_input_spec(estimator),
        output_spec=_output_spec(estimator, method),
    )


def _method(options: Mapping[str, Any], source: str) -> str:
    unknown = set(options) - {"method"}
    if unknown:
        raise ModelLoadError(f"{source}: unknown options {sorted(unknown)}; sklearn takes 'method'")
    method = options.get("method", "predict")
    if method not in _METHODS:
        raise ModelLoadError(f"{source}: option method={method!r}; use one of {list(_METHODS)}")
    return str(method)


def _read(path: Path) -> Any:
    try:
        return joblib.load(path)
    except Exception as exc:  # unpickling runs arbitrary code: anything can come out
        raise ModelLoadError(
            f"cannot load {path} with joblib: {type(exc).__name__}: {exc}; save the estimator "
            "with joblib.dump using the same scikit-learn version"
        ) from exc


def _limit_threads(threads: int) -> None:
    # BLAS/OpenMP pools are per process, and a worker process serves one model.
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=threads)


def _proba_fn(fn: Callable[[Batch], Any]) -> Callable[[Batch], np.ndarray]:
    # Probabilities are declared FP32 like every other model's scores.
    return lambda batch: np.asarray(fn(batch), dtype=np.float32)


def _input_spec(estimator: Any) -> TensorSpec | None:
    n = getattr(estimator, "n_features_in_", None)
    return None if n is None else TensorSpec(name="input", datatype="FP32", shape=(int(n),))


def _output_spec(estimator: Any, method: str) -> TensorSpec | None:
    classes = getattr(estimator, "classes_", None)
    if method == "predict_proba":
        return None if classes is None else TensorSpec(
            name="probabilities", datatype="FP32", shape=(len(classes),))
    if classes is None:  # a regressor
        return TensorSpec(name="prediction", datatype="FP64", shape=())
    kind = np.asarray(classes).dtype
    # String class labels are served as BYTES; numeric labels keep their dtype.
    datatype = dtype_to_datatype(kind)
    return TensorSpec(name="label", datatype=datatype, shape=())
