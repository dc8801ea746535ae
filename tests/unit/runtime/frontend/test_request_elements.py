"""Issue 38: no request holds the event loop for long. Decoding makes a Python object of every
JSON value, BYTES element and typed gRPC content (0.1-0.5 us each, benchmarks/results/
loop-block), so one request may carry at most ``max_request_elements`` of them, counted from
the shape before anything is decoded (a JSON list is a value too), and at most
``max_json_bytes`` of JSON, which is parsed whole before anything can be counted. Binary
numeric tensors are read in place and count for nothing. Each refusal is a 4xx that names its
setting (400 past a count, 413 past a size).
"""

from __future__ import annotations

import struct
import sys
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from parityserve.config import Limits
from parityserve.core.inputs import decoded_one_by_one, scan, take_elements
from parityserve.errors import LimitExceeded, PayloadTooLarge
from parityserve.runtime.frontend import clipper, grpc_v2, v2
from parityserve.runtime.frontend.edge_json import decode_predict

LIMITS = Limits()
CAP = LIMITS.max_request_elements


def test_the_defaults() -> None:
    assert (CAP, LIMITS.max_json_bytes) == (65_536, 512 * 1024)


# ---- the pure arithmetic (core/inputs.py) -------------------------------------------------------


def test_take_elements_adds_up_to_the_limit_and_refuses_past_it() -> None:
    assert take_elements(0, 10, limit=10, what="tensor 'x'") == 10
    assert take_elements(4, 6, limit=10, what="tensor 'x'") == 10
    with pytest.raises(LimitExceeded) as refused:
        take_elements(4, 7, limit=10, what="tensor 'y'")
    assert "tensor 'y' brings the request to 11 values" in str(refused.value)
    assert "max_request_elements = 10" in str(refused.value)
    assert refused.value.status_code == 400  # as every other request limit


@pytest.mark.parametrize(("datatype", "raw", "counted"), [
    ("FP32", True, False), ("INT64", True, False), ("BOOL", True, False),  # read in place
    ("BYTES", True, True), ("FP32", False, True), ("BYTES", False, True)])
def test_what_counts(datatype: str, raw: bool, counted: bool) -> None:
    assert decoded_one_by_one(datatype, raw=raw) is counted


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=40)


@given(json_values)
def test_n_values_take_at_least_2n_minus_1_bytes_of_json(value: Any) -> None:
    # Why the Clipper routes skip the request-wide walk for bodies under 2 * CAP bytes: a
    # number takes a byte, a list two, and each value after the first a comma.
    leaves = scan(value, max_depth=sys.maxsize, max_elements=sys.maxsize)
    assert len(orjson.dumps(value)) >= 2 * (leaves.count + leaves.containers) - 1


# ---- V2 over HTTP: counted from the shape, before the data is read -----------------------------


def json_tensor(name: str, datatype: str, count: int, data: Any = None) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": [1, count],
            "data": ([0] * count if datatype != "BYTES" else [""] * count)
            if data is None else data}


def json_body(*tensors: dict[str, Any]) -> bytes:
    return orjson.dumps({"inputs": list(tensors)})


def binary_body(datatype: str, count: int, data: bytes) -> tuple[bytes, int]:
    head = orjson.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": [1, count],
                                     "parameters": {"binary_data_size": len(data)}}]})
    return head + data, len(head)


@pytest.mark.parametrize("datatype", ["FP32", "BYTES"])
def test_json_data_up_to_the_cap_is_decoded(datatype: str) -> None:
    body = json_body(json_tensor("x", datatype, CAP - 1))  # and the list that holds them
    assert len(body) <= LIMITS.max_json_bytes
    assert v2.decode_infer_request(body, None, LIMITS).inputs[0].array.size == CAP - 1
    with pytest.raises(LimitExceeded, match=f"to {CAP + 1} values"):
        v2.decode_infer_request(json_body(json_tensor("x", datatype, CAP)), None, LIMITS)


@pytest.mark.parametrize("datatype", ["FP32", "BYTES"])
def test_json_data_past_the_cap_is_refused_from_its_shape(datatype: str) -> None:
    # The data holds one value: the shape alone decides, nothing of it is walked.
    body = json_body(json_tensor("x", datatype, CAP + 1, data=[0]))
    with pytest.raises(LimitExceeded, match=f"{CAP + 1} values.*max_request_elements = {CAP}"):
        v2.decode_infer_request(body, None, LIMITS)


