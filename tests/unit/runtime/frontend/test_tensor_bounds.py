"""Issue 38: a tensor's shape never sizes anything before the data that fills it is counted.

A V2 header says a shape before its data; a 150-byte request whose BYTES shape said 2**32
elements made the frontend build that many object pointers before reading its 4 data bytes
(8 GiB touched for [256, 4194304], a 500 with numpy's text for [1024, 4194304]). Each case
here is decoded the way its edge decodes it (the V2 codec for HTTP JSON and binary,
``grpc_v2._decoded`` for gRPC) under ``tracemalloc``: it is refused with a 4xx error that
names the bound, and what the refusal held at once is bounded by the body (its JSON header
parsed, plus a few times its size), never by the shape.
"""

from __future__ import annotations

import struct
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import pytest
from tritonclient.grpc import service_pb2 as pb

from parityserve.config import Limits
from parityserve.core.inputs import check_raw_size, element_count
from parityserve.errors import InvalidInput, LimitExceeded, MalformedRequest, RequestError
from parityserve.runtime.frontend import grpc_v2, v2

LIMITS = Limits()
# The shape-against-data checks, with the request's element cap (which refuses most of these
# shapes first at its default: tests/unit/runtime/frontend/test_request_elements.py) raised out of
# their way.
UNCAPPED = Limits(max_request_elements=2**62, max_json_bytes=2**62)
HUGE = [1024, 4194304]  # 2**32 elements: within max_batch_items and max_input_elements
MANY_DIMS = [0] + [2**62] * 20_000  # a product with 20,000 factors of 2**62


def binary_body(datatype: str, shape: list[int], data: bytes) -> tuple[bytes, int]:
    head = orjson.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": shape,
                                     "parameters": {"binary_data_size": len(data)}}]})
    return head + data, len(head)


def json_body(datatype: str, shape: list[int], data: Any) -> tuple[bytes, None]:
    return orjson.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": shape,
                                     "data": data}]}), None


def grpc_request(datatype: str, shape: list[int], raw: bytes | None = None,
                 contents: tuple[str, list[Any]] | None = None) -> Any:
    tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype=datatype, shape=shape)
    if contents is not None:
        getattr(tensor.contents, contents[0]).extend(contents[1])
    return pb.ModelInferRequest(model_name="m", inputs=[tensor],
                                raw_input_contents=[] if raw is None else [raw])


def peak_of(call: Callable[[], Any]) -> tuple[BaseException | None, int]:
    """What ``call`` raised, and the most memory it held at once (bytes, via tracemalloc)."""
    tracemalloc.start()
    try:
        call()
        error = None
    except BaseException as exc:  # noqa: BLE001 - a MemoryError is what today's code raises
        error = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return error, peak


# ---- the pure checks (core/inputs.py) -----------------------------------------------------------


@pytest.mark.parametrize(("shape", "error", "words"), [
    ([1] * 33, InvalidInput, "has 33 dimensions, more than 32"),
    ([0] + [2**62] * 200_000, InvalidInput, "has 200001 dimensions, more than 32"),
    ([3, -1], InvalidInput, "shape [3, -1] has a negative size"),
    ([1025, 1], LimitExceeded, "has 1025 rows, more than max_batch_items = 1024"),
    ([1, 4194305], LimitExceeded, "4194305 values per row, more than max_input_elements"),
    ([0, 2**62, 2**62], LimitExceeded, f"{2**124} values per row"),  # past int64: 0 rows
])
def test_a_shape_is_refused_from_its_numbers_alone(shape: list[int], error: type,
                                                   words: str) -> None:
    raised, peak = peak_of(lambda: element_count("x", shape, max_dims=32, max_rows=1024,
                                                 max_per_row=4194304))
    assert isinstance(raised, error) and words in str(raised), repr(raised)
    assert peak < 16 * 1024  # the message, nothing the shape sized


@pytest.mark.parametrize(("shape", "count"), [
    ([], 1), ([0, 4194304], 0), ([3], 3), ([1024, 4194304], 2**32), ([2, 3, 4], 24)])
def test_a_shape_within_the_limits_counts_its_elements(shape: list[int], count: int) -> None:
    assert element_count("x", shape, max_dims=32, max_rows=1024, max_per_row=4194304) == count
    assert element_count("x", shape, max_dims=32) == count


def test_raw_data_must_hold_what_the_shape_claims() -> None:
    raised, peak = peak_of(lambda: check_raw_size("x", "BYTES", HUGE, 2**32, None, 4))
    assert isinstance(raised, InvalidInput) and peak < 16 * 1024
    assert "shape [1024, 4194304] of BYTES needs at least 17179869184 bytes" in str(raised)
    check_raw_size("x", "BYTES", [3], 3, None, 12)  # three empty strings: just enough
    check_raw_size("x", "FP32", [3], 3, 4, 12)
    for size in (11, 13):  # numbers need exactly their bytes
        with pytest.raises(InvalidInput, match="11 bytes of data|13 bytes of data"):
            check_raw_size("x", "FP32", [3], 3, 4, size)


# ---- each edge, decoding as it does ---------------------------------------------------------

LONG_STRING = ["x" * 1_000_000] + ["y"] * 100_000  # numpy would make a <U1000000 of 100,001

