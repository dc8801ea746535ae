"""Decoding what workers send: a typed record or ProtocolError, whatever the bytes."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parityserve.config import TensorSpec
from parityserve.errors import ProtocolError
from parityserve.runtime.workers import messages, wire

_MESSAGES = (messages.Hello, messages.Heartbeat, messages.Result, messages.Bye,
             messages.Failed)

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(),
                     st.text(max_size=8), st.binary(max_size=8))
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)),
    max_leaves=12)
_kinds = st.sampled_from([wire.HELLO, wire.HEARTBEAT, wire.RESULT, wire.BYE, wire.FAILED,
                          "pred", "nope"])
_fields = st.sampled_from(["t", "bid", "ok", "out", "error", "ms", "corrupted", "replica",
                           "model", "version", "pid", "platform", "input", "output", "served",
                           "k", "v", "dtype", "shape"])
_desc = st.fixed_dictionaries({"k": st.sampled_from(["nd", "obj", "x"])}, optional={
    "dtype": st.one_of(st.sampled_from(["<f4", "|b1", "<U3", "O", "|V8", "<f4x"]), _scalars),
    "shape": st.one_of(st.lists(st.integers(-3, 2**40), max_size=4), _scalars),
    "v": _values})
_headers = st.dictionaries(_fields, st.one_of(_values, _desc), max_size=8).flatmap(
    lambda h: st.builds(lambda t: {**h, "t": t}, _kinds))
_buffers = st.lists(st.binary(max_size=64), max_size=wire.MAX_FRAMES + 2)
# Valid messages of each type; the property test below breaks one to three fields of them.
_VALID = [
    ({"t": wire.RESULT, "bid": 1, "ok": True, "out": {"k": "nd", "dtype": "<f4",
                                                       "shape": [1, 2]}, "ms": 1.0}, 1),
    ({"t": wire.RESULT, "bid": 1, "ok": True, "out": {"k": "obj", "v": [1]}}, 0),
    ({"t": wire.RESULT, "bid": 1, "ok": False, "error": "x"}, 0),
    ({"t": wire.RESULT, "bid": 1, "ok": False, "error": "x", "bad_input": True}, 0),
    ({"t": wire.HELLO, "replica": "r", "model": "m", "version": 1, "pid": 3,
      "input": {"name": "i", "datatype": "FP32", "shape": [2]}, "output": None}, 0),
    ({"t": wire.HEARTBEAT, "served": 3}, 0),
    ({"t": wire.FAILED, "error": "x"}, 0),
    ({"t": wire.BYE}, 0),
]
_spec_like = st.dictionaries(st.sampled_from(["name", "datatype", "shape", "x"]),
                             _values, max_size=4)


@st.composite
def _broken(draw: st.DrawFn) -> tuple[dict, list[bytes]]:
    header, frames = draw(st.sampled_from(_VALID))
    keys = st.sampled_from([*header, "out", "input", "extra"])
    changes = draw(st.dictionaries(keys, st.one_of(_values, _desc, _spec_like), max_size=3))
    count = draw(st.one_of(st.just(frames), st.integers(0, 3)))
    buffers = draw(st.lists(st.sampled_from([b"", b"\0" * 8, b"\0" * 7]), min_size=count,
                            max_size=count))
    return {**header, **changes}, buffers


def _decodes_or_refuses(frames: list) -> None:
    try:
        message = messages.decode(frames)
    except ProtocolError:
        return
    assert isinstance(message, _MESSAGES)


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=256), max_size=wire.MAX_FRAMES + 2))
def test_random_bytes_decode_or_raise_protocol_error(frames: list[bytes]) -> None:
    _decodes_or_refuses(frames)


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(_values, _buffers)
def test_random_msgpack_values_decode_or_raise_protocol_error(value, buffers) -> None:
    _decodes_or_refuses([msgpack.packb(value, use_bin_type=True), *buffers])


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(_headers, _buffers)
def test_random_headers_with_random_frames_decode_or_raise(header, buffers) -> None:
    _decodes_or_refuses([msgpack.packb(header, use_bin_type=True), *buffers])


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(_broken())
def test_valid_messages_with_broken_fields_decode_or_raise(case) -> None:
    header, buffers = case
    _decodes_or_refuses([msgpack.packb(header, use_bin_type=True), *buffers])


@pytest.mark.parametrize("raw", [
    b"\xdd\xff\xff\xff\xff",  # an array declaring 4 billion items, then nothing
    b"\xdf\xff\xff\xff\xff",  # a map likewise
    b"\xdb\xff\xff\xff\xff" + b"x" * 8,  # a 4 GiB string
    b"\xc6\xff\xff\xff\xff",  # a 4 GiB bin
    b"\x91" * 100_000,  # nesting past msgpack's stack
    b"\xd6\xff" + b"\x00" * 4,  # an extension type
    msgpack.packb({1: "non-string key"}),
])
def test_huge_declared_lengths_and_odd_encodings_are_refused(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        messages.decode([raw])


def test_a_header_over_the_size_bound_is_refused_before_decoding() -> None:
    with pytest.raises(ProtocolError, match="over"):
        messages.decode([b"\x00" * (wire.MAX_HEADER_BYTES + 1)])


def test_too_many_frames_are_refused() -> None:
    with pytest.raises(ProtocolError, match="frames"):
        messages.decode(wire.encode({"t": wire.BYE}, [b""] * wire.MAX_FRAMES))


def test_a_result_round_trips_into_a_typed_record() -> None:
    desc, frames = wire.pack_payload(np.arange(6, dtype=np.float32).reshape(3, 2))
    header = {"t": wire.RESULT, "bid": 5, "ok": True, "out": desc, "ms": 1.5, "corrupted": 0}
    message = messages.decode(wire.encode(header, [bytes(f) for f in frames]))
    assert isinstance(message, messages.Result) and message.bid == 5 and message.ms == 1.5
    np.testing.assert_array_equal(message.outputs, np.arange(6).reshape(3, 2))


def test_an_error_result_says_whether_the_model_blamed_its_input() -> None:
    header = {"t": wire.RESULT, "bid": 5, "ok": False, "error": "ValueError: x"}
    assert messages.decode(wire.encode(header)) == messages.Result(5, False, error="ValueError: x")
    blamed = messages.decode(wire.encode({**header, "bad_input": True}))
    assert isinstance(blamed, messages.Result) and blamed.bad_input


def test_a_hello_carries_typed_signatures() -> None:
    spec = {"name": "x", "datatype": "FP32", "shape": [4]}
    message = messages.decode(wire.encode({"t": wire.HELLO, "replica": "m/v1/0", "model": "m",
                                           "version": 1, "pid": 7, "input": spec}))
    assert message == messages.Hello("m/v1/0", "m", 1, 7, None, TensorSpec(**spec), None)


@pytest.mark.parametrize("header, buffers", [
    ({"t": wire.RESULT, "bid": "1", "ok": True}, []),  # bid of the wrong type
    ({"t": wire.RESULT, "bid": 1, "ok": 1}, []),  # ok not a bool
    ({"t": wire.RESULT, "bid": 1, "ok": True, "out": {"k": "nd", "dtype": "<f4",
                                                       "shape": [2]}}, []),  # no buffer
    ({"t": wire.RESULT, "bid": 1, "ok": True, "out": {"k": "nd", "dtype": "<f4",
                                                       "shape": [2]}}, [b"\0" * 8] * 2),
    ({"t": wire.RESULT, "bid": 1, "ok": True, "out": {"k": "nd", "dtype": "O",
                                                       "shape": [1]}}, [b"\0" * 8]),
    ({"t": wire.RESULT, "bid": 1, "ok": True, "out": {"k": "nd", "dtype": "<f4",
                                                       "shape": [3]}}, [b"\0" * 8]),
    ({"t": wire.RESULT, "bid": 1, "ok": True, "out": {"k": "obj", "v": 1}}, [b""]),
    ({"t": wire.RESULT, "bid": 1, "ok": False}, [b"x"]),
    ({"t": wire.RESULT, "bid": 1, "ok": False, "bad_input": 1}, []),  # not a bool
    ({"t": wire.HELLO, "model": "m", "version": 1}, []),  # no replica
    ({"t": wire.HELLO, "replica": "r", "model": "m", "version": True}, []),
    ({"t": wire.HELLO, "replica": "r", "model": "m", "version": 1, "input": [1]}, []),
    ({"t": wire.HELLO, "replica": "r", "model": "m", "version": 1,
      "input": {"shape": "x"}}, []),
    ({"t": wire.HEARTBEAT, "served": "many"}, []),
    ({"t": wire.BYE}, [b"extra"]),
    ({"t": wire.PREDICT, "bid": 1}, []),  # the frontend's message type, not a worker's
])
def test_wrong_types_and_frame_counts_raise_protocol_error(header, buffers) -> None:
    with pytest.raises(ProtocolError):
        messages.decode(wire.encode(header, buffers))
