"""Redundancy modes on real workers: slow, killed and Byzantine replicas.

``zoo:echo`` is a bias-free linear model (its output is its input), so a parity model for
it is the model itself and ParM decodes exactly; Berrut decodes approximately. The cache is
off: every query reaches the workers.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from itertools import combinations

import numpy as np
import pytest
import tritonclient.http as triton
from conftest import metric_value, model_state, wait_until

from parityserve.client import Client
from parityserve.errors import InvalidInput

pytestmark = pytest.mark.integration

VECTOR = {"name": "input", "datatype": "FP32", "shape": [4]}
# The slowed replica (index 0) of each model: every "answered without waiting for it" below
# is checked as a state, its served count unchanged once the answers are in, and its delay is
# the room that read has.
SLOW = {"delay_ms": 3000}


def _model(name: str, replicas: int, **extra: object) -> dict:
    return {"name": name, "source": "zoo:echo", "replicas": replicas, "input": VECTOR,
            "batching": {"max_batch_size": 4}, **extra}


def _app(name: str) -> dict:
    return {"name": name, "models": [name], "slo_ms": 10_000, "default_output": "DEFAULT"}


MODELS = [
    _model("parm", 2, parity={"k": 2}, faults={"0": SLOW}),
    _model("parm-crash", 2, parity={"k": 2}, faults={"0": {"crash_after_batches": 1}}),
    _model("berrut", 3, redundancy={"mode": "berrut", "K": 2, "S": 1}, faults={"0": SLOW}),
    _model("byzantine", 6, redundancy={"mode": "berrut", "K": 2, "S": 0, "E": 1},
           faults={"3": {"wrong_probability": 1.0, "noise_sigma": 100, "seed": 7}}),
    _model("systematic", 3, redundancy={"mode": "systematic-berrut", "K": 2, "S": 1},
           faults={"0": SLOW}),
    _model("replication", 2, redundancy={"mode": "replication", "d": 2}, faults={"0": SLOW}),
    _model("reactive", 2, redundancy={"mode": "reactive", "timeout_ms": 50},
           faults={"0": SLOW}),
    _model("equal", 2, redundancy={"mode": "equal-resources", "extra": 1}),
]


@pytest.fixture(scope="module")
def served(server_factory):
    config = {
        "server": {"http_port": 0, "cache_bytes": 0, "heartbeat_timeout_ms": 5000},
        "models": MODELS,
        "applications": [_app(m["name"]) for m in MODELS],
    }
    return server_factory(config)


@pytest.fixture
def client(served) -> Client:
    with Client(served.url) as c:
        yield c


def _ask(url: str, app: str, xs: np.ndarray) -> list[tuple[dict, float]]:
    """Send the rows of ``xs`` concurrently (one request each); (answer, seconds) per row."""
    def one(x: np.ndarray) -> tuple[dict, float]:
        with Client(url) as c:
            started = time.monotonic()
            answer = c.predict(app, x.tolist())
            return answer, time.monotonic() - started

    with ThreadPoolExecutor(len(xs)) as pool:
        return list(pool.map(one, xs))


def _slow_served(client: Client, model: str) -> int:
    """Batches the slowed replica (data replica 0) has answered so far."""
    return next(r["served"] for r in model_state(client, model)["replicas"]
                if r["pool"] == "data" and r["index"] == 0)


def _inputs(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, size=(n, 4)).astype(np.float32)


def _berrut_matrix(nodes: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Berrut's interpolant as a matrix, written here from the formula (not the package's):
    r(z) = sum_m s_m f_m / (z - z_m) / sum_m s_m / (z - z_m), s_m = (-1)^m over sorted nodes."""
    signs = np.empty(len(nodes))
    signs[np.argsort(nodes)] = (-1.0) ** np.arange(len(nodes))
    rows = []
    for z in points:
        terms = signs / (z - nodes)
        rows.append(terms / terms.sum())
    return np.array(rows)


def _berrut_answers(x: np.ndarray, partners: np.ndarray, workers: int, used: int
                    ) -> list[np.ndarray]:
    """Every answer ApproxIFER with K = 2 gives an echo model's query ``x`` when it decodes from
    ``used`` of ``workers``: x in either slot, beside any of ``partners`` or the zero padding of
    a short batch, whichever workers answered. Data nodes are Chebyshev points of the first
    kind, worker nodes of the second (the paper's); the echo model keeps the coded rows."""
    alpha = np.cos((2 * np.arange(2) + 1) * np.pi / 4)
    beta = np.cos(np.arange(workers) * np.pi / (workers - 1))
    encode = _berrut_matrix(alpha, beta)  # (workers, 2)
    answers = []
    for subset in map(list, combinations(range(workers), used)):
        c = _berrut_matrix(beta[subset], alpha) @ encode[subset]  # (2, 2): decoded from data
        for p in [*partners, np.zeros_like(x)]:
            answers += [c[0, 0] * x + c[0, 1] * p, c[1, 0] * p + c[1, 1] * x]
    return answers


