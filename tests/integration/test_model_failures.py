"""User models that misbehave get a clear answer and never take the worker down."""

from __future__ import annotations

from pathlib import Path

import pytest

from parityserve.client import Client

pytestmark = pytest.mark.integration

MODELS = '''
class Unsendable:
    """Returns Python objects that cannot cross the process boundary."""
    def predict(self, batch):
        return [object() for _ in batch]


class Raises:
    def predict(self, batch):
        raise RuntimeError("weights are garbage")


class WrongCount:
    def predict(self, batch):
        return [0] * (len(batch) + 1)
'''


def test_misbehaving_models_answer_with_the_default_and_keep_serving(tmp_path: Path) -> None:
    from conftest import start_server

    (tmp_path / "weird_models.py").write_text(MODELS)
    names = ["Unsendable", "Raises", "WrongCount"]
    config = {
        "server": {"http_port": 0},
        "models": [{"name": n.lower(), "source": f"python:weird_models:{n}", "replicas": 1}
                   for n in names],
        "applications": [{"name": n.lower(), "models": [n.lower()], "slo_ms": 5000,
                          "default_output": "fallback"} for n in names],
    }
    server = start_server(config, tmp_path)
    try:
        with Client(server.url) as client:
            pids = {m["name"]: m["replicas"][0]["pid"] for m in client.state()["models"]}
            expected = {"unsendable": "cannot be sent", "raises": "weights are garbage",
                        "wrongcount": "returned 2 outputs for 1 queries"}
            for app, reason in expected.items():
                for _ in range(2):  # twice: the worker survived the first failure
                    answer = client.predict(app, [1.0])
                    assert answer["default"] is True and answer["output"] == "fallback"
                    assert reason in answer["default_explanation"]
            after = {m["name"]: m["replicas"][0]["pid"] for m in client.state()["models"]}
            assert after == pids  # no worker was restarted
    finally:
        server.stop()
