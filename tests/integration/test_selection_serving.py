"""The selection layer through a real server: three scikit-learn digits models, one degraded."""

from __future__ import annotations

import os
from pathlib import Path

import joblib
import numpy as np
import pytest

from parityserve.client import Client
from parityserve.errors import InvalidInput, UnknownQuery
from tests.integration.conftest import metric_value

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def three_models(tmp_path_factory: pytest.TempPathFactory, digits_data) -> list[Path]:
    """Three digits classifiers of different quality, saved with joblib."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.naive_bayes import GaussianNB
    from sklearn.tree import DecisionTreeClassifier

    x_train, y_train = digits_data[0], digits_data[1]
    folder = tmp_path_factory.mktemp("three")
    makers = {"logreg": lambda: LogisticRegression(max_iter=2000),
              "tree": lambda: DecisionTreeClassifier(max_depth=8, random_state=0),
              "bayes": GaussianNB}
    paths = []
    for name, make in makers.items():
        path = folder / f"{name}.joblib"
        joblib.dump(make().fit(x_train, y_train), path)
        paths.append(path)
    return paths


def _config(paths: list[Path], *, store: str = "memory", degraded: str | None = None,
            policy: str = "exp4", threshold: float | None = None) -> dict:
    models = []
    for path in paths:
        deployment = {"name": path.stem, "source": f"sklearn:{path}", "replicas": 1}
        if path.stem == degraded:
            deployment["faults"] = {"all": {"wrong_probability": 1.0, "wrong_kind": "labels",
                                            "seed": 3}}
        models.append(deployment)
    app = {"name": "digits", "models": [p.stem for p in paths], "slo_ms": 3000,
           "default_output": -1, "policy": policy, "policy_options": {"eta": 1.0}}
    if threshold is not None:
        app["confidence_threshold"] = threshold
    return {"server": {"http_port": 0, "state_store": store, "cache_bytes": 0},
            "models": models, "applications": [app]}


def _train_online(client: Client, x: np.ndarray, y: np.ndarray, n: int, uid: str = "global",
                  replies: list[dict] | None = None):
    last = None
    for i in range(n):
        answer = client.predict("digits", x[i], uid=uid)
        last = client.update("digits", uid, x[i], int(y[i]), query_id=answer["query_id"])
        if replies is not None:
            replies.append(last)
    return last


def test_exp4_moves_weight_away_from_the_degraded_model(server_factory, three_models,
                                                        digits_data) -> None:
    server = server_factory(_config(three_models, degraded="logreg"))
    x, y = digits_data[2], digits_data[3]
    with Client(server.url) as client:
        first = client.predict("digits", x[0])
        assert first["models"] == ["logreg", "tree", "bayes"] and first["answered"] == 3
        labels = {"app": "digits", "model": "logreg"}
        asked = metric_value(client, "parityserve_selections_total", **labels)
        lost = metric_value(client, "parityserve_loss_total", **labels)
        updates: list[dict] = []
        reply = _train_online(client, x, y, 40, replies=updates)
        weights = reply["weights"]
        assert weights["logreg"] < 0.05, weights          # always wrong: nearly no weight
        assert weights["tree"] + weights["bayes"] > 0.95
        assert reply["losses"]["logreg"] == 1.0
        correct = sum(client.predict("digits", x[i])["output"] == y[i] for i in range(40, 80))
        assert correct >= 30  # the ensemble now follows the healthy models
        # counted as served: asked for each of the 80 queries since, and charged the losses
        # the 40 updates reported (the always-wrong model's: nearly 1 each)
        assert metric_value(client, "parityserve_selections_total", **labels) == asked + 80
        charged = sum(u["losses"]["logreg"] for u in updates)
        assert charged > 30 and metric_value(client, "parityserve_loss_total",
                                             **labels) == pytest.approx(lost + charged)


def test_contexts_learn_separately(server_factory, three_models, digits_data) -> None:
    server = server_factory(_config(three_models, degraded="tree"))
    x, y = digits_data[2], digits_data[3]
    with Client(server.url) as client:
        alice = _train_online(client, x, y, 20, uid="alice")
        bob = client.update("digits", "bob", x[0], int(y[0]))
    assert alice["weights"]["tree"] < 0.1
    assert bob["weights"]["tree"] > alice["weights"]["tree"]  # bob has seen one label only


def test_robust_exp4_answers_default_below_the_confidence_threshold(
        server_factory, three_models, digits_data) -> None:
    server = server_factory(_config(three_models, degraded="bayes", policy="robust-exp4",
                                    threshold=0.9))
    x = digits_data[2]
    with Client(server.url) as client:
        answers = [client.predict("digits", x[i]) for i in range(10)]
    # bayes's answers are corrupted, so all three rarely agree: most answers fall below 0.9.
    low = [a for a in answers if a["confidence"] < 0.9]
    assert len(low) >= 7
    for answer in low:
        assert answer["default"] is True and answer["output"] == -1
        assert answer["default_explanation"].startswith("low confidence")
    for answer in answers:
        if answer["confidence"] >= 0.9:
            assert answer["default"] is False


def test_bad_feedback_gets_a_clear_4xx(server_factory, three_models, digits_data) -> None:
    server = server_factory(_config(three_models))
    x = digits_data[2]
    with Client(server.url) as client:
        with pytest.raises(UnknownQuery, match="no record of query"):
            client.update("digits", "u", x[0], 3, query_id="no-such-query")
        with pytest.raises(InvalidInput):
            client.update("digits", "u", x[0], "seven")
        with pytest.raises(InvalidInput):
            client.update("digits", "u", x[0], 3.5)  # not a class label
        assert client.predict("digits", x[0])["default"] is False  # nothing broke


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_learned_weights_survive_a_frontend_restart(tmp_path, three_models, digits_data,
                                                    backend) -> None:
    from conftest import start_server

    if backend == "redis":
        url = os.environ.get("PARITYSERVE_REDIS_URL")
        if not url:
            if os.environ.get("CI"):
                pytest.fail("PARITYSERVE_REDIS_URL is not set under CI: `make test` starts Redis")
            pytest.skip("set PARITYSERVE_REDIS_URL (make test starts a private Redis)")
        store = url
    else:
        store = f"sqlite:{tmp_path / 'selection.db'}"
    config = _config(three_models, store=store, degraded="bayes")
    config["applications"][0]["name"] = app = f"restart-{backend}-{os.getpid()}"
    if backend == "redis":  # its admin changes on a stream of its own (runtime/cluster/peers.py)
        config["server"]["peers"] = {"namespace": app}
    x, y = digits_data[2], digits_data[3]

    def feedback(client: Client, i: int) -> dict:
        answer = client.predict(app, x[i], uid="carol")
        return client.update(app, "carol", x[i], int(y[i]), query_id=answer["query_id"])

    first = start_server(config, tmp_path)
    try:
        with Client(first.url) as client:
            for i in range(15):
                learned = feedback(client, i)["weights"]
    finally:
        first.stop()
    assert learned["bayes"] < 0.1
    second = start_server(config, tmp_path)
    try:
        with Client(second.url) as client:
            resumed = feedback(client, 15)["weights"]
            client.remove_application(app)  # also clears its stored state
    finally:
        second.stop()
    assert resumed["bayes"] <= learned["bayes"] + 1e-9  # continued, not started over
