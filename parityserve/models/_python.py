"""Plain Python backend: any class with ``predict(batch)`` (``setup()`` optional)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from parityserve.config import TensorSpec
from parityserve.errors import ModelLoadError
from parityserve.models._imports import import_object, instantiate
from parityserve.models.base import LoadedModel

__all__ = ["load_python", "serve_object"]


def load_python(
    ref: str, options: Mapping[str, Any], *, source: str, base_dir: Path | None
) -> LoadedModel:
    factory = import_object(ref, base_dir=base_dir)
    return serve_object(instantiate(factory, options, source=source), source=source)


def serve_object(obj: Any, *, source: str, platform: str = "python") -> LoadedModel:
    """Run ``obj.setup()`` if it has one, then serve ``obj.predict``."""
    predict = getattr(obj, "predict", None)
    if not callable(predict):
        raise ModelLoadError(f"{source}: {type(obj).__name__} has no predict(batch) method")
    _setup(obj, source)
    return LoadedModel(
        predict,
        platform=platform,
        source=source,
        input_spec=_spec(obj, "input_spec", source),
        output_spec=_spec(obj, "output_spec", source),
    )


def _setup(obj: Any, source: str) -> None:
    setup = getattr(obj, "setup", None)
    if not callable(setup):
        return
    try:
        setup()
    except Exception as exc:  # user code
        raise ModelLoadError(f"{source}: setup() raised {type(exc).__name__}: {exc}") from exc


def _spec(obj: Any, attr: str, source: str) -> TensorSpec | None:
    value = getattr(obj, attr, None)
    if value is None or isinstance(value, TensorSpec):
        return value
    try:
        # A plain dict such as {"datatype": "FP32", "shape": [4]} is accepted too.
        return TensorSpec.model_validate(value)
    except ValidationError as exc:
        raise ModelLoadError(f"{source}: {attr} is not a valid TensorSpec: {exc}") from exc