def test_lists_without_values_count_too() -> None:
    # A [1, n, 0] tensor holds no element but n + 2 lists, each a Python object to make.
    body = json_body({"name": "x", "datatype": "FP32", "shape": [1, CAP, 0],
                      "data": [[[] for _ in range(CAP)]]})
    with pytest.raises(LimitExceeded, match=f"to {CAP + 2} values"):
        v2.decode_infer_request(body, None, LIMITS)


def test_the_cap_is_for_the_whole_request() -> None:
    half = CAP // 2
    body = json_body(json_tensor("a", "FP32", half),
                     json_tensor("b", "FP32", half + 1, data=[0]))
    with pytest.raises(LimitExceeded, match="tensor 'b' brings the request to"):
        v2.decode_infer_request(body, None, LIMITS)


def test_binary_bytes_past_the_cap_are_refused_and_up_to_it_decoded() -> None:
    at_cap = v2.decode_infer_request(*binary_body("BYTES", CAP, b"\0" * 4 * CAP), LIMITS)
    assert at_cap.inputs[0].array.size == CAP
    with pytest.raises(LimitExceeded, match="max_request_elements"):
        v2.decode_infer_request(*binary_body("BYTES", CAP + 1, b"\0" * 4 * (CAP + 1)), LIMITS)


def test_binary_numbers_are_read_in_place_and_not_counted() -> None:
    many = 4 * CAP
    decoded = v2.decode_infer_request(*binary_body("FP32", many, bytes(4 * many)), LIMITS)
    assert decoded.inputs[0].array.size == many


def test_a_json_body_past_max_json_bytes_is_refused_before_it_is_parsed() -> None:
    limits = Limits(max_json_bytes=4096)
    body = json_body(json_tensor("x", "FP32", 1)) + b" " * 4096  # valid JSON, one value
    with pytest.raises(PayloadTooLarge, match="more than max_json_bytes = 4096"):
        v2.decode_infer_request(body, None, limits)
    head, length = binary_body("FP32", 2048, bytes(8192))  # a small header, big data: fine
    assert v2.decode_infer_request(head, length, limits).inputs[0].array.size == 2048
    padded = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1],
                                       "parameters": {"binary_data_size": 4}}],
                           "id": "x" * 4096})
    with pytest.raises(PayloadTooLarge, match="max_json_bytes"):
        v2.decode_infer_request(padded + bytes(4), len(padded), limits)


# ---- V2 over gRPC ------------------------------------------------------------------------------


def grpc_request(datatype: str, count: int, *, raw: bool) -> Any:
    tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype=datatype,
                                                   shape=[1, count])
    request = pb.ModelInferRequest(model_name="m", inputs=[tensor])
    if raw:
        request.raw_input_contents.append(b"\0" * 4 * count)
    elif datatype == "BYTES":
        request.inputs[0].contents.bytes_contents.extend([b""] * count)
    else:
        request.inputs[0].contents.fp32_contents.extend([0.0] * count)
    return request


def grpc_input(request: Any) -> Any:
    """The one input tensor of a ModelInferRequest, as the gRPC edge decodes it."""
    return grpc_v2._decoded(request, LIMITS).tensors[0][1]


@pytest.mark.parametrize(("datatype", "raw"), [("FP32", False), ("BYTES", False),
                                               ("BYTES", True)])
def test_grpc_values_decoded_one_by_one_are_capped(datatype: str, raw: bool) -> None:
    assert grpc_input(grpc_request(datatype, CAP, raw=raw)).size == CAP
    with pytest.raises(LimitExceeded, match=f"max_request_elements = {CAP}"):
        grpc_input(grpc_request(datatype, CAP + 1, raw=raw))


def test_grpc_raw_numbers_are_not_counted() -> None:
    many = 4 * CAP
    assert grpc_input(grpc_request("FP32", many, raw=True)).size == many


# ---- Clipper and graph bodies: every value of the body counts ---------------------------------


