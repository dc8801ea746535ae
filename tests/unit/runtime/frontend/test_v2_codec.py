"""The V2 codec against tritonclient's own request builder and response parser."""

from __future__ import annotations

import struct

import numpy as np
import orjson
import pytest
import tritonclient.http as triton

from parityserve.config import TensorSpec
from parityserve.errors import InvalidInput, MalformedRequest
from parityserve.runtime.frontend import v2

BUILD = triton.InferenceServerClient.generate_request_body
PARSE = triton.InferenceServerClient.parse_response_body

SAMPLES = {
    "BOOL": np.array([[True, False, True], [False, False, True]]),
    "UINT8": np.array([[0, 7, 255]], dtype=np.uint8),
    "UINT16": np.array([[1, 2], [3, 65535]], dtype=np.uint16),
    "UINT32": np.array([4_000_000_000], dtype=np.uint32),
    "UINT64": np.array([[2**63 + 5]], dtype=np.uint64),
    "INT8": np.array([-128, 0, 127], dtype=np.int8),
    "INT16": np.array([[-3], [4]], dtype=np.int16),
    "INT32": np.arange(-6, 6, dtype=np.int32).reshape(3, 4),
    "INT64": np.array([-(2**40), 2**40], dtype=np.int64),
    "FP16": np.array([[0.5, -1.25]], dtype=np.float16),
    "FP32": np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 2, 3),
    "FP64": np.array([np.pi, -np.e], dtype=np.float64),
    "BYTES": np.array([[b"hello", b""], [b"caf\xc3\xa9", b"x" * 300]], dtype=object),
}


def triton_body(arrays: dict[str, np.ndarray], *, binary: bool,
                outputs: list[triton.InferRequestedOutput] | None = None,
                request_id: str = "") -> tuple[bytes, int | None]:
    inputs = []
    for name, array in arrays.items():
        tensor = triton.InferInput(name, list(array.shape), v2.dtype_to_datatype(array.dtype))
        inputs.append(tensor.set_data_from_numpy(array, binary_data=binary))
    return BUILD(inputs, outputs=outputs, request_id=request_id)


def raw_body(header: dict, *buffers: bytes) -> tuple[bytes, int | None]:
    head = orjson.dumps(header)
    return head + b"".join(buffers), (len(head) if buffers else None)


def decode_one(header: dict, *buffers: bytes) -> v2.Tensor:
    return v2.decode_infer_request(*raw_body(header, *buffers)).inputs[0]


def test_public_names_are_pinned():
    assert sorted(v2.__all__) == sorted([
        "DATATYPES", "HEADER_LENGTH", "InferRequest", "RequestedOutput", "Tensor",
        "check_against_spec", "datatype_to_dtype", "decode_infer_request",
        "decode_infer_response", "dtype_to_datatype", "encode_infer_request",
        "encode_infer_response"])


# ---------------------------------------------------------------- datatype maps


@pytest.mark.parametrize("datatype", v2.DATATYPES)
def test_datatype_round_trips_through_numpy(datatype):
    assert v2.dtype_to_datatype(v2.datatype_to_dtype(datatype)) == datatype


def test_dtype_maps_accept_big_endian_and_string_arrays():
    assert v2.dtype_to_datatype(np.dtype(">f4")) == "FP32"
    assert v2.dtype_to_datatype(np.dtype("S5")) == "BYTES"
    assert v2.dtype_to_datatype(np.dtype("U5")) == "BYTES"


def test_unknown_datatypes_are_refused():
    with pytest.raises(InvalidInput, match="unknown datatype 'FP8'"):
        v2.datatype_to_dtype("FP8")
    with pytest.raises(InvalidInput, match="complex64"):
        v2.dtype_to_datatype(np.dtype(np.complex64))


# ---------------------------------------------------------------- requests from tritonclient


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("datatype", sorted(SAMPLES))
def test_decodes_tritonclient_requests(datatype, binary):
    array = SAMPLES[datatype]
    request = v2.decode_infer_request(*triton_body({"x": array}, binary=binary))
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", datatype, array.shape)
    assert tensor.array.dtype == v2.datatype_to_dtype(datatype)
    np.testing.assert_array_equal(tensor.array, array)