def _assert_berrut_decode(answer: dict, x: np.ndarray, xs: np.ndarray, workers: int,
                          used: int) -> None:
    """Not within some tolerance of x: equal (to float32 rounding) to one of the answers an
    exact Berrut decode can give, which a decoder that is off anywhere does not hit."""
    got = np.asarray(answer["output"], dtype=np.float64)
    partners = np.array([p for p in xs if not np.array_equal(p, x)], dtype=np.float64)
    misses = [np.max(np.abs(got - a)) for a in _berrut_answers(x.astype(np.float64),
                                                                partners, workers, used)]
    assert min(misses) < 1e-4, (answer, x, min(misses))


# ---- ParM ------------------------------------------------------------------------------------
def test_parm_rebuilds_the_slow_replicas_batch_in_time_and_flags_it(served, client) -> None:
    rebuilt = metric_value(client, "parityserve_reconstructed_total", model="parm",
                           method="parm-subtraction")
    x = _inputs(1, 0)[0]
    slow = _slow_served(client, "parm")
    answer = client.predict("parm", x.tolist())  # the first idle replica is the slow one
    assert _slow_served(client, "parm") == slow  # rebuilt before the slow replica answered
    assert answer["default"] is False, answer
    assert answer.get("reconstructed") == "parm-subtraction", answer
    np.testing.assert_allclose(answer["output"], x, rtol=1e-5, atol=1e-5)
    assert metric_value(client, "parityserve_reconstructed_total", model="parm",
                        method="parm-subtraction") == rebuilt + 1


def _idle(client: Client, model: str) -> None:
    """Wait until the slow replica finished its last batch (so it takes the next one)."""
    wait_until(lambda: all(r["inflight"] == 0 for r in model_state(client, model)["replicas"]))


def test_parm_answers_every_query_exactly_under_load(served, client) -> None:
    _idle(client, "parm")
    xs = _inputs(12, 1)
    answers = _ask(served.url, "parm", xs)
    for x, (answer, _) in zip(xs, answers, strict=True):
        assert answer["default"] is False, answer
        np.testing.assert_allclose(answer["output"], x, rtol=1e-5, atol=1e-5)
    assert any(a.get("reconstructed") for a, _ in answers)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_v2_infer_reports_rebuilt_rows_to_tritonclient(served, client, binary) -> None:
    _idle(client, "parm")
    x = _inputs(3, 8)
    tc = triton.InferenceServerClient(served.url.removeprefix("http://"))
    inp = triton.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    name = "output"  # zoo:echo declares no output signature: the default name
    result = tc.infer("parm", [inp], outputs=[
        triton.InferRequestedOutput(name, binary_data=binary)])
    np.testing.assert_allclose(result.as_numpy(name), x, rtol=1e-5, atol=1e-5)
    params = result.get_response()["parameters"]
    assert params["reconstruction"] == ["parm-subtraction"], params
    assert params["reconstructed_rows"] and set(params["reconstructed_rows"]) <= {0, 1, 2}
    tc.close()


def test_parm_killed_replica_loses_no_query(served, client) -> None:
    xs = _inputs(16, 2)
    answers = _ask(served.url, "parm-crash", xs)
    for x, (answer, _) in zip(xs, answers, strict=True):
        assert answer["default"] is False, answer
        np.testing.assert_allclose(answer["output"], x, rtol=1e-5, atol=1e-5)
    # The crashed replica is restarted by the supervisor.
    wait_until(lambda: all(r["state"] == "ready"
                           for r in model_state(client, "parm-crash")["replicas"]))


def test_parm_runs_parity_replicas_beside_the_model(client) -> None:
    pools = sorted(r["pool"] for r in model_state(client, "parm")["replicas"])
    assert pools == ["data", "data", "parity0"]  # m / k = 2 / 2 parity replicas


# ---- Berrut ----------------------------------------------------------------------------------
def test_berrut_decodes_around_a_straggler(served, client) -> None:
    _idle(client, "berrut")
    xs = _inputs(4, 3)
    slow = _slow_served(client, "berrut")
    answers = _ask(served.url, "berrut", xs)
    assert _slow_served(client, "berrut") == slow  # all decoded before the straggler answered
    for x, (answer, _) in zip(xs, answers, strict=True):
        assert answer["default"] is False, answer
        assert answer.get("reconstructed") == "berrut", answer
        # K = 2 from 2 of 3 workers: the encoder's interpolant is the line through the two
        # queries, the echo model keeps it, and 2-node Berrut is that line: exact.
        np.testing.assert_allclose(answer["output"], x, rtol=1e-5, atol=1e-5)


