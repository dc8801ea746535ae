"""Hypothesis over the V2 binary framing: lying header lengths, truncated or mistyped tensors.

Pass condition: every request gets a 2xx or 4xx JSON answer (never 5xx, never a crash), and a
well-formed request afterwards still gets the right answer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient
from test_http_frontend import FakeSystem

from parityserve.runtime.frontend import http, v2
from parityserve.runtime.frontend.auth import AuthPolicy
from parityserve.runtime.modelpath.metrics import Metrics

_APP = http.create_app(FakeSystem(), metrics=Metrics(), auth=AuthPolicy(token="t" * 32),
                           max_body_bytes=4096)
_CLIENT = TestClient(_APP)
_URL = "/v2/models/double/infer"
_DATATYPES = st.sampled_from([*v2.DATATYPES, "FP128", "", "fp32"])


@st.composite
def _framed(draw: st.DrawFn) -> tuple[bytes, dict[str, str]]:
    rows = draw(st.integers(0, 3))
    shape = draw(st.sampled_from([[rows, 3], [rows], [rows, 3, 1], [-1, 3], []]))
    datatype = draw(_DATATYPES)
    raw = np.arange(rows * 3, dtype="<f4").tobytes()
    raw = raw[:draw(st.integers(0, len(raw)))] + draw(st.binary(max_size=8))
    size = draw(st.one_of(st.just(len(raw)), st.integers(-4, 64), st.text(max_size=3)))
    header = orjson.dumps({"inputs": [{"name": "x", "shape": shape, "datatype": datatype,
                                       "parameters": {"binary_data_size": size}}],
                           "outputs": [{"name": "y", "parameters": {
                               "binary_data": draw(st.booleans())}}]})
    lie = draw(st.one_of(st.just(str(len(header))),
                         st.integers(-10, len(header) + len(raw) + 10).map(str),
                         st.sampled_from(["", "abc", "1e3", " 12", "0x10", "99999999999"])))
    return header + raw, {v2.HEADER_LENGTH: lie, "content-type": "application/octet-stream"}


def _answer_is_json(response: Any) -> None:
    assert response.status_code < 500, (response.status_code, response.text)
    if response.status_code >= 400:
        assert set(response.json()) == {"error", "code"}


@settings(max_examples=400, deadline=None)
@given(_framed())
def test_lying_framing_gets_a_4xx_never_a_5xx(request: tuple[bytes, dict[str, str]]) -> None:
    body, headers = request
    _answer_is_json(_CLIENT.post(_URL, content=body, headers=headers))


def test_the_server_still_answers_correctly_after_fuzzing() -> None:
    test_lying_framing_gets_a_4xx_never_a_5xx()
    batch = np.arange(6, dtype=np.float32).reshape(2, 3)
    body, headers = v2.encode_infer_request([("x", batch)], binary=True)
    response = _CLIENT.post(_URL, content=body, headers=headers)
    assert response.status_code == 200, response.text
    out = v2.decode_infer_response(response.content,
                                   int(response.headers.get(v2.HEADER_LENGTH, 0)) or None)
    np.testing.assert_array_equal(out["y"], batch * 2)
