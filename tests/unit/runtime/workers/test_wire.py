"""The RPC framing: msgpack headers, numpy arrays as raw frames."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from parityserve.errors import ProtocolError
from parityserve.runtime.workers import wire


@pytest.mark.parametrize("array", [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.arange(6, dtype=np.int64),
    np.zeros((0, 5), dtype=np.float64),
    np.asfortranarray(np.arange(6, dtype=np.uint8).reshape(2, 3)),
])
def test_arrays_round_trip_through_raw_frames(array: np.ndarray) -> None:
    desc, frames = wire.pack_payload(array)
    header, buffers = wire.decode(wire.encode({"t": wire.PREDICT, "in": desc}, frames))
    rebuilt = wire.unpack_payload(header["in"], [bytes(b) for b in buffers])
    np.testing.assert_array_equal(rebuilt, array)
    assert rebuilt.dtype == array.dtype


def test_contiguous_arrays_are_not_copied() -> None:
    array = np.arange(1000, dtype=np.float32)
    _, frames = wire.pack_payload(array)
    assert np.shares_memory(np.frombuffer(frames[0], dtype=np.float32), array)


def test_python_values_travel_in_the_header() -> None:
    value = [[1, 2], {"a": np.float32(1.5)}, "text", np.arange(2)]
    desc, frames = wire.pack_payload(value)
    assert frames == []
    header, _ = wire.decode(wire.encode({"t": wire.RESULT, "out": desc}))
    assert wire.unpack_payload(header["out"], []) == [[1, 2], {"a": 1.5}, "text", [0, 1]]


@pytest.mark.parametrize("frames", [
    [],
    [b"\xc1garbage"],
    [msgpack.packb([1, 2])],
    [msgpack.packb({"no_type": 1})],
])
def test_malformed_messages_raise_protocol_error(frames) -> None:
    with pytest.raises(ProtocolError):
        wire.decode(frames)


def test_bad_payload_descriptors_raise_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        wire.unpack_payload({"k": "nd", "dtype": "<f4", "shape": [3]}, [])
    with pytest.raises(ProtocolError):
        wire.unpack_payload({"k": "nd", "dtype": "<f4", "shape": [3]}, [b"\x00" * 5])
    with pytest.raises(ProtocolError):
        wire.unpack_payload({"k": "weird"}, [])


def test_numpy_values_nested_in_python_values_are_packed() -> None:
    header, _ = wire.decode(wire.encode({"t": wire.RESULT, "v": [np.float32(2.5), np.arange(2)]}))
    assert header["v"] == [2.5, [0, 1]]


def test_unpackable_values_raise_type_error() -> None:
    with pytest.raises(TypeError, match="object"):
        wire.encode({"t": wire.RESULT, "v": object()})
