"""``load_model``: one entry point from a source string to a ``LoadedModel``.

Sources: ``zoo:NAME``, ``torch:pkg.mod:Class``, ``torchscript:FILE``, ``sklearn:FILE``,
``onnx:FILE`` and ``python:pkg.mod:Class``. Backends are imported only when used, so a
deployment of sklearn models never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parityserve.errors import ModelLoadError
from parityserve.models._imports import import_object, instantiate, resolve_file
from parityserve.models.base import LoadedModel

__all__ = ["SCHEMES", "load_model"]


@dataclass(frozen=True)
class _Spec:
    source: str
    target: str
    weights: str | None
    options: Mapping[str, Any]
    base_dir: Path | None
    threads: int
    data_dir: Path | None

    def file(self, what: str) -> Path:
        return resolve_file(self.target, self.base_dir, what=what)

    def weights_path(self) -> Path | None:
        if self.weights is None:
            return None
        return resolve_file(self.weights, self.base_dir, what="weights file")


def load_model(
    source: str,
    *,
    weights: str | None = None,
    options: Mapping[str, Any] | None = None,
    base_dir: Path | None = None,
    threads: int = 1,
    data_dir: Path | None = None,
) -> LoadedModel:
    """Load ``source`` (e.g. ``"zoo:resnet20"``, ``"sklearn:model.joblib"``) for serving.

    Relative paths resolve against ``base_dir`` (the config file's folder). Every failure
    is a ``ModelLoadError`` that says what to fix.
    """
    scheme, sep, target = source.partition(":")
    backend = _BACKENDS.get(scheme)
    if not sep or backend is None or not target:
        raise ModelLoadError(
            f"cannot load model source {source!r}: expected SCHEME:TARGET with SCHEME one of "
            f"{', '.join(SCHEMES)} (e.g. zoo:resnet20, sklearn:model.joblib)"
        )
    if threads < 1:
        raise ModelLoadError(f"threads must be >= 1, got {threads}")
    spec = _Spec(source, target, weights, dict(options or {}), base_dir, threads, data_dir)
    return backend(spec)


def _zoo(spec: _Spec) -> LoadedModel:
    from parityserve.models.zoo import load_zoo

    return load_zoo(
        spec.target,
        weights=spec.weights_path(),
        options=spec.options,
        data_dir=spec.data_dir,
        threads=spec.threads,
    )


def _torch(spec: _Spec) -> LoadedModel:
    weights = spec.weights_path()
    factory = import_object(spec.target, base_dir=spec.base_dir)
    backend = _import_torch_backend(spec.source)
    module = instantiate(factory, spec.options, source=spec.source)
    loaded: LoadedModel = backend.load_module(
        module, weights, source=spec.source, threads=spec.threads
    )
    return loaded


def _torchscript(spec: _Spec) -> LoadedModel:
    _no_options(spec)
    path = spec.file("TorchScript file")
    backend = _import_torch_backend(spec.source)
    loaded: LoadedModel = backend.load_torchscript(path, source=spec.source, threads=spec.threads)
    return loaded


def _sklearn(spec: _Spec) -> LoadedModel:
    from parityserve.models._sklearn import load_sklearn

    _no_weights(spec)
    return load_sklearn(
        spec.file("sklearn model file"), spec.options, source=spec.source, threads=spec.threads
    )


def _onnx(spec: _Spec) -> LoadedModel:
    from parityserve.models._onnx import load_onnx

    _no_options(spec)
    return load_onnx(spec.file("ONNX file"), source=spec.source, threads=spec.threads)


def _python(spec: _Spec) -> LoadedModel:
    from parityserve.models._python import load_python

    _no_weights(spec)
    return load_python(spec.target, spec.options, source=spec.source, base_dir=spec.base_dir)


def _import_torch_backend(source: str) -> Any:
    try:
        from parityserve.models import _torch
    except ImportError as exc:
        raise ModelLoadError(
            f"{source} needs PyTorch, which is not installed: pip install 'parityserve[torch]'"
        ) from exc
    return _torch


def _no_options(spec: _Spec) -> None:
    if spec.options:
        raise ModelLoadError(f"{spec.source} takes no options; got {sorted(spec.options)}")
    _no_weights(spec)


def _no_weights(spec: _Spec) -> None:
    # These formats carry their weights inside the file, so a separate file is a mistake.
    if spec.weights is not None:
        raise ModelLoadError(f"{spec.source} takes no separate weights; remove `weights`")


_BACKENDS: dict[str, Callable[[_Spec], LoadedModel]] = {
    "zoo": _zoo,
    "torch": _torch,
    "torchscript": _torchscript,
    "sklearn": _sklearn,
    "onnx": _onnx,
    "python": _python,
}

SCHEMES: tuple[str, ...] = tuple(_BACKENDS)
