"""The gRPC service's pure parts: status codes for our errors, versions, typed contents."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from parityserve.config import Limits
from parityserve.errors import (
    DeadlineExceeded,
    InvalidInput,
    LimitExceeded,
    MalformedRequest,
    Overloaded,
    QueueFull,
    Unauthorized,
    Unavailable,
    UnknownModel,
)
from parityserve.runtime import grpc_v2


@pytest.mark.parametrize(("error", "code"), [
    (Overloaded("busy", model="m", depth=3, retry_after_s=1.0),
     grpc.StatusCode.RESOURCE_EXHAUSTED),
    (QueueFull("full"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (LimitExceeded("too many"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (UnknownModel("nope"), grpc.StatusCode.NOT_FOUND),
    (InvalidInput("bad"), grpc.StatusCode.INVALID_ARGUMENT),
    (MalformedRequest("bad"), grpc.StatusCode.INVALID_ARGUMENT),
    (Unavailable("none"), grpc.StatusCode.UNAVAILABLE),
    (DeadlineExceeded("late"), grpc.StatusCode.DEADLINE_EXCEEDED),
    (Unauthorized("who"), grpc.StatusCode.UNAUTHENTICATED),
    (RuntimeError("bug"), grpc.StatusCode.INTERNAL),
])
def test_each_error_has_its_status_code(error, code) -> None:
    assert grpc_v2.status_for(error) == code


@pytest.mark.parametrize("raw", ["0", "-1", "abc", "²", "٣", "1.0"])
def test_versions_are_positive_ascii_integers(raw) -> None:
    with pytest.raises(UnknownModel, match="versions are positive integers"):
        grpc_v2._version(raw)


def test_an_empty_version_is_the_latest() -> None:
    assert grpc_v2._version("") is None and grpc_v2._version("7") == 7


def _tensor(datatype: str, shape: list[int], field: str, values: list) -> pb.ModelInferRequest:
    tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype=datatype, shape=shape)
    getattr(tensor.contents, field).extend(values)
    return tensor


@pytest.mark.parametrize(("datatype", "field", "values", "dtype"), [
    ("FP32", "fp32_contents", [1.5, -2.0], np.float32),
    ("FP64", "fp64_contents", [1.5, -2.0], np.float64),
    ("INT8", "int_contents", [-128, 127], np.int8),
    ("UINT64", "uint64_contents", [0, 2**63], np.uint64),
    ("BOOL", "bool_contents", [True, False], np.bool_),
])
def test_typed_contents_become_arrays_of_their_datatype(datatype, field, values, dtype) -> None:
    array = grpc_v2._from_contents(_tensor(datatype, [1, 2], field, values), (1, 2))
    assert array.dtype == dtype and array.shape == (1, 2)
    np.testing.assert_array_equal(array.reshape(-1), np.array(values, dtype=dtype))


def test_a_value_that_does_not_fit_its_datatype_is_refused_not_wrapped() -> None:
    with pytest.raises(InvalidInput, match=r"values must fit INT8 \[-128, 127\], got 0..300"):
        grpc_v2._from_contents(_tensor("INT8", [2], "int_contents", [0, 300]), (2,))


def test_fp16_has_no_typed_contents() -> None:
    with pytest.raises(InvalidInput, match="FP16 has no typed contents"):
        grpc_v2._from_contents(_tensor("FP16", [1], "fp32_contents", [1.0]), (1,))


def test_rows_and_values_per_row_are_limited() -> None:
    limits = Limits(max_batch_items=4, max_input_elements=10)
    grpc_v2._check_limits("x", (4, 10), limits)
    with pytest.raises(LimitExceeded, match="5 rows, more than max_batch_items = 4"):
        grpc_v2._check_limits("x", (5, 10), limits)
    with pytest.raises(LimitExceeded, match="11 values per row"):
        grpc_v2._check_limits("x", (1, 11), limits)