def test_binary_inputs_are_views_of_the_body_not_copies():
    array = SAMPLES["FP32"]
    body, length = triton_body({"x": array}, binary=True)
    tensor = v2.decode_infer_request(body, length).inputs[0]
    assert not tensor.array.flags.writeable  # a view into the immutable request bytes
    assert tensor.array.base is not None


def test_several_inputs_keep_their_order_and_buffers():
    arrays = {"a": SAMPLES["INT32"], "b": SAMPLES["BYTES"], "c": SAMPLES["FP64"]}
    request = v2.decode_infer_request(*triton_body(arrays, binary=True))
    assert [t.name for t in request.inputs] == ["a", "b", "c"]
    for tensor in request.inputs:
        np.testing.assert_array_equal(tensor.array, arrays[tensor.name])


def test_json_bytes_become_utf8_bytes():
    array = np.array(["héllo", "w"], dtype=object)
    tensor = v2.decode_infer_request(*triton_body({"s": array}, binary=False)).inputs[0]
    assert tensor.array.tolist() == ["héllo".encode(), b"w"]


def test_request_id_and_requested_outputs():
    outputs = [triton.InferRequestedOutput("y", binary_data=False),
               triton.InferRequestedOutput("z")]
    body, length = triton_body({"x": SAMPLES["FP32"]}, binary=True, outputs=outputs,
                               request_id="req-7")
    request = v2.decode_infer_request(body, length)
    assert request.id == "req-7"
    assert request.outputs == (v2.RequestedOutput("y", False), v2.RequestedOutput("z", True))
    assert request.binary_data_output is False
    assert request.wants_binary("z") and not request.wants_binary("y")


def test_no_requested_outputs_means_binary_for_all():
    request = v2.decode_infer_request(*triton_body({"x": SAMPLES["INT8"]}, binary=False))
    assert request.outputs == () and request.binary_data_output is True
    assert request.wants_binary("anything")


def test_nested_json_data_is_read_row_major():
    header = {"inputs": [{"name": "x", "datatype": "INT32", "shape": [2, 2],
                          "data": [[1, 2], [3, 4]]}]}
    np.testing.assert_array_equal(decode_one(header).array, [[1, 2], [3, 4]])
    header["inputs"][0]["shape"] = [4]
    np.testing.assert_array_equal(decode_one(header).array, [1, 2, 3, 4])


def test_empty_tensors():
    header = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [0, 3], "data": []}]}
    assert decode_one(header).array.shape == (0, 3)
    header = {"inputs": [{"name": "x", "datatype": "INT64", "shape": [0],
                          "parameters": {"binary_data_size": 0}}]}
    assert decode_one(header, b"").array.shape == (0,)


# ---------------------------------------------------------------- malformed requests


def bad(header: dict, *buffers: bytes, length: int | None = None) -> tuple[bytes, int | None]:
    body, default_length = raw_body(header, *buffers)
    return body, default_length if length is None else length


def tensor(**fields) -> dict:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], **fields}]}


