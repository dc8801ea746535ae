"""The Python client turns a shed query (429 or 503, code "overloaded") into Overloaded."""

from __future__ import annotations

import httpx
import orjson
import pytest

from parityserve.client import Client
from parityserve.errors import Overloaded, RequestError, ServiceError


def _client(status: int, body: bytes, headers: dict[str, str]) -> Client:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body, headers=headers)

    return Client("http://test", http=httpx.Client(transport=httpx.MockTransport(answer)))


@pytest.mark.parametrize("status", [429, 503])
def test_a_shed_query_raises_overloaded_with_model_depth_and_retry_after(status: int) -> None:
    body = orjson.dumps({"error": "model 'm' is overloaded", "code": "overloaded",
                         "model": "m", "queue_depth": 12, "retry_after_s": 3})
    client = _client(status, body, {"Retry-After": "3", "content-type": "application/json"})
    with pytest.raises(Overloaded, match="overloaded") as caught:
        client.predict("app", [1.0])
    assert (caught.value.model, caught.value.depth, caught.value.retry_after_s) == ("m", 12, 3.0)
    assert isinstance(caught.value, ServiceError) and not isinstance(caught.value, RequestError)


def test_an_overloaded_answer_without_details_still_raises_overloaded() -> None:
    body = orjson.dumps({"error": "busy", "code": "overloaded"})
    with pytest.raises(Overloaded) as caught:
        _client(429, body, {"Retry-After": "soon"}).predict("app", [1.0])
    assert (caught.value.model, caught.value.depth, caught.value.retry_after_s) == ("", 0, 1.0)
