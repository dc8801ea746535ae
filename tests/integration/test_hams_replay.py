"""HAMS's third consistency property on real processes: after SIGKILLs of the online
learner's primary and backup under load, with injected noise whose seeds come from OS
entropy, the final state equals a replay of the durable history, bit for bit.

The learner runs with ``audit: true``, so every reply names its row's place in its batch,
the batch's size and its noise seed. The test records each reply with the row and label it
sent, then (the graph idle) replays the batches the replies describe through a fresh
OnlineMLP and compares the digest with the primary's and the backup's
(``GET /admin/graphs/online/digests``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np

from benchmarks.hams_history import AuditedHistory, replay_check
from parityserve.client import Client
from tests.integration.conftest import start_server, wait_until
from tests.integration.test_hams_serving import graph_config, graph_state

OPTIONS = {"noise": 1e-3, "seed": 3, "audit": True}


class Clients:
    """Four closed-loop clients sending one labelled row each time until stopped; every
    reply is recorded with what was sent."""

    def __init__(self, url: str, history: AuditedHistory) -> None:
        self.url, self.history = url, history
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(4)]

    def __enter__(self) -> Clients:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)

    def run(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        with Client(self.url, timeout=60) as client:
            while not self.stop.is_set():
                row = rng.random(784, dtype=np.float32).tolist()
                label = int(rng.integers(-1, 10))  # -1: predict only, no feedback
                try:
                    reply = client.predict_graph("online", row, label=label)
                except Exception as exc:  # a lost reply breaks the history: report it
                    self.errors.append(repr(exc))
                    continue
                with self.lock:
                    self.history.record(reply, row, label)


def learner(url: str) -> dict:
    return graph_state(url)["operators"]["learner"]


def kill_when_whole(url: str, role: str) -> None:
    wait_until(lambda: learner(url)["whole"], 60)
    time.sleep(0.3)  # under load again before the next kill
    os.kill(learner(url)[f"{role}_pid"], signal.SIGKILL)


def slow_states(url: str, ms: float) -> None:
    httpx.post(f"{url}/admin/graphs/online/faults", timeout=10,
               json={"operator": "learner", "state_delay_ms": ms}).raise_for_status()


def test_after_kills_the_final_state_is_the_replay_of_what_clients_saw(tmp_path: Path
                                                                        ) -> None:
    config = graph_config(noise=OPTIONS["noise"])
    config["models"][1]["options"] = dict(OPTIONS)
    server = start_server(config, tmp_path)
    history = AuditedHistory("learner")
    try:
        url = server.url
        with Clients(url, history) as clients:
            # states reach the backup late, so batches run ahead of what is durable: the
            # first kill leaves requests to re-execute, with new batches and new seeds
            slow_states(url, 150)
            time.sleep(0.6)
            kill_when_whole(url, "primary")
            slow_states(url, 0)
            kill_when_whole(url, "backup")
            kill_when_whole(url, "primary")
            wait_until(lambda: learner(url)["whole"], 60)
            time.sleep(0.5)
        assert not clients.errors
        wait_until(lambda: learner(url)["whole"] and graph_state(url)["waiting"] == 0, 60)
        with Client(url) as admin:
            digests = admin.graph_digests("online")
        failovers = graph_state(url)["failovers"]
        result = replay_check(history, "zoo:online-mlp", OPTIONS, digests)
    finally:
        server.stop()
    assert result["final_state_matches_replay"], result["why"]
    assert result["backup_matches_primary"] is True
    assert len(failovers) == 2 and failovers[0]["discarded_replies"] > 0  # re-executed
    batches = history.batches()
    assert len({b.seed for b in batches}) == len(batches) > 20 and all(b.seed for b in batches)
    assert max(b.size for b in batches) > 1
    # the same check on this history with one batch's seed changed: it can fail
    middle = batches[len(batches) // 2].first
    history.sent = [replace(s, audit=replace(s.audit, seed=s.audit.seed ^ 1))
                    if s.audit.first == middle else s for s in history.sent]
    wrong = replay_check(history, "zoo:online-mlp", OPTIONS, digests)
    assert wrong["why"] == "the primary's state differs from the replay"