MALFORMED = {
    "not json": ((b"{nope", None), MalformedRequest, "invalid JSON"),
    "not an object": ((b"[1, 2]", None), MalformedRequest, "JSON object"),
    "no inputs": (bad({"outputs": []}), MalformedRequest, "'inputs' must be a non-empty list"),
    "empty inputs": (bad({"inputs": []}), MalformedRequest, "non-empty list"),
    "input not object": (bad({"inputs": [3]}), MalformedRequest, "input #0 must be"),
    "no name": (bad({"inputs": [{"datatype": "FP32", "shape": [1], "data": [1]}]}),
                MalformedRequest, "'name'"),
    "unknown datatype": (bad(tensor(datatype="FP8", data=[1, 2])), InvalidInput,
                         "input 'x': unknown datatype 'FP8'"),
    "datatype not a string": (bad(tensor(datatype=["FP32"], data=[1, 2])), InvalidInput,
                              "input 'x': unknown datatype ['FP32']"),
    "bad shape": (bad(tensor(shape=[2, -1], data=[1, 2])), MalformedRequest,
                  "tensor 'x': 'shape' must be"),
    "bool in shape": (bad(tensor(shape=[True], data=[1])), MalformedRequest, "'shape'"),
    "no data": (bad(tensor()), MalformedRequest, "neither 'data' nor binary_data_size"),
    "too few values": (bad(tensor(data=[1.0])), InvalidInput,
                       "tensor 'x': 'data' has 1 elements, but shape [2] needs 2"),
    "ragged": (bad(tensor(shape=[2, 2], data=[[1, 2], [3]])), InvalidInput,
               "'data' has 3 elements, but shape [2, 2] needs 4"),
    "ragged, same count": (bad(tensor(shape=[3], data=[[1, 2], [3]])), InvalidInput,
                           "rectangular"),
    "strings as numbers": (bad(tensor(data=["1", "2"])), InvalidInput,
                           "FP32 data takes only numbers, got strings"),
    "nulls": (bad(tensor(data=[1, None])), InvalidInput, "numbers, got null"),
    "objects": (bad(tensor(data=[{"a": 1}, 2])), InvalidInput, "numbers, got objects"),
    "floats as ints": (bad(tensor(datatype="INT32", data=[1.5, 2])), InvalidInput,
                       "INT32 data takes only integers, got floats"),
    "overflow": (bad(tensor(datatype="UINT8", data=[1, 300])), InvalidInput,
                 "do not fit UINT8"),
    "numbers as bools": (bad(tensor(datatype="BOOL", data=[0, 1])), InvalidInput,
                         "BOOL data takes only booleans, got integers"),
    "bytes not strings": (bad(tensor(datatype="BYTES", data=["a", 1])), InvalidInput,
                          "BYTES element 1 must be a string"),
    "bad parameters": (bad(tensor(data=[1, 2], parameters=[1])), MalformedRequest,
                       "'parameters' must be a JSON object"),
    "shared memory": (bad(tensor(parameters={"shared_memory_region": "r"})), InvalidInput,
                      "shared-memory"),
    "bad id": (bad({"id": 5, **tensor(data=[1, 2])}), MalformedRequest, "'id'"),
    "bad outputs": (bad({"outputs": {"name": "y"}, **tensor(data=[1, 2])}), MalformedRequest,
                    "'outputs' must be a list"),
    "bad binary_data flag": (
        bad({"outputs": [{"name": "y", "parameters": {"binary_data": "yes"}}],
             **tensor(data=[1, 2])}), MalformedRequest, "'binary_data' must be true or false"),
    "binary without header length": (
        (orjson.dumps(tensor(parameters={"binary_data_size": 8})), None), MalformedRequest,
        "no Inference-Header-Content-Length"),
    "binary size mismatch": (
        bad(tensor(parameters={"binary_data_size": 4}), b"\0" * 4), InvalidInput,
        "tensor 'x': 4 bytes of data, but shape [2] of FP32 needs 8"),
    "binary past the end": (
        bad(tensor(parameters={"binary_data_size": 8}), b"\0" * 4), InvalidInput,
        "runs past the end"),
    "unclaimed bytes": (
        bad(tensor(parameters={"binary_data_size": 8}), b"\0" * 12), MalformedRequest,
        "4 bytes after the last binary tensor"),
    "negative binary size": (
        bad(tensor(parameters={"binary_data_size": -1}), b"\0"), MalformedRequest,
        "binary_data_size must be a non-negative integer"),
    "data and binary": (
        bad(tensor(data=[1, 2], parameters={"binary_data_size": 8}), b"\0" * 8),
        MalformedRequest, "both 'data' and binary_data_size"),
    "header length too big": (
        bad(tensor(data=[1, 2]), length=10_000), MalformedRequest, "the body has"),
    "bytes prefix truncated": (
        bad({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [2],
                         "parameters": {"binary_data_size": 11}}]},
            struct.pack("<I", 5) + b"abcde" + b"\0\0"), InvalidInput,
        "ends after 1 of 2 elements"),
    "bytes shorter than their prefixes": (
        bad({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [2],
                         "parameters": {"binary_data_size": 6}}]},
            struct.pack("<I", 1) + b"a" + b"\0"), InvalidInput,
        "shape [2] of BYTES needs at least 8 bytes"),
    "bytes element too long": (
        bad({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [1],
                         "parameters": {"binary_data_size": 6}}]},
            struct.pack("<I", 9) + b"ab"), InvalidInput, "claims 9 bytes"),
    "bytes left over": (
        bad({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [1],
                         "parameters": {"binary_data_size": 7}}]},
            struct.pack("<I", 1) + b"abc"), InvalidInput, "2 bytes left after 1 BYTES"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_requests_name_the_problem(case):
    (body, length), error, message = MALFORMED[case]
    with pytest.raises(error, match=message.replace("[", r"\[").replace("]", r"\]")):
        v2.decode_infer_request(body, length)


