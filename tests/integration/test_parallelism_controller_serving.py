"""The online parallelism controller on real workers (issue 18, item 4).

``zoo:echo`` answers its input, so every answer can be matched to its query; batches of one,
a 10 ms delay per batch and the cache off make every query reach a worker once, so the
replicas' ``served`` counts add up to the queries. The controller switches c and intra live
(tiny periods and a toggled policy force many switches) while queries run, and every query
is still answered exactly once, by the worker process that was there at the start.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import model_state, predict_all, start_server, wait_until
from test_parallelism_serving import VECTOR, _check

from parityserve.client import Client
from parityserve.config import parse_config
from parityserve.errors import ConfigError, Forbidden, InvalidInput, Unauthorized, UnknownModel
from parityserve.runtime.server import RunningServer

pytestmark = pytest.mark.integration


def profile(model: str) -> dict:
    # One thread per request: 50/s alone, 45/s two at once; two threads: 80/s. At low load
    # SERF wants c=1, intra=2 (12.5 ms against 20 ms).
    return {"schema": "parityserve.profile/1", "model": model, "cores": 2,
            "oversubscribe": False, "elapsed_s": 1.0, "measurements": [],
            "profiles": {"1": [50.0, 45.0], "2": [80.0]}}


# The tail-aware table (`parityserve profile --slo-p99-ms 100` writes one): at up to 25/s
# every configuration's simulated p99 meets 100 ms, so the fewest cores, c=1, intra=1, is
# the choice, where SERF alone would pick c=1, intra=2 (the lowest mean).
TAIL_TABLE = {"slo_p99_ms": 100.0, "queries": 5000, "levels": [
    {"rate": 25.0, "candidates": [{"c": 1, "intra": 1, "p99_s": 0.06},
                                  {"c": 2, "intra": 1, "p99_s": 0.05},
                                  {"c": 1, "intra": 2, "p99_s": 0.03}]}]}


def model(folder: Path) -> dict:
    return {"name": "echo", "source": "zoo:echo", "replicas": 2, "input": VECTOR,
            "batching": {"max_batch_size": 1}, "faults": {"all": {"delay_ms": 10}},
            "parallelism": 1, "threads_per_replica": 1,
            "scheduler": {"policy": "serf", "profile": str(folder / "echo.json"),
                          "period_s": 0.2, "window_s": 2.0}}


@pytest.fixture(scope="module")
def profiles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("profiles")
    (folder / "echo.json").write_text(json.dumps(profile("echo")))
    (folder / "other.json").write_text(json.dumps(profile("other")))
    (folder / "echo-tail.json").write_text(json.dumps({**profile("echo"),
                                                       "tail_aware": TAIL_TABLE}))
    return folder


@pytest.fixture(scope="module")
def served(server_factory, profiles: Path) -> RunningServer:
    config = {"server": {"http_port": 0, "cache_bytes": 0, "heartbeat_timeout_ms": 5000,
                         "model_roots": [str(profiles)]},
              "models": [model(profiles)],
              "applications": [{"name": "echo", "models": ["echo"], "slo_ms": 30_000,
                                "default_output": "DEFAULT"}]}
    server = server_factory(config)
    with Client(server.url) as c:
        wait_until(lambda: all(r["state"] == "ready"
                               for r in model_state(c, "echo")["replicas"]))
        for _ in range(3):  # admission measures the service time before the load tests
            c.predict("echo", [0.0, 0.0, 0.0, 0.0])
    return server


@pytest.fixture
def client(served: RunningServer) -> Client:
    with Client(served.url) as c:
        yield c


def scheduler(client: Client) -> dict:
    return model_state(client, "echo")["scheduler"]


def served_total(client: Client) -> int:
    return sum(r["served"] for r in model_state(client, "echo")["replicas"])


def knobs(client: Client) -> tuple[int, int]:
    state = model_state(client, "echo")
    return state["parallelism"], state["threads"]


def test_serf_decides_from_the_load_and_every_decision_is_visible(client: Client) -> None:
    xs = np.zeros((20, 4), dtype=np.float32)
    for x in xs:  # a trickle: SERF's choice at low load is one request on both cores
        client.predict("echo", x.tolist())
    wait_until(lambda: knobs(client) == (1, 2), timeout_s=20)
    state = scheduler(client)
    assert state["policy"] == "serf" and state["switches"] >= 1 and state["error"] is None
    decision = state["last_decision"]
    assert decision["policy"] == "serf" and decision["chosen"] == {"c": 1, "intra": 2}
    assert decision["arrival_rate"] > 0 and decision["predicted_chosen_ms"] > 0
    assert "best c=1, intra=2" in decision["reason"]
    text = client.metrics_text()
    assert 'parityserve_parallelism_config{knob="c",model="echo"} 1.0' in text
    assert 'parityserve_parallelism_config{knob="intra",model="echo"} 2.0' in text
    assert re.search(r'parityserve_scheduler_switches_total\{model="echo",policy="serf"\} '
                     r'[1-9]', text)
    for name in ('parityserve_scheduler_arrival_rate{model="echo"}',
                 'parityserve_scheduler_latency_seconds{kind="predicted",model="echo"}',
                 'parityserve_scheduler_latency_seconds{kind="observed",model="echo"}'):
        assert name in text


def test_no_query_is_lost_or_answered_twice_across_many_switches(
        served: RunningServer, client: Client, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="parityserve.runtime.fleet.parallelism")
    pids = sorted(r["pid"] for r in model_state(client, "echo")["replicas"])
    before_served, before_switches = served_total(client), scheduler(client)["switches"]
    xs = np.random.default_rng(3).uniform(-1, 1, size=(300, 4)).astype(np.float32)
    done = threading.Event()
    toggles: list[tuple[int, int]] = []

    def toggle() -> None:  # the fixed policy, moved every 40 ms, applied at its next tick
        with Client(served.url) as admin:
            for c, intra in [(2, 1), (1, 2), (1, 1), (2, 1)] * 25:
                if done.is_set():
                    break
                admin.set_scheduler("echo", "fixed", c=c, intra=intra, period_s=0.01)
                toggles.append((c, intra))
                time.sleep(0.04)

    toggler = threading.Thread(target=toggle)
    toggler.start()
    try:
        answers = predict_all(served.url, "echo", xs, workers=12)
    finally:
        done.set()
        toggler.join()
    _check(answers, xs)
    wait_until(lambda: served_total(client) == before_served + 300, timeout_s=10)
    assert served_total(client) == before_served + 300  # each query computed exactly once
    state = scheduler(client)
    switched = state["switches"] - before_switches
    assert switched >= 8, (toggles, state)
    lines = [r.getMessage() for r in caplog.records if "(fixed, lambda=" in r.getMessage()]
    assert len(lines) == switched, lines  # one log line per switch
    assert re.fullmatch(r"parallelism echo: c=\d intra=\d -> c=\d intra=\d \(fixed, "
                        r"lambda=[0-9.e+]+/s\): fixed at c=\d, intra=\d", lines[-1])
    assert state["error"] is None
    # The last fixed configuration is what runs, and no worker was restarted for it.
    wait_until(lambda: knobs(client) == toggles[-1], timeout_s=5)
    assert sorted(r["pid"] for r in model_state(client, "echo")["replicas"]) == pids


def test_the_queue_length_policy_scales_c_with_the_load(served: RunningServer,
                                                        client: Client) -> None:
    client.set_scheduler("echo", "fixed", c=1, intra=1, period_s=0.05)
    wait_until(lambda: knobs(client) == (1, 1), timeout_s=5)
    before = served_total(client)
    client.set_scheduler("echo", "queue-length", target_ongoing_requests=1, intra=1,
                         upscale_delay_s=0, downscale_delay_s=0, look_back_period_s=0.2,
                         period_s=0.05)
    seen: set[int] = set()
    done = threading.Event()

    def watch() -> None:
        with Client(served.url) as admin:
            while not done.is_set():
                seen.add(knobs(admin)[0])
                time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    xs = np.random.default_rng(4).uniform(-1, 1, size=(200, 4)).astype(np.float32)
    try:
        answers = predict_all(served.url, "echo", xs, workers=12)
    finally:
        done.set()
        watcher.join()
    _check(answers, xs)
    wait_until(lambda: served_total(client) == before + 200, timeout_s=10)
    assert 2 in seen  # twelve at once against a target of one per replica: scaled up
    wait_until(lambda: knobs(client)[0] == 1, timeout_s=10)  # idle: back down, no delay
    assert scheduler(client)["policy"] == "queue-length"


def test_a_bad_scheduler_request_is_refused_and_changes_nothing(
        served: RunningServer, client: Client, profiles: Path, tmp_path: Path) -> None:
    client.set_scheduler("echo", "fixed", c=1, intra=1, period_s=0.05)
    before = scheduler(client)["settings"]
    with pytest.raises(InvalidInput, match="scheduler.profile: policy serf needs the profile"):
        client.set_scheduler("echo", "serf")
    with pytest.raises(InvalidInput, match="the profile is of model 'other', not 'echo'"):
        client.set_scheduler("echo", "serf", profile=str(profiles / "other.json"))
    (tmp_path / "elsewhere.json").write_text(json.dumps(profile("echo")))
    with pytest.raises(Forbidden, match="profile file .* is outside the folders"):
        client.set_scheduler("echo", "serf", profile=str(tmp_path / "elsewhere.json"))
    elsewhere = model(tmp_path)
    elsewhere["scheduler"]["profile"] = str(tmp_path / "elsewhere.json")
    with pytest.raises(Forbidden, match="profile file .* is outside the folders"):
        client.deploy({**elsewhere, "version": 9})
    with pytest.raises(InvalidInput, match="unknown_key|Extra inputs"):
        client.set_scheduler("echo", "fixed", c=1, unknown_key=1)
    with pytest.raises(InvalidInput, match="scheduler.max_c .* is below min_c"):
        client.set_scheduler("echo", "queue-length", min_c=2, max_c=1)
    with pytest.raises(InvalidInput, match="2 requests at once x 2 threads each = 4 threads"):
        client.set_scheduler("echo", "fixed", c=2, intra=2)  # 2 cores, not oversubscribed
    with pytest.raises(UnknownModel):
        client.set_scheduler("nope", "fixed", c=1)
    with pytest.raises(Unauthorized), Client(served.url, token="wrong") as stranger:
        stranger.set_scheduler("echo", "fixed", c=2)
    assert scheduler(client)["settings"] == before


def test_a_p99_slo_makes_serf_run_the_fewest_cores_that_meet_it(client: Client,
                                                                profiles: Path) -> None:
    client.set_scheduler("echo", "fixed", c=1, intra=2, period_s=0.05)
    wait_until(lambda: knobs(client) == (1, 2), timeout_s=5)
    with pytest.raises(InvalidInput, match="the profile has no tail-aware table"):
        client.set_scheduler("echo", "serf", profile=str(profiles / "echo.json"),
                             slo_p99_ms=100)
    with pytest.raises(InvalidInput, match="table is for p99 <= 100 ms, not 50 ms"):
        client.set_scheduler("echo", "serf", profile=str(profiles / "echo-tail.json"),
                             slo_p99_ms=50)
    client.set_scheduler("echo", "serf", profile=str(profiles / "echo-tail.json"),
                         slo_p99_ms=100, period_s=0.1, window_s=2.0)
    for _ in range(10):  # a trickle, well under the table's 25/s
        client.predict("echo", [1.0, 2.0, 3.0, 4.0])
    wait_until(lambda: knobs(client) == (1, 1), timeout_s=20)
    decision = scheduler(client)["last_decision"]
    assert decision["policy"] == "serf-tail" and decision["chosen"] == {"c": 1, "intra": 1}
    assert "fewest cores meeting p99 <= 100 ms" in decision["reason"]


def test_the_admin_call_is_documented_behind_the_token(client: Client) -> None:
    spec = client._send("GET", "/openapi.json").json()
    for method in ("post", "delete"):
        assert spec["paths"]["/admin/models/{model}/scheduler"][method]["security"]


def test_removing_the_scheduler_stops_it_and_keeps_what_it_set(served: RunningServer,
                                                               client: Client) -> None:
    client.set_scheduler("echo", "fixed", c=2, intra=1, period_s=0.05)
    wait_until(lambda: knobs(client) == (2, 1), timeout_s=5)
    pids = sorted(r["pid"] for r in model_state(client, "echo")["replicas"])
    assert client.remove_scheduler("echo") == {"model": "echo", "stopped": True}
    assert scheduler(client) is None
    time.sleep(0.2)  # four periods: a controller still running would have ticked
    assert knobs(client) == (2, 1)  # the configuration it set stays
    assert client.remove_scheduler("echo") == {"model": "echo", "stopped": False}  # idempotent
    client.set_parallelism("echo", 1)  # by hand now, and nothing sets it back
    time.sleep(0.2)
    assert knobs(client)[0] == 1
    assert client.predict("echo", [1.0, 2.0, 3.0, 4.0])["default"] is False
    assert sorted(r["pid"] for r in model_state(client, "echo")["replicas"]) == pids
    with pytest.raises(UnknownModel):
        client.remove_scheduler("nope")
    with pytest.raises(Unauthorized), Client(served.url, token="wrong") as stranger:
        stranger.remove_scheduler("echo")


def test_a_version_deployed_with_or_without_a_scheduler_starts_or_stops_it(
        client: Client, profiles: Path) -> None:
    version2 = {**model(profiles), "version": 2}
    client.deploy(version2)  # a profile under model_roots, checked before the launch
    wait_until(lambda: model_state(client, "echo")["version"] == 2, timeout_s=60)
    wait_until(lambda: (scheduler(client) or {}).get("last_decision") is not None
               and scheduler(client)["policy"] == "serf", timeout_s=10)
    client.deploy({**version2, "version": 3, "scheduler": None})
    wait_until(lambda: model_state(client, "echo")["version"] == 3, timeout_s=60)
    assert scheduler(client) is None
    client.predict("echo", [1.0, 2.0, 3.0, 4.0])  # still served, by nothing that watches it


def test_a_profile_of_another_model_fails_the_start(profiles: Path, tmp_path: Path) -> None:
    config = {"server": {"http_port": 0}, "models": [model(profiles)]}
    config["models"][0]["scheduler"]["profile"] = str(profiles / "other.json")
    with pytest.raises(ConfigError, match="model 'echo': scheduler.profile .*other.json.*: "
                       "the profile is of model 'other', not 'echo'"):
        start_server(config, tmp_path)
    assert parse_config(config).models[0].scheduler is not None  # the YAML itself is valid
