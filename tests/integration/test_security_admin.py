"""Walking through the admin doors of a real server: no token, a wrong token, the right one.

Also the separate admin listener and TLS (a self-signed certificate made here with trustme),
through real sockets. Servers here deploy no models, so no worker processes are started.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import httpx
import pytest

from parityserve.client import Client
from parityserve.errors import Unauthorized
from parityserve.runtime.frontend import auth

pytestmark = pytest.mark.integration

EXPLOIT = {"name": "x", "source": "python:subprocess:Popen", "replicas": 1}
ADMIN_ROUTES = [
    ("GET", "/admin/state"),
    ("POST", "/admin/applications"),
    ("DELETE", "/admin/applications/calc"),
    ("POST", "/admin/applications/calc/models"),
    ("POST", "/admin/models"),
    ("POST", "/admin/models/m/replicas"),
    ("POST", "/admin/models/m/faults"),
    ("POST", "/admin/models/m/redundancy"),
    ("POST", "/admin/models/m/parallelism"),
    ("POST", "/admin/models/m/threads"),
    ("POST", "/admin/graphs/g/faults"),
    ("GET", "/admin/graphs/g/digests"),
]


@pytest.fixture(scope="module")
def server(server_factory):
    return server_factory({"server": {"http_port": 0}})


def _state(url: str, **kwargs) -> dict:
    with Client(url, **kwargs) as client:
        return client.state()


def _exploit(marker: Path) -> dict:
    return {**EXPLOIT, "options": {"args": ["touch", str(marker)]}}


def test_the_token_file_is_where_clients_look(server):
    assert server.token and server.auth.source in ("generated", "file")
    assert auth.read_token(auth.default_token_file()) == server.token
    assert Path(os.environ["PARITYSERVE_HOME"]) in server.auth.path.parents


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": "Basic Zm9vOmJhcg=="}])
def test_the_exploit_without_the_right_token_is_401_and_runs_nothing(server, tmp_path, headers):
    marker = tmp_path / "marker"
    response = httpx.post(server.url + "/admin/models", json=_exploit(marker), headers=headers)
    assert response.status_code == 401, response.text
    assert response.json()["code"] == "unauthorized"
    assert response.headers["www-authenticate"] == "Bearer"
    assert not marker.exists()
    state = _state(server.url)
    assert [m["name"] for m in state["models"]] == []


@pytest.mark.parametrize("method,path", ADMIN_ROUTES)
def test_every_admin_route_needs_the_token(server, method, path):
    response = httpx.request(method, server.url + path, json={})
    assert response.status_code == 401, (method, path, response.text)
    assert response.json()["code"] == "unauthorized"


def test_with_the_token_admin_state_works(server):
    response = httpx.get(server.url + "/admin/state",
                         headers={"Authorization": f"Bearer {server.token}"})
    assert response.status_code == 200 and "models" in response.json()


def test_client_without_a_token_says_where_it_looked(server, monkeypatch, tmp_path):
    monkeypatch.setenv("PARITYSERVE_HOME", str(tmp_path))  # an empty home: no token file
    with pytest.raises(Unauthorized) as caught:
        _state(server.url)
    message = str(caught.value)
    assert "PARITYSERVE_ADMIN_TOKEN" in message and str(tmp_path / "admin-token") in message
    with pytest.raises(Unauthorized):
        _state(server.url, token="wrong")
    assert "models" in _state(server.url, token=server.token)


def test_open_admin_on_loopback_serves_without_a_token(server_factory):
    opened = server_factory({"server": {"http_port": 0, "require_admin_token": False}})
    assert opened.token is None
    assert httpx.get(opened.url + "/admin/state").status_code == 200


def test_separate_admin_listener(server_factory):
    split = server_factory({"server": {"http_port": 0, "admin_host": "127.0.0.1",
                                       "admin_port": 0}})
    assert split.admin_url != split.url
    bearer = {"Authorization": f"Bearer {split.token}"}
    main = httpx.get(split.url + "/admin/state", headers=bearer)
    assert main.status_code == 404 and main.json()["code"] == "not_found"
    assert httpx.get(split.admin_url + "/admin/state").status_code == 401
    assert httpx.get(split.admin_url + "/admin/state", headers=bearer).status_code == 200
    assert httpx.get(split.url + "/v2/health/live").status_code == 200
    assert "models" in _state(split.url, admin_url=split.admin_url)
    assert f"admin state         {split.admin_url}/admin/state" in \
        split.urls.describe(split.config)


def test_tls_serves_https_and_refuses_plain_http(server_factory, tmp_path):
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "server.key"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    served = server_factory({"server": {
        "http_port": 0, "admin_host": "127.0.0.1", "admin_port": 0,
        "tls": {"cert": str(tmp_path / "server.pem"), "key": str(tmp_path / "server.key")}}})
    assert served.url.startswith("https://") and served.admin_url.startswith("https://")
    with Client(served.url, admin_url=served.admin_url, verify=str(tmp_path / "ca.pem")) as c:
        assert c.live()  # real HTTPS requests, verified against the test's CA
        assert "models" in c.state()
    with pytest.raises(Unauthorized):
        _state(served.url, admin_url=served.admin_url, token="wrong",
               verify=str(tmp_path / "ca.pem"))
    with pytest.raises(httpx.ConnectError):  # unknown CA: refused by the client
        httpx.get(served.url + "/v2/health/live")
    plain = served.url.replace("https://", "http://")
    with pytest.raises(httpx.TransportError):  # TLS port: plain HTTP gets no HTTP answer
        httpx.get(plain + "/v2/health/live")
    ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    assert httpx.get(served.url + "/v2/health/live", verify=ctx).status_code == 200
