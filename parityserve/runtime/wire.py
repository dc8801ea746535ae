"""The RPC wire format between the frontend (ROUTER) and model workers (DEALER).

A message is one msgpack header frame followed by zero or more raw buffer frames. Numpy arrays
travel as raw frames (sent with ``copy=False`` and read back with ``np.frombuffer``), so a batch
of images is never serialised element by element. Anything else (lists of strings, nested
Python values) is carried inline in the header as msgpack.

We hand-write this small framing because it is the protocol itself: ZeroMQ gives us frames and
msgpack gives us headers, and this module only says which frame holds what.
"""

from __future__ import annotations

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
    "STOP",
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

Frames = list[Any]


def pack_payload(value: Any) -> tuple[dict[str, Any], list[Any]]:
    """Describe ``value`` for a header and return the raw frames that carry it."""
    if isinstance(value, np.ndarray) and value.dtype != object:
        array = np.ascontiguousarray(value)
        desc = {"k": "nd", "dtype": array.dtype.str, "shape": list(array.shape)}
        return desc, [memoryview(array).cast("B") if array.size else b""]
    return {"k": "obj", "v": value}, []


def unpack_payload(desc: dict[str, Any], frames: list[Any]) -> Any:
    """Inverse of ``pack_payload``; arrays are views over the received frame (no copy)."""
    kind = desc.get("k")
    if kind == "obj":
        return desc.get("v")
    if kind != "nd" or not frames:
        raise ProtocolError(f"bad payload descriptor {desc!r} with {len(frames)} frames")
    buf = frames[0].buffer if hasattr(frames[0], "buffer") else frames[0]
    try:
        return np.frombuffer(buf, dtype=np.dtype(desc["dtype"])).reshape(desc["shape"])
    except (TypeError, ValueError, KeyError) as exc:
        raise ProtocolError(f"cannot rebuild array from {desc!r}: {exc}") from exc


def encode(header: dict[str, Any], buffers: list[Any] | None = None) -> Frames:
    """Frames for one message: the msgpack header, then its raw buffers."""
    return [msgpack.packb(header, use_bin_type=True, default=_numpy_default), *(buffers or [])]


def decode(frames: list[Any]) -> tuple[dict[str, Any], list[Any]]:
    """Split received frames into (header, buffers). Raises ProtocolError on garbage."""
    if not frames:
        raise ProtocolError("empty message")
    raw = frames[0].bytes if hasattr(frames[0], "bytes") else frames[0]
    try:
        header = msgpack.unpackb(raw, raw=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise ProtocolError(f"undecodable header: {exc}") from exc
    if not isinstance(header, dict) or "t" not in header:
        raise ProtocolError(f"header without a type: {header!r}")
    return header, list(frames[1:])


def _numpy_default(value: Any) -> Any:
    """msgpack calls this only for types it cannot pack: numpy scalars and arrays nested in
    Python values. Plain lists of numbers never come here, so they cost nothing extra."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot send {type(value).__name__} to a worker")