# ---------------------------------------------------------------- responses for tritonclient


def parse(body: bytes, headers: dict[str, str]):
    length = headers.get(v2.HEADER_LENGTH)
    return PARSE(body, header_length=None if length is None else int(length))


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("datatype", sorted(SAMPLES))
def test_tritonclient_parses_our_responses(datatype, binary):
    array = SAMPLES[datatype]
    body, headers = v2.encode_infer_response("m", "3", "q1", [("y", array)], {"y": binary})
    result = parse(body, headers)
    assert result.get_response()["model_version"] == "3"
    assert result.get_response()["id"] == "q1"
    got = result.as_numpy("y")
    if datatype == "BYTES" and not binary:  # JSON carries text; tritonclient keeps str
        got = np.vectorize(str.encode, otypes=[object])(got)
    np.testing.assert_array_equal(got, array)
    assert got.shape == array.shape


def test_response_headers_follow_the_mode():
    array = SAMPLES["FP32"]
    _, json_headers = v2.encode_infer_response("m", None, None, [("y", array)], {})
    assert json_headers == {"content-type": "application/json"}
    body, bin_headers = v2.encode_infer_response("m", None, None, [("y", array)], {"y": True})
    assert bin_headers["content-type"] == "application/octet-stream"
    length = int(bin_headers[v2.HEADER_LENGTH])
    assert len(body) == length + array.nbytes


def test_mixed_binary_and_json_outputs():
    outputs = [("a", SAMPLES["INT16"]), ("b", SAMPLES["BYTES"]), ("c", SAMPLES["BOOL"])]
    body, headers = v2.encode_infer_response("m", "1", None, outputs,
                                             {"a": True, "b": True, "c": False})
    result = parse(body, headers)
    for name, array in outputs:
        np.testing.assert_array_equal(result.as_numpy(name), array)


def test_non_contiguous_and_big_endian_outputs():
    strided = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    swapped = np.arange(4, dtype=">i4")
    for binary in (False, True):
        body, headers = v2.encode_infer_response(
            "m", "1", None, [("s", strided), ("w", swapped)], {"s": binary, "w": binary})
        result = parse(body, headers)
        np.testing.assert_array_equal(result.as_numpy("s"), strided)
        np.testing.assert_array_equal(result.as_numpy("w"), swapped)


# ---------------------------------------------------------------- client direction


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("datatype", ["BYTES", "FP32", "INT64", "BOOL"])
def test_request_encoder_round_trips(datatype, binary):
    array = SAMPLES[datatype]
    body, headers = v2.encode_infer_request([("x", array)], binary=binary, binary_output=True,
                                            request_id="r")
    length = headers.get(v2.HEADER_LENGTH)
    request = v2.decode_infer_request(body, None if length is None else int(length))
    assert request.id == "r" and request.binary_data_output is True
    np.testing.assert_array_equal(request.inputs[0].array, array)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_response_decoder_round_trips(binary):
    array = SAMPLES["FP16"]
    body, headers = v2.encode_infer_response("m", "1", None, [("y", array)], {"y": binary})
    length = headers.get(v2.HEADER_LENGTH)
    outputs = v2.decode_infer_response(body, None if length is None else int(length))
    np.testing.assert_array_equal(outputs["y"], array)


