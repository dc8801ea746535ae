"""The prediction cache across a rollout, on a real server (issue 44): a repeated input after
a model is rolled to a new version must be computed by the new version, not answered with the
old version's cached prediction."""

from __future__ import annotations

import pytest
from conftest import metric_value, model_state

from parityserve.client import Client

pytestmark = pytest.mark.integration

VECTOR = {"name": "input", "datatype": "FP32", "shape": [2]}


@pytest.fixture(scope="module")
def served(server_factory):
    # zoo:noop answers 0.0 to anything and zoo:echo its input: two versions whose
    # predictions for the same input differ.
    return server_factory({
        "server": {"http_port": 0, "cache_bytes": 1 << 20},
        "models": [{"name": "rolled", "source": "zoo:noop", "input": VECTOR, "replicas": 1}],
        "applications": [{"name": "rolled", "models": ["rolled"], "slo_ms": 5000,
                          "default_output": "DEFAULT"}],
    })


def test_a_repeated_input_after_a_rollout_is_answered_by_the_new_version(served) -> None:
    """Guards the cache key's version (ModelPath._key): with it ignored, the third answer
    below is version 1's 0.0 from the cache."""
    x = [3.0, 4.0]
    with Client(served.url) as client:
        first = client.predict("rolled", x)
        assert (first["output"], first["version"], first["default"]) == (0.0, 1, False)
        hits = metric_value(client, "parityserve_cache_hits_total", model="rolled")
        assert client.predict("rolled", x)["output"] == 0.0  # version 1 caches its answer
        assert metric_value(client, "parityserve_cache_hits_total", model="rolled") == hits + 1
        client.deploy({"name": "rolled", "source": "zoo:echo", "version": 2, "input": VECTOR,
                       "replicas": 1})
        assert model_state(client, "rolled")["version"] == 2
        after = client.predict("rolled", x)
        assert (after["output"], after["version"], after["default"]) == (x, 2, False), after
        again = client.predict("rolled", x)  # and version 2's answer is cached in its turn
        assert again["output"] == x
        assert metric_value(client, "parityserve_cache_hits_total", model="rolled") == hits + 2
