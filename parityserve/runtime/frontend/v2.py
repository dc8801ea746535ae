"""Codec for the KServe V2 / Open Inference Protocol REST body, with Triton's binary extension.

A body is a JSON header, optionally followed by raw tensor buffers in tensor order; the
``Inference-Header-Content-Length`` HTTP header says where the JSON ends. Numeric binary
tensors are little-endian; binary BYTES elements each carry a 4-byte little-endian length.

Decoding never copies binary tensor data: arrays are read-only views of the request body.
A shape is the client's word, not the data: element counts come from the shape in O(rank) and
are checked against the data actually received before anything is sized by them.
Requests and responses share one tensor format, so the server and ``parityserve.client`` use
the same functions in opposite directions.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import orjson

from parityserve.config import Limits
from parityserve.core.inputs import (
    Leaves,
    check_leaves,
    check_raw_size,
    decoded_one_by_one,
    depth_error,
    element_count,
    scan,
    take_elements,
)
from parityserve.datatypes import DATATYPES, datatype_to_dtype, dtype_to_datatype  # re-exported
from parityserve.errors import InvalidInput, MalformedRequest, PayloadTooLarge
from parityserve.runtime.serving.face import check_against_spec  # re-exported
from parityserve.runtime.workers.wire import MAX_DIMS

__all__ = [
    "DATATYPES",
    "HEADER_LENGTH",
    "InferRequest",
    "RequestedOutput",
    "Tensor",
    "check_against_spec",
    "datatype_to_dtype",
    "decode_infer_request",
    "decode_infer_response",
    "dtype_to_datatype",
    "encode_infer_request",
    "encode_infer_response",
]

HEADER_LENGTH = "Inference-Header-Content-Length"

# Which inferred kinds may become each target kind, once check_leaves has passed the JSON
# leaves: an int past 64 bits makes an object array, refused here.
_JSON_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}
_U32 = struct.Struct("<I")
_DUMP = orjson.OPT_SERIALIZE_NUMPY


class Tensor(NamedTuple):
    name: str
    datatype: str
    shape: tuple[int, ...]
    array: np.ndarray


class RequestedOutput(NamedTuple):
    name: str
    binary: bool | None  # None: not said; falls back to the request's binary_data_output


@dataclass(frozen=True, slots=True)
class InferRequest:
    id: str | None
    inputs: tuple[Tensor, ...]
    outputs: tuple[RequestedOutput, ...]
    binary_data_output: bool = False
    parameters: dict[str, Any] | None = None  # the request's own (a graph's streams, labels)

    def wants_binary(self, output: str) -> bool:
        """Whether ``output`` goes back as binary data (per-output flag wins)."""
        for requested in self.outputs:
            if requested.name == output and requested.binary is not None:
                return requested.binary
        return self.binary_data_output


# ---------------------------------------------------------------- decoding


class _Buffers:
    """Cursor over the binary section that follows the JSON header."""

    __slots__ = ("view", "pos")

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.pos = 0

    def take(self, size: int, name: str) -> memoryview:
        end = self.pos + size
        if end > len(self.view):
            raise InvalidInput(f"tensor {name!r}: binary_data_size {size} runs past the end of "
                               f"the body ({len(self.view) - self.pos} bytes left)")
        chunk, self.pos = self.view[self.pos:end], end
        return chunk

    def finish(self) -> None:
        if self.pos != len(self.view):
            raise MalformedRequest(f"{len(self.view) - self.pos} bytes after the last binary "
                                   "tensor are not claimed by any binary_data_size")


def decode_infer_request(body: bytes, header_length: int | None,
                         limits: Limits | None = None) -> InferRequest:
    """Parse and validate a V2 inference request body (within ``limits``, when given)."""
    header, buffers = _split(body, header_length, limits)
    inputs = _tensors(header, "inputs", buffers, required=True, limits=limits)
    return InferRequest(
        id=_request_id(header),
        inputs=inputs,
        outputs=_requested_outputs(header.get("outputs")),
        binary_data_output=_flag(_parameters(header, "request"), "binary_data_output"),
        parameters=_parameters(header, "request"),
    )


def decode_infer_response(body: bytes, header_length: int | None) -> dict[str, np.ndarray]:
    """Parse a V2 inference response body into ``{output name: array}``."""
    header, buffers = _split(body, header_length)
    return {t.name: t.array for t in _tensors(header, "outputs", buffers, required=False)}


def _split(body: bytes, header_length: int | None, limits: Limits | None = None
           ) -> tuple[dict[str, Any], _Buffers | None]:
    view = memoryview(body)
    end = len(view) if header_length is None else header_length
    if not 0 <= end <= len(view):
        raise MalformedRequest(f"{HEADER_LENGTH} is {header_length}, but the body has "
                               f"{len(view)} bytes")
    if limits is not None and end > limits.max_json_bytes:  # orjson makes an object a value
        raise PayloadTooLarge(f"the JSON of this request is {end} bytes, more than "
                              f"max_json_bytes = {limits.max_json_bytes}; send tensors as "
                              f"binary data ({HEADER_LENGTH}) or raise "
                              "server.limits.max_json_bytes")
    try:
        header = orjson.loads(view[:end])
    except orjson.JSONDecodeError as exc:
        if limits is not None and str(exc).startswith("depth limit exceeded"):
            raise depth_error(limits.max_json_depth) from exc  # orjson's own cap, 1024
        raise MalformedRequest(f"invalid JSON in inference header: {exc}") from exc
    if not isinstance(header, dict):
        raise MalformedRequest("the inference header must be a JSON object")
    buffers = None if header_length is None else _Buffers(view[end:])
    return header, buffers


def _tensors(header: dict[str, Any], key: str, buffers: _Buffers | None,
             *, required: bool, limits: Limits | None = None) -> tuple[Tensor, ...]:
    items = header.get(key)
    if items is None and not required:
        items = []
    if not isinstance(items, list) or (required and not items):
        raise MalformedRequest(f"{key!r} must be a non-empty list of tensors")
    tensors, taken = [], 0
    for i, item in enumerate(items):
        tensor, taken = _tensor(item, key[:-1], i, buffers, limits, taken)
        tensors.append(tensor)
    if buffers is not None:
        buffers.finish()
    return tuple(tensors)


def _tensor(obj: Any, kind: str, index: int, buffers: _Buffers | None,
            limits: Limits | None = None, taken: int = 0) -> tuple[Tensor, int]:
    """The tensor ``obj`` describes, and the request's values decoded one by one with it
    (``taken`` before it): counted from its shape, before its data is read."""
    if not isinstance(obj, dict):
        raise MalformedRequest(f"{kind} #{index} must be a JSON object")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise MalformedRequest(f"{kind} #{index}: 'name' must be a non-empty string")
    datatype = obj.get("datatype")
    # A datatype that is not a string (a list, say) is unknown too, not a crash.
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise InvalidInput(f"{kind} {name!r}: unknown datatype {datatype!r}; expected one of "
                           f"{', '.join(DATATYPES)}")
    shape = _shape(obj.get("shape"), name)
    count = tensor_count(name, shape, limits)
    size = _parameters(obj, f"{kind} {name!r}").get("binary_data_size")
    if limits is not None and decoded_one_by_one(datatype, raw=size is not None):
        taken = take_elements(taken, count, limit=limits.max_request_elements,
                              what=f"tensor {name!r}")
    if size is not None:
        if "data" in obj:
            raise MalformedRequest(f"{kind} {name!r} has both 'data' and binary_data_size")
        array = _from_binary(name, datatype, shape, size, buffers)
        return Tensor(name, datatype, shape, array), taken
    if "data" not in obj:
        raise MalformedRequest(f"{kind} {name!r} has neither 'data' nor binary_data_size")
    leaves = _scan_data(obj["data"], shape, limits)
    if limits is not None and leaves is not None:  # its lists are values too
        taken = take_elements(taken, leaves.containers, limit=limits.max_request_elements,
                              what=f"tensor {name!r}")
    array = _from_json(name, datatype, shape, count, obj["data"], leaves)
    return Tensor(name, datatype, shape, array), taken


def config_max_batch(limits: Limits) -> int:
    """The ``max_batch_size`` a Triton model config advertises, over HTTP and gRPC alike: the
    rows one request may carry (``tensor_count`` refuses more); the batcher splits a request
    into the model's own batches, so the model's AIMD ceiling does not bound it."""
    return limits.max_batch_items


def tensor_count(name: str, shape: Sequence[int], limits: Limits | None) -> int:
    """The elements ``shape`` claims, within ``limits`` (rows per request, values per row)
    when given; the one check of a shape for HTTP and gRPC alike, before any data is read."""
    if limits is None:
        return element_count(name, shape, max_dims=MAX_DIMS)
    return element_count(name, shape, max_dims=MAX_DIMS, max_rows=limits.max_batch_items,
                         max_per_row=limits.max_input_elements)


def _scan_data(data: Any, shape: tuple[int, ...], limits: Limits | None) -> Leaves | None:
    """One pass over JSON ``data`` (its depth and leaf count within ``limits``), whose leaves
    the count and type checks read before numpy sees the data."""
    if not isinstance(data, list):
        return None
    if limits is None:
        return scan(data, max_depth=sys.maxsize, max_elements=sys.maxsize)
    rows = shape[0] if shape else 1
    return scan(data, max_depth=limits.max_json_depth,  # body, inputs, tensor, data: 4
                max_elements=max(1, rows) * limits.max_input_elements, depth=4)


def _shape(shape: Any, name: str) -> tuple[int, ...]:
    if not isinstance(shape, list) or not all(
            type(d) is int and d >= 0 for d in shape):  # type() excludes bools
        raise MalformedRequest(f"tensor {name!r}: 'shape' must be a list of non-negative "
                               f"integers, got {shape!r}")
    return tuple(shape)


def _parameters(obj: dict[str, Any], where: str) -> dict[str, Any]:
    params = obj.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise MalformedRequest(f"{where}: 'parameters' must be a JSON object")
    if "shared_memory_region" in params:
        raise InvalidInput(f"{where}: shared-memory tensors are not supported")
    return params


def _flag(params: dict[str, Any], key: str) -> bool:
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise MalformedRequest(f"parameter {key!r} must be true or false, got {value!r}")
    return value


def _request_id(header: dict[str, Any]) -> str | None:
    rid = header.get("id")
    if rid is not None and not isinstance(rid, str):
        raise MalformedRequest(f"request 'id' must be a string, got {rid!r}")
    return rid


def _requested_outputs(items: Any) -> tuple[RequestedOutput, ...]:
    if items is None:
        return ()
    if not isinstance(items, list):
        raise MalformedRequest("'outputs' must be a list")
    return tuple(_requested_output(item, i) for i, item in enumerate(items))


def _requested_output(obj: Any, index: int) -> RequestedOutput:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise MalformedRequest(f"requested output #{index} must be an object with a 'name'")
    params = _parameters(obj, f"output {obj['name']!r}")
    binary = _flag(params, "binary_data") if "binary_data" in params else None
    return RequestedOutput(obj["name"], binary)


def _from_binary(name: str, datatype: str, shape: tuple[int, ...], size: Any,
                 buffers: _Buffers | None) -> np.ndarray:
    if buffers is None:
        raise MalformedRequest(f"tensor {name!r} has binary_data_size but the request has no "
                               f"{HEADER_LENGTH} header")
    if type(size) is not int or size < 0:
        raise MalformedRequest(f"tensor {name!r}: binary_data_size must be a non-negative "
                               f"integer, got {size!r}")
    return array_from_raw(name, datatype, shape, buffers.take(size, name))


def array_from_raw(name: str, datatype: str, shape: tuple[int, ...],
                   raw: bytes | memoryview) -> np.ndarray:
    """A tensor from its raw little-endian bytes: the binary extension's buffer, or gRPC's
    ``raw_input_contents``. BYTES elements are each a 4-byte length and the bytes.

    The shape is checked against the bytes before anything is sized by it."""
    dtype = datatype_to_dtype(datatype)
    chunk = memoryview(raw)
    count = element_count(name, shape, max_dims=MAX_DIMS)
    is_bytes = datatype == "BYTES"
    check_raw_size(name, datatype, shape, count, None if is_bytes else dtype.itemsize,
                   len(chunk))
    if is_bytes:
        return _unpack_bytes(chunk, count, name).reshape(shape)
    return np.frombuffer(chunk, dtype=dtype).reshape(shape)


def array_to_raw(array: np.ndarray, datatype: str) -> bytes:
    """The raw bytes of ``array`` as ``datatype`` (the inverse of ``array_from_raw``)."""
    return bytes(_to_buffer(array, datatype))


def _unpack_bytes(chunk: memoryview, count: int, name: str) -> np.ndarray:
    """``count`` length-prefixed elements. The walk is sequential (each offset follows the
    previous length), so it is kept to one ``unpack_from`` and one slice of a ``bytes`` per
    element, and the array is filled in one call: about a third of the time of slicing the
    memoryview and storing each element into the array (measured in-process)."""
    buf = chunk.tobytes()
    items: list[bytes] = [b""] * count
    pos, end, unpack = 0, len(buf), _U32.unpack_from
    for i in range(count):
        if pos + 4 > end:
            raise InvalidInput(f"tensor {name!r}: binary BYTES data ends after {i} of "
                               f"{count} elements")
        (length,) = unpack(buf, pos)
        start = pos + 4
        pos = start + length
        if pos > end:
            raise InvalidInput(f"tensor {name!r}: BYTES element {i} claims {length} bytes, "
                               f"only {end - start} left")
        items[i] = buf[start:pos]
    if pos != end:
        raise InvalidInput(f"tensor {name!r}: {end - pos} bytes left after {count} BYTES "
                           "elements")
    return _objects(items)


def _objects(items: list[Any]) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def _from_json(name: str, datatype: str, shape: tuple[int, ...], count: int, data: Any,
               leaves: Leaves | None) -> np.ndarray:
    # The leaves are counted and typed before numpy sees them: np.array sizes a string
    # array by its longest string. A scalar ``data`` is one leaf.
    leaves = leaves or Leaves(frozenset((type(data),)), 1)
    _check_count(name, shape, count, leaves.count)
    if datatype == "BYTES":
        return _json_bytes(name, shape, data, leaves)
    dtype = datatype_to_dtype(datatype)
    check_leaves(leaves, dtype, datatype, f"tensor {name!r}")
    try:
        arr = np.array(data)  # dtype inferred first: UINT8's range is checked, not wrapped
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidInput(f"tensor {name!r}: 'data' is not a rectangular array of numbers "
                           f"({exc})") from exc
    if dtype.kind in "iu" and arr.dtype.kind in "fO" and leaves.types <= {int}:
        arr = _exact_ints(name, datatype, data, dtype)
    if arr.size and arr.dtype.kind not in _JSON_KINDS[dtype.kind]:
        raise InvalidInput(f"tensor {name!r}: 'data' must hold {datatype} values, got "
                           f"{_describe_kind(arr.dtype)}")
    _check_range(name, datatype, arr, dtype)
    with np.errstate(over="ignore"):  # 1e39 as FP32 is infinity: the server refuses it
        return arr.astype(dtype, copy=False).reshape(shape)


def _exact_ints(name: str, datatype: str, data: Any, dtype: np.dtype[Any]) -> np.ndarray:
    """Integers numpy could not fit one type to (2**64 - 1 beside a 1: float64, rounded;
    2**64: objects), read as ``dtype`` itself, which refuses any that do not fit: their type
    was never floats."""
    try:
        return np.array(data, dtype=dtype)
    except OverflowError as exc:
        raise InvalidInput(f"tensor {name!r}: values do not fit {datatype} ({exc})") from exc


def _check_count(name: str, shape: tuple[int, ...], want: int, count: int) -> None:
    if count != want:
        raise InvalidInput(f"tensor {name!r}: 'data' has {count} elements, but shape "
                           f"{list(shape)} needs {want}")


def _describe_kind(dtype: np.dtype[Any]) -> str:
    return {"b": "booleans", "i": "integers", "u": "integers", "f": "floats",
            "U": "strings"}.get(dtype.kind, "mixed or null values")


def _check_range(name: str, datatype: str, arr: np.ndarray, dtype: np.dtype[Any]) -> None:
    # astype() wraps integers silently; a 300 sent as UINT8 is an error, not a 44.
    if dtype.kind not in "iu" or not arr.size:
        return
    info = np.iinfo(dtype)
    low, high = arr.min(), arr.max()
    if low < info.min or high > info.max:
        raise InvalidInput(f"tensor {name!r}: values [{low}, {high}] do not fit {datatype}")


def _json_bytes(name: str, shape: tuple[int, ...], data: Any, leaves: Leaves) -> np.ndarray:
    try:
        arr = np.array(data, dtype=object)  # ragged lists become list elements, rejected below
    except (ValueError, TypeError) as exc:
        raise InvalidInput(f"tensor {name!r}: 'data' is not a rectangular array ({exc})") from exc
    flat = arr.reshape(-1)
    strings = leaves.types <= _STR and not (leaves.ragged or leaves.objects)
    if strings and flat.size == leaves.count:  # each element a str: encoded at C speed
        return _objects(list(map(str.encode, flat.tolist()))).reshape(shape)
    for i, value in enumerate(flat):
        if not isinstance(value, str):
            raise InvalidInput(f"tensor {name!r}: BYTES element {i} must be a string, "
                               f"got {type(value).__name__}")
        flat[i] = value.encode()
    return flat.reshape(shape)


_STR = frozenset((str,))


# ---------------------------------------------------------------- encoding


def encode_infer_response(model_name: str, model_version: str | None, request_id: str | None,
                          outputs: Sequence[tuple[str, np.ndarray]],
                          binary: Mapping[str, bool],
                          parameters: Mapping[str, Any] | None = None,
                          ) -> tuple[bytes, dict[str, str]]:
    """A V2 response body and its headers; binary outputs follow the JSON header."""
    header: dict[str, Any] = {"model_name": model_name}
    if model_version is not None:
        header["model_version"] = model_version
    if request_id:
        header["id"] = request_id
    if parameters:
        header["parameters"] = dict(parameters)
    buffers: list[Any] = []
    header["outputs"] = [_encode_tensor(n, a, binary.get(n, False), buffers)
                         for n, a in outputs]
    return _frame(header, buffers)


def encode_infer_request(inputs: Sequence[tuple[str, np.ndarray]], *, binary: bool,
                         binary_output: bool | None = None,
                         request_id: str | None = None) -> tuple[bytes, dict[str, str]]:
    """A V2 request body and its headers, in JSON or binary mode."""
    header: dict[str, Any] = {}
    if request_id:
        header["id"] = request_id
    buffers: list[Any] = []
    header["inputs"] = [_encode_tensor(n, a, binary, buffers) for n, a in inputs]
    if binary_output is not None:
        header["parameters"] = {"binary_data_output": binary_output}
    return _frame(header, buffers)


def _frame(header: dict[str, Any], buffers: list[Any]) -> tuple[bytes, dict[str, str]]:
    head = orjson.dumps(header, option=_DUMP)
    if not buffers:
        return head, {"content-type": "application/json"}
    headers = {"content-type": "application/octet-stream", HEADER_LENGTH: str(len(head))}
    return b"".join([head, *buffers]), headers


def _encode_tensor(name: str, array: np.ndarray, binary: bool,
                   buffers: list[Any]) -> dict[str, Any]:
    array = np.asarray(array)
    datatype = dtype_to_datatype(array.dtype)
    tensor: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
    if binary:
        raw = _to_buffer(array, datatype)
        tensor["parameters"] = {"binary_data_size": _nbytes(raw)}
        buffers.append(raw)
    else:
        tensor["data"] = _to_json(array, datatype)
    return tensor


def _to_buffer(array: np.ndarray, datatype: str) -> Any:
    if datatype == "BYTES":
        return b"".join(_U32.pack(len(b)) + b for b in map(_as_bytes, array.flat))
    # A buffer view, not tobytes(): the frame's single join is the only copy.
    return np.ascontiguousarray(array, dtype=datatype_to_dtype(datatype)).reshape(-1).data


def _nbytes(raw: Any) -> int:
    return raw.nbytes if isinstance(raw, memoryview) else len(raw)


def _to_json(array: np.ndarray, datatype: str) -> Any:
    if datatype == "BYTES":
        # JSON has no raw bytes; 'replace' keeps a non-UTF-8 output answerable.
        return [b.decode(errors="replace") for b in map(_as_bytes, array.flat)]
    # Native order and contiguous, so orjson serializes the array without a Python list.
    native = datatype_to_dtype(datatype).newbyteorder("=")
    return np.ascontiguousarray(array, dtype=native).reshape(-1)


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise InvalidInput(f"BYTES element must be bytes or str, got {type(value).__name__}")
