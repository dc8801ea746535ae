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
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np

from benchmarks.hams import Load
from benchmarks.hams_history import AuditedHistory, replay_check
from parityserve.client import Client
from tests.integration.conftest import start_server, wait_until
from tests.integration.test_hams_serving import graph_config, graph_state

OPTIONS = {"noise": 1e-3, "seed": 3, "audit": True}


def recorder(history: AuditedHistory) -> Callable[[dict, dict, int], None]:
    """Record every reply (from any client thread) with the row and label it answers."""
    lock = threading.Lock()

    def record(reply: dict, body: dict, row: int) -> None:
        with lock:
            history.record(reply, body["input_batch"][row], body["labels"][row])

    return record


def learner(url: str) -> dict:
    return graph_state(url)["operators"]["learner"]


def under_load_again(url: str, batches: int = 8) -> None:
    """Wait (a state, not a sleep) until the learner is whole and has taken ``batches``
    numbers since: it serves the load again."""
    wait_until(lambda: learner(url)["whole"], 60)
    seq = learner(url)["last_seq"]
    wait_until(lambda: learner(url)["whole"] and learner(url)["last_seq"] >= seq + batches, 60)


def kill(url: str, role: str) -> None:
    """SIGKILL the learner's ``role`` once it serves the load again."""
    under_load_again(url)
    pid = learner(url)[f"{role}_pid"]
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: learner(url)[f"{role}_pid"] != pid, 60)  # seen: the kill landed


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
        rng = np.random.default_rng(0)  # labels of -1: predict only, no feedback
        data = (rng.random((500, 784), dtype=np.float32), rng.integers(-1, 10, 500))
        with Load(url, data, batch=2, clients=4, on_reply=recorder(history)) as load:
            # states reach the backup late, so batches run ahead of what is durable: the
            # first kill leaves requests to re-execute, with new batches and new seeds. It
            # lands once the primary is seen ahead of the durable point by several batches.
            slow_states(url, 150)
            under_load_again(url)
            wait_until(lambda: learner(url)["last_seq"] >= learner(url)["durable"] + 4, 60)
            os.kill(learner(url)["primary_pid"], signal.SIGKILL)
            slow_states(url, 0)
            kill(url, "backup")
            kill(url, "primary")
            under_load_again(url)
        assert load.errors == 0  # a lost reply would leave a hole in the history
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
