"""A web page cannot drive or read the admin API, even an open one on loopback.

The requests are the ones a browser sends for a hostile page, made here with httpx against a
real ``parityserve start`` subprocess with ``require_admin_token: false`` (which the README
allows on loopback): a cross-site ``text/plain`` form post, and a DNS-rebound read (the
page's own name in ``Host``). Ordinary clients (tritonclient, httpx, ``parityserve.Client``)
must be served as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest
from conftest import cli_server, model_state

from parityserve.client import Client

pytestmark = pytest.mark.integration

REPLICAS = "/admin/models/noop/replicas"
EVIL = "http://evil.example"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = {"server": {"http_port": 0, "grpc_port": 0, "require_admin_token": False,
                         "cache_bytes": 0},
              "models": [{"name": "noop", "source": "zoo:noop", "replicas": 1}]}
    with cli_server(tmp_path_factory.mktemp("browser"), config) as (served, _):
        yield served


def _replicas(url: str) -> int:
    with Client(url, token="unused") as client:
        return sum(r["pool"] == "data" for r in model_state(client, "noop")["replicas"])


def _error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    assert response.json()["code"] == code
    return str(response.json()["error"])


def test_a_cross_site_text_plain_form_post_changes_nothing(url: str) -> None:
    # What <form method=post enctype=text/plain> on evil.example sends: a simple request,
    # so the browser sends it without asking (no CORS preflight).
    response = httpx.post(url + REPLICAS, content=b'{"replicas": 3}',
                          headers={"Content-Type": "text/plain", "Origin": EVIL})
    assert response.status_code in (403, 415), response.text
    assert _replicas(url) == 1


def test_a_cross_origin_admin_request_is_403_whatever_its_body(url: str) -> None:
    message = _error(httpx.post(url + REPLICAS, json={"replicas": 3},
                                headers={"Origin": EVIL}), 403, "cross_origin")
    assert EVIL in message
    for origin in ("null", "http://localhost:1", url.replace("http://", "https://")):
        response = httpx.get(url + "/admin/state", headers={"Origin": origin})
        _error(response, 403, "cross_origin")
    assert _replicas(url) == 1


def test_an_admin_body_that_is_not_json_is_415(url: str) -> None:
    for content_type in ("text/plain", "application/x-www-form-urlencoded",
                         "multipart/form-data; boundary=x", None):
        headers = {"Content-Type": content_type} if content_type else {}
        response = httpx.post(url + REPLICAS, content=b'{"replicas": 3}', headers=headers)
        assert "application/json" in _error(response, 415, "unsupported_media_type")
    assert _replicas(url) == 1


INFER = {"inputs": [{"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}


@pytest.mark.parametrize("method,path", [
    ("GET", "/admin/state"), ("GET", "/v2/health/ready"), ("GET", "/v2/models/noop"),
    ("POST", "/v2/models/noop/infer"),  # a hot route, served without Starlette
])
def test_a_dns_rebound_request_is_421_on_every_route(url: str, method: str, path: str) -> None:
    port = urlsplit(url).port
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example"):
        response = httpx.request(method, url + path, headers={"Host": host},
                                 json=INFER if method == "POST" else None)
        message = _error(response, 421, "host_not_allowed")
        assert "server.allowed_hosts" in message


def test_ordinary_clients_are_served(url: str) -> None:
    port = urlsplit(url).port
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", "LOCALHOST."):
        assert httpx.get(url + "/admin/state", headers={"Host": host}).status_code == 200
    same_origin = httpx.post(url + REPLICAS, json={"replicas": 1},  # a page it served itself
                             headers={"Origin": f"http://127.0.0.1:{port}"})
    assert same_origin.status_code == 200, same_origin.text
    with Client(url, token="unused") as client:
        assert client.set_replicas("noop", 1)["replicas"] == 1
        out = client.infer("noop", np.ones((2, 3), dtype=np.float32))
        assert np.asarray(out).shape[0] == 2
    tritonclient = pytest.importorskip("tritonclient.http")
    triton = tritonclient.InferenceServerClient(urlsplit(url).netloc)
    try:
        assert triton.is_server_live() and triton.is_server_ready()
        tensor = tritonclient.InferInput("input", [2, 3], "FP32")
        tensor.set_data_from_numpy(np.ones((2, 3), dtype=np.float32))
        assert triton.infer("noop", [tensor]).as_numpy("output").shape[0] == 2
    finally:
        triton.close()