def test_a_clipper_body_past_the_cap_is_refused_on_either_path() -> None:
    # The body's values: the object, the input's list, and its numbers.
    at_cap = orjson.dumps({"input": [0] * (CAP - 2)})
    over = orjson.dumps({"input": [0] * (CAP - 1)})
    fast = decode_predict(at_cap, LIMITS)
    assert fast is not None and fast.items[0].array.size == CAP - 2
    assert decode_predict(over, LIMITS) is None  # the general path decides, and refuses:
    with pytest.raises(LimitExceeded, match=f"the body brings the request to {CAP + 1} values"):
        clipper.predict_items(orjson.loads(over), LIMITS, len(over))
    one = orjson.loads(at_cap)
    assert len(clipper.predict_items(one, LIMITS, len(at_cap))[0][0]) == CAP - 2
    numbers = CAP - 2 - 1024  # the body, input_batch, and a list per query: CAP values
    rows = [[0] * (numbers // 1024) for _ in range(1024)]
    rows[-1] += [0] * (numbers % 1024)
    batch = {"input_batch": rows}
    assert decode_predict(orjson.dumps(batch), LIMITS) is not None
    batch["input_batch"][-1].append(0)
    assert decode_predict(orjson.dumps(batch), LIMITS) is None
    with pytest.raises(LimitExceeded, match="max_request_elements"):
        clipper.check_body(batch, LIMITS, len(orjson.dumps(batch)))


def test_other_values_of_the_body_count_too() -> None:
    # A graph batch's stream names are values: 256 rows of 1,024 numbers and 256 streams.
    rows = [[0] * 1024 for _ in range(256)]
    body = {"input_batch": rows, "streams": [str(i) for i in range(256)]}
    with pytest.raises(LimitExceeded, match="max_request_elements"):
        clipper.check_body(body, LIMITS, len(orjson.dumps(body)))
    assert decode_predict(orjson.dumps({"input": [0] * (CAP - 3), "uid": "u"}), LIMITS)
    assert decode_predict(orjson.dumps({"input": [0] * (CAP - 2), "uid": "u"}), LIMITS) is None


def test_a_body_too_short_to_pass_the_cap_is_not_walked_twice() -> None:
    # Fewer than 2 * CAP bytes cannot hold more than CAP values: the walk is skipped (the
    # system's own scan of the inputs still runs), so a lying size shows that it was.
    over = {"input": [0] * CAP}
    clipper.check_body(over, LIMITS, 2 * CAP - 1)
    with pytest.raises(LimitExceeded):
        clipper.check_body(over, LIMITS, 2 * CAP)


def test_binary_bytes_elements_decode_exactly() -> None:
    values = [b"ab", b"", b"\0\xff", b"x" * 300]
    raw = b"".join(struct.pack("<I", len(v)) + v for v in values)
    decoded = v2.decode_infer_request(*binary_body("BYTES", 4, raw), LIMITS)
    assert decoded.inputs[0].array.tolist() == [values]


# ---- gRPC: what protobuf parses value by value is bounded too -----------------------------------


def _typed_bytes(count: int) -> Any:
    return grpc_request("BYTES", count, raw=False)


def test_the_parsed_part_of_a_grpc_message_is_its_bytes_less_the_raw_payloads() -> None:
    for request in (grpc_request("FP32", 1000, raw=True), _typed_bytes(1000),
                    grpc_request("BYTES", 3, raw=True)):
        raw = sum(len(r) for r in request.raw_input_contents)
        data = request.SerializeToString()
        assert grpc_v2._parsed_bytes(data, stop_past=len(data)) == len(data) - raw
    big = grpc_request("FP32", 1 << 20, raw=True).SerializeToString()
    assert grpc_v2._parsed_bytes(big, stop_past=1024) < 100  # a small header, 4 MiB of data


def test_the_walk_stops_early_and_leaves_malformed_messages_to_protobuf() -> None:
    data = _typed_bytes(300_000).SerializeToString()
    assert 1024 < grpc_v2._parsed_bytes(data, stop_past=1024) <= len(data)
    for broken in (b"\xff" * 4096, b"\x0a", b"\x0f" * 10):  # a long varint, cut, a group
        assert grpc_v2._parsed_bytes(broken, stop_past=0) == 0
    many = b"\x3a\x00" * 5000  # 5,000 empty raw_input_contents: only their headers count
    assert grpc_v2._parsed_bytes(many, stop_past=len(many)) == len(many)


def test_a_grpc_message_parsed_past_max_json_bytes_is_left_unparsed() -> None:
    parse = grpc_v2._bounded_parse(LIMITS.max_json_bytes)
    within = _typed_bytes(CAP)  # 2 bytes each on the wire: 256 KiB
    assert parse(within.SerializeToString()) == within
    refused = parse(_typed_bytes(LIMITS.max_json_bytes // 2 + 1).SerializeToString())
    assert isinstance(refused, grpc_v2._Unparsed)
    assert f"more than max_json_bytes = {LIMITS.max_json_bytes}" in refused.reason
    raw = grpc_request("FP32", 4 * CAP, raw=True)  # 2 MiB of raw floats: parsed as one copy
    assert parse(raw.SerializeToString()) == raw
