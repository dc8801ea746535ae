"""The user-facing ``Model`` class and ``LoadedModel``, the one interface the worker calls.

Every backend (torch, sklearn, onnx, plain Python) ends up as a ``LoadedModel`` wrapping a
batch function, so the worker never needs to know which framework it is serving.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from parityserve.config import TensorSpec
from parityserve.datatypes import datatype_to_dtype
from parityserve.errors import ParityServeError, PredictError

__all__ = ["Batch", "LoadedModel", "Model", "numpy_dtype"]

Batch = np.ndarray | list[Any]


# KServe V2 datatype names -> numpy dtypes. BYTES stays object: there is nothing to cast to.
def numpy_dtype(datatype: str) -> np.dtype[Any]:
    """The numpy dtype for a V2 datatype name such as ``"FP32"``.

    One table serves models and the V2 codec alike: ``parityserve.datatypes``.
    """
    return datatype_to_dtype(datatype.upper())


class Model:
    """Base class for user models. Inheriting is optional: any object with ``predict`` works.

    ``setup`` runs once in the worker process (load weights there, not in ``__init__``, so a
    model is cheap to construct). ``predict`` gets a whole batch, first axis = queries, and
    must return one output per query.
    """

    input_spec: ClassVar[TensorSpec | None] = None
    output_spec: ClassVar[TensorSpec | None] = None

    def setup(self) -> None:
        """Load weights or other state. The default does nothing."""

    def predict(self, batch: Batch) -> Batch:
        raise NotImplementedError("subclasses of Model must implement predict(batch)")


class LoadedModel:
    """A model ready to serve: ``predict(batch)`` with input casting and output checks."""

    def __init__(
        self,
        fn: Callable[[Batch], Any],
        *,
        platform: str,
        source: str,
        input_spec: TensorSpec | None = None,
        output_spec: TensorSpec | None = None,
    ) -> None:
        self._fn = fn
        self.platform = platform
        self.source = source
        self.input_spec = input_spec
        self.output_spec = output_spec

    def __repr__(self) -> str:
        return f"LoadedModel(source={self.source!r}, platform={self.platform!r})"

    def with_specs(
        self, input_spec: TensorSpec | None = None, output_spec: TensorSpec | None = None
    ) -> LoadedModel:
        """A copy whose specs are overridden where given (e.g. by a Deployment's input/output)."""
        return LoadedModel(
            self._fn,
            platform=self.platform,
            source=self.source,
            input_spec=input_spec or self.input_spec,
            output_spec=output_spec or self.output_spec,
        )

    def predict(self, batch: Batch) -> Batch:
        """Run one batch; returns exactly one output per query (first axis = len(batch))."""
        batch = self._cast(batch)
        try:
            out = self._fn(batch)
        except ParityServeError:
            raise
        except Exception as exc:
            what = f"{type(exc).__name__}: {exc}"
            raise PredictError(f"{self.source}: predict raised {what}") from exc
        return self._check(out, len(batch))

    def _cast(self, batch: Batch) -> Batch:
        if not isinstance(batch, np.ndarray) or self.input_spec is None:
            return batch
        dtype = numpy_dtype(self.input_spec.datatype)
        if batch.dtype == dtype:
            return batch
        try:
            return batch.astype(dtype)
        except (TypeError, ValueError) as exc:
            raise PredictError(
                f"{self.source}: cannot cast input of dtype {batch.dtype} to "
                f"{self.input_spec.datatype}: {exc}"
            ) from exc

    def _check(self, out: Any, n: int) -> Batch:
        if isinstance(out, tuple):
            out = list(out)
        if (isinstance(out, np.ndarray) and out.ndim >= 1) or isinstance(out, list):
            if len(out) == n:
                return out
            raise PredictError(
                f"{self.source}: predict returned {len(out)} outputs for {n} queries; "
                "it must return exactly one output per query (first axis = batch)"
            )
        raise PredictError(
            f"{self.source}: predict returned {type(out).__name__}; it must return a numpy "
            f"array or a list with one output per query"
        )