# case -> (an HTTP body or a gRPC request, the error, words the message must hold)
REFUSED: dict[str, tuple[Any, type[Exception], str]] = {}
for _shape in (HUGE, [4, 1048576]):
    _need = f"needs at least {4 * int(np.prod(_shape))} bytes (4 per element), got 4"
    REFUSED[f"http binary BYTES {_shape}"] = (binary_body("BYTES", _shape, b"\0" * 4),
                                              InvalidInput, _need)
    REFUSED[f"grpc raw BYTES {_shape}"] = (grpc_request("BYTES", _shape, b"\0" * 4),
                                           InvalidInput, _need)
REFUSED["http binary FP32 huge"] = (binary_body("FP32", HUGE, b"\0" * 4), InvalidInput,
                                    "needs 17179869184")
REFUSED["grpc raw FP32 huge"] = (grpc_request("FP32", HUGE, b"\0" * 4), InvalidInput,
                                 "needs 17179869184")
REFUSED["grpc typed BYTES huge"] = (
    grpc_request("BYTES", HUGE, contents=("bytes_contents", [b"ab"])), InvalidInput,
    "needs 4294967296 values")
for _datatype, _data in (("BYTES", ["abcd"]), ("FP32", [1.0])):
    REFUSED[f"http json {_datatype} huge"] = (
        json_body(_datatype, HUGE, _data), InvalidInput,
        "has 1 elements, but shape [1024, 4194304] needs 4294967296")
REFUSED["http json FP32 of strings, one long"] = (
    json_body("FP32", [1, len(LONG_STRING)], LONG_STRING), InvalidInput,
    "FP32 data takes only numbers, got strings")
for _datatype in ("BYTES", "FP32"):
    _many = "has 20001 dimensions, more than 32"
    REFUSED[f"http json {_datatype} 20,001 dims"] = (json_body(_datatype, MANY_DIMS, []),
                                                     InvalidInput, _many)
    REFUSED[f"http binary {_datatype} 20,001 dims"] = (binary_body(_datatype, MANY_DIMS, b""),
                                                       InvalidInput, _many)
    REFUSED[f"grpc {_datatype} 20,001 dims"] = (grpc_request(_datatype, MANY_DIMS, b""),
                                                InvalidInput, _many)
    _past = "values per row, more than max_input_elements = 4194304"  # past int64, too
    REFUSED[f"http binary {_datatype} past int64"] = (
        binary_body(_datatype, [0, 2**62, 2**62], b""), LimitExceeded, _past)
    REFUSED[f"grpc {_datatype} past int64"] = (
        grpc_request(_datatype, [0, 2**62, 2**62], b""), LimitExceeded, _past)
    REFUSED[f"http {_datatype} negative dim"] = (
        binary_body(_datatype, [2, -4], b""), MalformedRequest,
        "'shape' must be a list of non-negative integers")
    REFUSED[f"grpc {_datatype} negative dim"] = (
        grpc_request(_datatype, [-1, 4194304], b"\0" * 4), InvalidInput, "has a negative size")


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_huge_shape_is_refused_before_anything_is_allocated(case: str) -> None:
    sent, error, words = REFUSED[case]
    if isinstance(sent, tuple):  # an HTTP body: what parsing its JSON header alone holds
        body, length = sent
        _, parsed = peak_of(lambda: orjson.loads(body[:length]))
        size = len(body)
        raised, peak = peak_of(lambda: v2.decode_infer_request(body, length, UNCAPPED))
    else:  # a gRPC request arrives parsed
        parsed, size = 0, sent.ByteSize()
        raised, peak = peak_of(lambda: grpc_v2._decoded(sent, UNCAPPED))
    assert isinstance(raised, error), repr(raised)
    assert isinstance(raised, RequestError)  # a 4xx, never a 500 with numpy's text
    assert words in str(raised), str(raised)
    # Held at once: the parsed header, then a few times the body, never the shape's size.
    assert peak <= parsed + 8 * size + 64 * 1024, f"{peak} bytes held for a {size}-byte body"


@pytest.mark.parametrize("route", ["http binary", "grpc raw"])
def test_zero_rows_of_a_wide_shape_decode_to_an_empty_array(route: str) -> None:
    shape = [0, 4194304]
    if route == "http binary":
        array = v2.decode_infer_request(*binary_body("BYTES", shape, b""), LIMITS).inputs[0].array
    else:
        array = grpc_v2._decoded(grpc_request("BYTES", shape, b""), LIMITS).tensors[0][1]
    assert array.shape == (0, 4194304) and array.size == 0


def test_bytes_elements_that_fit_their_data_still_decode() -> None:
    raw = b"".join(struct.pack("<I", len(s)) + s for s in (b"ab", b"", b"cde", b"f"))
    array = v2.decode_infer_request(*binary_body("BYTES", [2, 2], raw), LIMITS).inputs[0].array
    assert array.tolist() == [[b"ab", b""], [b"cde", b"f"]]
    empties = v2.decode_infer_request(*binary_body("BYTES", [1, 3], b"\0" * 12),
                                      LIMITS).inputs[0].array
    assert empties.tolist() == [[b"", b"", b""]]  # 4 bytes per element is exactly enough

