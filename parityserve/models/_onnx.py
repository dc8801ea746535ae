"""ONNX Runtime backend: the first input and first output of an ``.onnx`` graph."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from parityserve.config import TensorSpec
from parityserve.errors import ModelLoadError
from parityserve.models.base import Batch, LoadedModel, numpy_dtype

__all__ = ["load_onnx"]

# onnxruntime's "tensor(...)" element types -> V2 datatype names.
_ORT_TYPES = {
    "float": "FP32",
    "double": "FP64",
    "float16": "FP16",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "bool": "BOOL",
    "string": "BYTES",
}


def load_onnx(path: Path, *, source: str, threads: int) -> LoadedModel:
    session = _session(path, threads)
    inp, out = session.get_inputs()[0], session.get_outputs()[0]
    input_spec = _spec(inp)
    dtype = numpy_dtype(input_spec.datatype)

    def run(batch: Batch) -> np.ndarray:
        result: np.ndarray = session.run([out.name], {inp.name: np.asarray(batch, dtype=dtype)})[0]
        return result

    return LoadedModel(
        run, platform="onnxruntime", source=source, input_spec=input_spec, output_spec=_spec(out)
    )


def _session(path: Path, threads: int) -> Any:
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise ModelLoadError(
            "onnx: sources need onnxruntime; pip install 'parityserve[onnx]'"
        ) from exc
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
        raise ModelLoadError(f"onnxruntime cannot load {path}: {exc}") from exc


def _spec(arg: Any) -> TensorSpec:
    elem = str(arg.type).removeprefix("tensor(").removesuffix(")")
    datatype = _ORT_TYPES.get(elem)
    if datatype is None:
        raise ModelLoadError(f"ONNX tensor {arg.name!r} has unsupported type {arg.type}")
    # The first axis is the batch; symbolic or unknown sizes become -1.
    dims = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in list(arg.shape)[1:])
    return TensorSpec(name=arg.name, datatype=datatype, shape=dims)
