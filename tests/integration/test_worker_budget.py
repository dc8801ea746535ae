"""server.max_local_workers: no admin request may start more worker processes than allowed."""

from __future__ import annotations

import httpx
import pytest

from parityserve.client import Client
from parityserve.errors import LimitExceeded

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(server_factory):
    return server_factory({
        "server": {"http_port": 0, "max_local_workers": 2},
        "models": [{"name": "noop", "source": "zoo:noop", "replicas": 1}],
    })


def _models(client: Client) -> dict[str, int]:
    return {m["name"]: len(m["replicas"]) for m in client.state()["models"]}


def test_a_deploy_past_the_budget_is_refused_and_starts_nothing(server):
    with Client(server.url, token=server.token) as client:
        with pytest.raises(LimitExceeded, match="max_local_workers = 2"):
            client.deploy({"name": "big", "source": "zoo:noop", "replicas": 2})
        assert "big" not in _models(client)


def test_scaling_past_the_budget_is_refused_and_within_it_works(server):
    with Client(server.url, token=server.token) as client:
        with pytest.raises(LimitExceeded, match="would need 3 worker processes"):
            client.set_replicas("noop", 3)
        assert _models(client)["noop"] == 1
        client.set_replicas("noop", 2)
        assert _models(client)["noop"] == 2
        client.set_replicas("noop", 1)


def test_the_refusal_is_a_400_with_its_own_code(server):
    response = httpx.post(server.url + "/admin/models/noop/replicas", json={"replicas": 256},
                          headers={"Authorization": f"Bearer {server.token}"})
    assert response.status_code == 400
    assert response.json()["code"] == "limit_exceeded"