# ---------------------------------------------------------------- signature checks


SPEC = TensorSpec(name="x", datatype="FP32", shape=(-1, 3))


def test_check_against_spec_accepts_wildcards_and_any_batch():
    v2.check_against_spec(np.zeros((5, 7, 3), np.float32), SPEC)
    v2.check_against_spec(np.zeros((0, 1, 3), np.float32), SPEC)


@pytest.mark.parametrize(("array", "message"), [
    (np.zeros((2, 7, 3), np.float64), "input 'x': expected datatype FP32, got FP64"),
    (np.zeros((2, 7, 4), np.float32), r"expected shape \[-1, -1, 3\] .* got \[2, 7, 4\]"),
    (np.zeros((7, 3), np.float32), r"expected shape \[-1, -1, 3\] .* got \[7, 3\]"),
])
def test_check_against_spec_says_expected_and_got(array, message):
    with pytest.raises(InvalidInput, match=message):
        v2.check_against_spec(array, SPEC)


# ---------------------------------------------------------------- numbers and limits


def _fp(data, shape, datatype="FP32") -> dict:
    return {"inputs": [{"name": "x", "datatype": datatype, "shape": shape, "data": data}]}


@pytest.mark.parametrize(("data", "datatype"), [
    ([True, 1.5], "FP32"),
    ([[1, False]], "INT32"),
    ([1.0, [True]], "FP64"),
])
def test_json_booleans_among_numbers_are_refused(data, datatype):
    shape = list(np.shape(np.array(data, dtype=object))) if datatype != "FP64" else [2]
    with pytest.raises(InvalidInput, match="booleans|rectangular"):
        decode_one(_fp(data, shape, datatype))


def test_json_booleans_still_fill_bool_tensors():
    assert decode_one(_fp([True, False], [2], "BOOL")).array.tolist() == [True, False]


def test_fp32_overflow_decodes_to_infinity_without_a_warning():
    # The server refuses it (runtime/serving/system.py); the codec only must not warn or wrap.
    assert np.isinf(decode_one(_fp([1e39, 1.0], [2])).array[0])


def test_limits_are_only_checked_when_given():
    from parityserve.config import Limits
    from parityserve.errors import LimitExceeded

    body = raw_body(_fp([[1.0, 2.0, 3.0]] * 3, [3, 3]))
    assert v2.decode_infer_request(*body).inputs[0].array.shape == (3, 3)
    with pytest.raises(LimitExceeded, match="max_batch_items = 2"):
        v2.decode_infer_request(*body, Limits(max_batch_items=2))
    with pytest.raises(LimitExceeded, match="max_input_elements = 2"):
        v2.decode_infer_request(*body, Limits(max_input_elements=2))
    with pytest.raises(LimitExceeded, match="max_json_depth = 4"):
        v2.decode_infer_request(*body, Limits(max_json_depth=4))  # data's rows sit at 5
    v2.decode_infer_request(*body, Limits(max_json_depth=5))


@pytest.mark.parametrize(("data", "datatype"), [
    ([2**64 - 1, 1, 2, 3], "UINT64"),  # beside small ints, numpy's guess was float64
    ([2**64 - 1], "UINT64"),
    ([-(2**63), 2**63 - 1], "INT64"),
])
def test_json_integers_fill_their_64_bit_types_exactly(data, datatype):
    array = decode_one(_fp(data, [len(data)], datatype)).array
    assert array.dtype == v2.datatype_to_dtype(datatype) and array.tolist() == data


@pytest.mark.parametrize(("data", "datatype"), [
    ([-1, 2**64 - 1], "UINT64"), ([2**63, -1], "INT64"), ([[2**64 - 1], [-(2**63)]], "INT64"),
])
def test_json_integers_outside_a_64_bit_type_say_they_do_not_fit(data, datatype):
    # integers all: "got floats" named a type the client never sent
    with pytest.raises(InvalidInput, match=f"do not fit {datatype}"):
        decode_one(_fp(data, list(np.shape(data)), datatype))
