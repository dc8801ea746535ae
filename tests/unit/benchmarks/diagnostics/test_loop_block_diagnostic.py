"""The event-loop block diagnostic (benchmarks/diagnostics/loop_block.py): the requests its
"shipped limits" rows send are the largest each route accepts, so its table is about the
defaults and not about a refusal; decoded in-process here as the frontend decodes them."""

from __future__ import annotations

import orjson
import pytest
from tritonclient.grpc import service_pb2 as pb

from benchmarks.diagnostics import loop_block as diagnostic
from parityserve.config import Limits, Server
from parityserve.core.inputs import scan
from parityserve.runtime.frontend import clipper, grpc_v2, v2

LIMITS, MAX_BODY = Limits(), Server().max_body_bytes
LARGEST = diagnostic.largest_accepted(LIMITS, MAX_BODY)


def _values(body: bytes) -> int:
    leaves = scan(orjson.loads(body), max_depth=99, max_elements=2**62)
    return leaves.count + leaves.containers


@pytest.mark.parametrize("route", sorted(LARGEST))
def test_the_largest_requests_are_within_the_limits(route: str) -> None:
    request = diagnostic.ROUTES[route](LARGEST[route], 1)
    assert len(request.body) <= MAX_BODY
    if request.path == "grpc":
        parsed = grpc_v2._bounded_parse(LIMITS.max_json_bytes)(request.body)
        assert isinstance(parsed, pb.ModelInferRequest), parsed
        assert grpc_v2._decoded(parsed, LIMITS).tensors[0][1].size == LARGEST[route]
    elif request.path.startswith("/v2/"):
        length = request.headers.get(v2.HEADER_LENGTH)
        decoded = v2.decode_infer_request(request.body, None if length is None else int(length),
                                          LIMITS)
        assert decoded.inputs[0].array.size == LARGEST[route]
    else:  # a Clipper or graph body: every JSON value counts
        assert len(request.body) <= LIMITS.max_json_bytes
        clipper.check_body(orjson.loads(request.body), LIMITS)
        assert _values(request.body) <= LIMITS.max_request_elements


@pytest.mark.parametrize("route", sorted(diagnostic.worst_refused(LIMITS, MAX_BODY)))
def test_the_costliest_refusals_fit_their_size_limit_and_are_refused(route: str) -> None:
    n = diagnostic.worst_refused(LIMITS, MAX_BODY)[route]
    request = diagnostic.ROUTES[route](n, 1)
    limit = MAX_BODY if "binary" in route or "grpc" in route else LIMITS.max_json_bytes
    assert len(request.body) <= limit
    assert n > LIMITS.max_request_elements // 2  # past the cap, lists counted
