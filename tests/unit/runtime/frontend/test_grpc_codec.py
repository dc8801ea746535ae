"""The gRPC service's pure parts: status codes for our errors, versions, typed contents."""

from __future__ import annotations

import asyncio
import logging
import re

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
from parityserve.runtime.frontend import grpc_v2, v2
from parityserve.runtime.frontend.grpc_v2 import peer_host


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
    array = grpc_v2._from_contents(_tensor(datatype, [1, 2], field, values), (1, 2), 2)
    assert array.dtype == dtype and array.shape == (1, 2)
    np.testing.assert_array_equal(array.reshape(-1), np.array(values, dtype=dtype))


def test_a_value_that_does_not_fit_its_datatype_is_refused_not_wrapped() -> None:
    with pytest.raises(InvalidInput, match=r"values must fit INT8 \[-128, 127\], got 0..300"):
        grpc_v2._from_contents(_tensor("INT8", [2], "int_contents", [0, 300]), (2,), 2)


def test_fp16_has_no_typed_contents() -> None:
    with pytest.raises(InvalidInput, match="FP16 has no typed contents"):
        grpc_v2._from_contents(_tensor("FP16", [1], "fp32_contents", [1.0]), (1,), 1)


def test_rows_and_values_per_row_are_limited() -> None:
    # One check of a shape for HTTP and gRPC (v2.tensor_count), before any data is read.
    limits = Limits(max_batch_items=4, max_input_elements=10)
    assert v2.tensor_count("x", (4, 10), limits) == 40
    with pytest.raises(LimitExceeded, match="5 rows, more than max_batch_items = 4"):
        v2.tensor_count("x", (5, 10), limits)
    with pytest.raises(LimitExceeded, match="11 values per row"):
        v2.tensor_count("x", (1, 11), limits)


class _Aborted(Exception):
    """What grpc.aio's ``context.abort`` raises, in the fake."""


class _Context:
    def __init__(self) -> None:
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def invocation_metadata(self) -> tuple:
        return ()

    def set_trailing_metadata(self, metadata: tuple) -> None:
        pass

    def time_remaining(self) -> float | None:
        return None  # the call set no deadline

    def peer(self) -> str:
        return "ipv4:127.0.0.1:50000"

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise _Aborted(details)


class _System:
    """Its metadata lookup raises what it is given."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def model_metadata(self, name: str, version: int | None) -> None:
        raise self.error


def _metadata_call(error: Exception) -> tuple[grpc.StatusCode, str]:
    from parityserve.runtime.frontend.auth import AuthPolicy

    frontend = grpc_v2.GrpcFrontend(_System(error), auth=AuthPolicy.open(),
                                    limits=Limits(), version="test")
    context = _Context()
    with pytest.raises(_Aborted):
        asyncio.run(frontend.ModelMetadata(pb.ModelMetadataRequest(name="m"), context))
    assert context.aborted is not None
    return context.aborted


def test_an_unexpected_error_answers_internal_with_an_id_never_its_text(caplog) -> None:
    secret = RuntimeError("cannot open /srv/models/m/weights.pt: token=abc123")
    with caplog.at_level(logging.ERROR, logger="parityserve.runtime.frontend.grpc_v2"):
        code, details = _metadata_call(secret)
    assert code == grpc.StatusCode.INTERNAL
    assert "weights" not in details and "abc123" not in details
    error_id = re.fullmatch(r"internal server error \(error id ([0-9a-f]{16})\)", details)
    assert error_id, details
    logged = [r for r in caplog.records if error_id.group(1) in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info and logged[0].exc_info[1] is secret


def test_an_expected_error_keeps_its_clear_message() -> None:
    code, details = _metadata_call(InvalidInput("input 'x': expected shape [-1, 4]"))
    assert (code, details) == (grpc.StatusCode.INVALID_ARGUMENT,
                               "input 'x': expected shape [-1, 4]")


@pytest.mark.parametrize(("peer", "host"), [
    ("ipv4:127.0.0.1:50000", "127.0.0.1"), ("ipv6:[::1]:50000", "::1"),
    ("ipv6:[2001:db8::7]:443", "2001:db8::7"), ("ipv6:%5B::1%5D:50000", "::1"),
    ("ipv6:%5B2001:db8::7%5D:443", "2001:db8::7"), ("unix:/tmp/grpc.sock", "/tmp/grpc.sock"),
    ("unix-abstract:name", "name"), ("", "")])
def test_a_grpc_peer_is_its_host_as_http_names_it(peer: str, host: str) -> None:
    """One address, one share of a graph over both edges: gRPC's peer string gives the host
    HTTP's ``request.client.host`` gives (the port is not part of who the client is)."""
    assert peer_host(peer) == host