def test_berrut_locates_the_byzantine_replica_and_excludes_it(served, client) -> None:
    xs = _inputs(8, 4)
    answers = _ask(served.url, "byzantine", xs)
    errors = [np.max(np.abs(np.asarray(a["output"]) - x)) for x, (a, _) in zip(xs, answers,
                                                                              strict=True)]
    assert max(errors) < 2.0, errors  # the noisy replica's sigma is 100
    for x, (answer, _) in zip(xs, answers, strict=True):
        _assert_berrut_decode(answer, x, xs, workers=6, used=5)  # the located one left out
    located = {r["index"]: r["located"] for r in model_state(client, "byzantine")["replicas"]}
    # The locator always excludes E results; a group the noisy replica took no part in would
    # lose its worst-fitting honest one. Replicas take at most one task per group, so every
    # group here includes the noisy replica, and it is the one excluded.
    assert located[3] > 0, located
    assert sum(v for i, v in located.items() if i != 3) == 0, located


def test_systematic_berrut_is_exact_when_originals_arrive(served, client) -> None:
    _idle(client, "systematic")
    xs = _inputs(6, 5)
    slow = _slow_served(client, "systematic")
    answers = _ask(served.url, "systematic", xs)
    assert _slow_served(client, "systematic") == slow  # none waited for the straggler
    for x, (answer, _) in zip(xs, answers, strict=True):
        assert answer["default"] is False, answer
        if answer.get("reconstructed"):
            assert answer["reconstructed"] == "systematic-berrut"
            # K = 2 from one original and the coded row (both on the queries' line): exact.
            np.testing.assert_allclose(answer["output"], x, rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_allclose(answer["output"], x, rtol=1e-6)
    assert any(a.get("reconstructed") for a, _ in answers)
    assert any(not a.get("reconstructed") for a, _ in answers)


# ---- baselines -------------------------------------------------------------------------------
@pytest.mark.parametrize("app", ["replication", "reactive"])
def test_copies_beat_the_slow_replica(served, client, app) -> None:
    _idle(client, app)
    xs = _inputs(4, 6)
    slow = _slow_served(client, app)
    answers = _ask(served.url, app, xs)
    assert _slow_served(client, app) == slow  # the fast copies answered first
    for x, (answer, _) in zip(xs, answers, strict=True):
        assert answer["default"] is False and "reconstructed" not in answer, answer
        np.testing.assert_allclose(answer["output"], x, rtol=1e-6)


def test_equal_resources_adds_plain_replicas(client) -> None:
    assert len(model_state(client, "equal")["replicas"]) == 3


# ---- admin -----------------------------------------------------------------------------------
def test_scaling_below_a_group_is_refused(client) -> None:
    with pytest.raises(InvalidInput, match="needs at least 3 replicas"):
        client.set_replicas("berrut", 2)
    assert len(model_state(client, "berrut")["replicas"]) == 3


def test_redundancy_is_switched_through_the_admin_api(served, client) -> None:
    with pytest.raises(InvalidInput, match="needs at least 3 replicas"):
        client.set_redundancy("equal", "berrut", K=2, S=1)
    with pytest.raises(InvalidInput, match="needs a 'parity' entry"):
        client.set_redundancy("equal", "parm")
    client.set_redundancy("equal", "parm", parity={"k": 2})
    wait_until(lambda: sorted((r["pool"], r["state"]) for r in model_state(
        client, "equal")["replicas"]) == [("data", "ready")] * 2 + [("parity0", "ready")])
    client.set_faults("equal", "0", delay_ms=1500)
    _idle(client, "equal")
    x = _inputs(1, 7)[0]
    answer = client.predict("equal", x.tolist())
    assert answer.get("reconstructed") == "parm-subtraction", answer
    np.testing.assert_allclose(answer["output"], x, rtol=1e-5, atol=1e-5)
    client.set_redundancy("equal", "none")
    wait_until(lambda: [r["pool"] for r in model_state(client, "equal")["replicas"]]
               == ["data", "data"])


def test_berrut_with_more_workers_than_the_minimum(served, client) -> None:
    # "replication" runs 2 replicas, replica 0 slow: too few for 4 workers, so first refused.
    with pytest.raises(InvalidInput, match="needs at least 4 replicas"):
        client.set_redundancy("replication", "berrut", K=2, S=1, workers=4)
    with pytest.raises(InvalidInput, match="needs at least 3 workers"):
        client.set_redundancy("replication", "berrut", K=2, S=1, workers=2)
    client.set_replicas("replication", 4)
    client.set_redundancy("replication", "berrut", K=2, S=1, workers=4)
    wait_until(lambda: [r["state"] for r in model_state(client, "replication")["replicas"]]
               == ["ready"] * 4)
    client.set_faults("replication", "0", **SLOW)
    _idle(client, "replication")
    xs = _inputs(4, 9)
    slow = _slow_served(client, "replication")
    answers = _ask(served.url, "replication", xs)
    assert _slow_served(client, "replication") == slow  # 3 of 4, not waiting for the slow one
    for x, (answer, _) in zip(xs, answers, strict=True):
        assert answer.get("reconstructed") == "berrut", answer
        _assert_berrut_decode(answer, x, xs, workers=4, used=3)
