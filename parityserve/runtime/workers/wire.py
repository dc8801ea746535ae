"""The RPC wire format between the frontend (ROUTER) and model workers (DEALER).

A message is one msgpack header frame followed by zero or more raw buffer frames. Numpy arrays
travel as raw frames (sent with ``copy=False`` and read back with ``np.frombuffer``), so a batch
of images is never serialised element by element. Anything else (lists of strings, nested
Python values) is carried inline in the header as msgpack.

We hand-write this small framing because it is the protocol itself: ZeroMQ gives us frames and
msgpack gives us headers, and this module only says which frame holds what.
"""

from __future__ import annotations

import re
from typing import Any

import msgpack
import numpy as np

from parityserve.errors import ProtocolError

__all__ = [
    "HELLO",
    "HEARTBEAT",
    "RESULT",
    "PREDICT",
    "FAULT",
    "MAX_DIMS",
    "MAX_FRAMES",
    "MAX_HEADER_BYTES",
    "STOP",
    "THREADS",
    "BYE",
    "FAILED",
    "decode",
    "encode",
    "pack_payload",
    "unpack_payload",
]

# Message types (the "t" field of the header).
HELLO = "hello"
HEARTBEAT = "hb"
RESULT = "res"
BYE = "bye"
FAILED = "failed"  # the worker could not load its model; "error" says why
PREDICT = "pred"
FAULT = "fault"
STOP = "stop"
THREADS = "threads"  # set the worker's intra-op threads between batches; "n" says how many

Frames = list[Any]

# Bounds on what a peer can make the frontend allocate. A header carries metadata and at most
# inline (non-array) outputs of one batch; arrays travel as raw frames, one per payload.
MAX_HEADER_BYTES = 64 * 1024 * 1024
MAX_FRAMES = 8
_MAX_ITEMS = 1 << 20  # elements of one msgpack array or map
MAX_DIMS = 32  # rank of one array payload; numpy's own limit is 64
# dtype.str of the arrays a model may return: byte order, kind, item size ('<f4', '|b1', '<U3').
_DTYPE = re.compile(r"[<>|=][biufcSU][0-9]{1,6}")


def pack_payload(value: Any) -> tuple[dict[str, Any], list[Any]]:
    """Describe ``value`` for a header and return the raw frames that carry it."""
    if isinstance(value, np.ndarray) and value.dtype != object:
        array = np.ascontiguousarray(value)
        desc = {"k": "nd", "dtype": array.dtype.str, "shape": list(array.shape)}
        return desc, [array.data.cast("B") if array.size else b""]
    return {"k": "obj", "v": value}, []


def unpack_payload(desc: Any, frames: list[Any]) -> Any:
    """Inverse of ``pack_payload``; arrays are views over the received frame (no copy).

    Raises ProtocolError for anything a peer could get wrong: a descriptor that is not a map,
    a dtype that is not a plain number/bool/string type (object dtypes would unpickle), a shape
    that is not a list of sizes matching the buffer, or a frame count other than one."""
    kind = desc.get("k") if isinstance(desc, dict) else None
    if kind == "obj":
        if frames:
            raise ProtocolError(f"an inline payload came with {len(frames)} extra frames")
        return desc.get("v")
    if kind != "nd" or len(frames) != 1:
        raise ProtocolError(f"bad payload descriptor {_short(desc)} with {len(frames)} frames")
    dtype, shape = desc.get("dtype"), desc.get("shape")
    if not isinstance(dtype, str) or not _DTYPE.fullmatch(dtype):
        raise ProtocolError(f"unsupported array dtype {_short(dtype)}")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(
            type(n) is int and n >= 0 for n in shape):
        raise ProtocolError(f"bad array shape {_short(shape)}")
    buf = frames[0].buffer if hasattr(frames[0], "buffer") else frames[0]
    try:
        return np.frombuffer(buf, dtype=np.dtype(dtype)).reshape(shape)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"cannot rebuild array from {_short(desc)}: {exc}") from exc


def encode(header: dict[str, Any], buffers: list[Any] | None = None) -> Frames:
    """Frames for one message: the msgpack header, then its raw buffers."""
    return [msgpack.packb(header, use_bin_type=True, default=_numpy_default), *(buffers or [])]


def decode(frames: list[Any]) -> tuple[dict[str, Any], list[Any]]:
    """Split received frames into (header, buffers). Raises ProtocolError on garbage.

    Nothing else escapes: the header size, container lengths and nesting are bounded before
    msgpack allocates anything, and any error msgpack raises is translated."""
    if not frames:
        raise ProtocolError("empty message")
    if len(frames) > MAX_FRAMES:
        raise ProtocolError(f"{len(frames)} frames in one message (at most {MAX_FRAMES})")
    raw = frames[0].bytes if hasattr(frames[0], "bytes") else frames[0]
    if not isinstance(raw, bytes | bytearray | memoryview) or len(raw) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header frame is not bytes or is over {MAX_HEADER_BYTES} bytes")
    try:
        header = msgpack.unpackb(raw, raw=False, max_array_len=_MAX_ITEMS,
                                 max_map_len=_MAX_ITEMS, max_ext_len=0)
    except Exception as exc:  # msgpack raises ValueError, TypeError, StackError, ExtraData...
        raise ProtocolError(f"undecodable header: {type(exc).__name__}: {exc}") from exc
    if not isinstance(header, dict) or not isinstance(header.get("t"), str):
        raise ProtocolError(f"header without a type: {_short(header)}")
    return header, list(frames[1:])


def _short(value: Any) -> str:
    """A peer's value for a log line: bounded, whatever it sent."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _numpy_default(value: Any) -> Any:
    """msgpack calls this only for types it cannot pack: numpy scalars and arrays nested in
    Python values. Plain lists of numbers never come here, so they cost nothing extra."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot send {type(value).__name__} to a worker")
