"""The benchmark's replay check (``benchmarks.hams_history``): replies recorded as a client
sees them, replayed offline, compared with the server's digests. A local OnlineMLP plays the
server here (one thread, ``compute`` drawing its seeds, as an operator process does)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from benchmarks.hams_history import AuditedHistory, replay_check, replay_verdict  # noqa: E402
from parityserve.models.stateful import (  # noqa: E402
    OnlineMLP,
    OperatorBatch,
    run_batch,
    state_digest,
)

OPTIONS = {"noise": 1e-3, "seed": 9, "audit": True}
SIZES = (2, 5, 1, 8, 3)


def go() -> threading.Event:
    event = threading.Event()
    event.set()
    return event


def serve() -> tuple[list[tuple[dict[str, Any], list[float], int]], dict[str, Any]]:
    """Run batches as the learner's primary would; the replies a client gets (with the row
    and label it sent), and the server's digests (a backup holding the primary's bytes)."""
    rng = np.random.default_rng(3)
    op = OnlineMLP(**OPTIONS)  # type: ignore[arg-type]
    state = op.initialize()
    replies, seq = [], 0
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for n in SIZES:
            x, y = rng.random((n, 784), dtype=np.float32), rng.integers(-1, 10, n)
            out = run_batch(op, OperatorBatch.from_numpy(x, [""] * n, y), state, go())
            for i in range(n):
                seq += 1
                reply = {"output": out[i].tolist(), "seqs": {"feat": seq, "learner": seq}}
                replies.append((reply, x[i].tolist(), int(y[i])))
    finally:
        torch.set_num_threads(before)
    at = {"seq": seq, "digest": state_digest(state), "pid": 1}
    return replies, {"learner": {"primary": at, "backup": {**at, "pid": 2, "synced": True}}}


def check(replies: list[tuple[dict[str, Any], list[float], int]], digests: dict[str, Any]
          ) -> dict[str, Any]:
    history = AuditedHistory("learner")
    for reply, row, label in replies:
        history.record(reply, row, label)
    return replay_check(history, "zoo:online-mlp", OPTIONS, digests)


@pytest.fixture(scope="module")
def served() -> tuple[list[tuple[dict[str, Any], list[float], int]], dict[str, Any]]:
    return serve()


def test_what_clients_saw_replays_to_the_servers_state(served: Any) -> None:
    replies, digests = served
    result = check(list(reversed(replies)), digests)  # replies arrive in any order
    assert result["final_state_matches_replay"], result["why"]
    assert result["backup_matches_primary"] and result["batches"] == len(SIZES)
    assert result["requests"] == sum(SIZES)


def test_a_lost_reply_makes_the_history_unreplayable(served: Any) -> None:
    replies, digests = served
    result = check(replies[:4] + replies[5:], digests)
    assert not result["final_state_matches_replay"]
    assert result["why"].startswith("history: the batch at seq 3 of 5 rows lacks rows [2]")


def test_swapped_seeds_replay_to_another_state(served: Any) -> None:
    """Two batches' seeds exchanged: the same rows, another history."""
    replies, digests = served
    first, second = replies[0][0]["output"][3], replies[2][0]["output"][3]  # seqs 1-2, 3-7
    swap = {first: second, second: first}
    swapped = [({**r, "output": [*r["output"][:3], swap.get(r["output"][3], r["output"][3])]},
                x, y) for r, x, y in replies]
    assert swapped[0][0]["output"][3] == second != first
    result = check(swapped, digests)
    assert not result["final_state_matches_replay"]
    assert result["why"] == "the primary's state differs from the replay"


def test_a_tampered_digest_or_a_lagging_backup_is_caught(served: Any) -> None:
    replies, digests = served
    learner = digests["learner"]
    tampered = {"learner": {**learner, "primary": {**learner["primary"], "digest": "0" * 64}}}
    result = check(replies, tampered)
    assert not result["final_state_matches_replay"]
    assert "primary's state differs" in result["why"] and "backup" in result["why"]
    behind = {"learner": {**learner, "backup": {**learner["backup"], "seq": 17}}}
    result = check(replies, behind)
    assert not result["final_state_matches_replay"]
    assert result["why"] == "the backup (after 17) differs from the primary"


@pytest.mark.parametrize(("server", "matches", "why", "same"), [
    ({"primary": {"seq": 4, "digest": "d"}, "backup": None}, True, "", None),
    ({"primary": {"seq": 3, "digest": "d"}, "backup": None}, False,
     "the primary is after request 3, the history after 4", None),
    ({"primary": {"seq": 4, "digest": "e"}, "backup": {"seq": 4, "digest": "e"}}, False,
     "the primary's state differs from the replay", True),
    ({"primary": None, "backup": None}, False, "no primary to compare with", None),
])
def test_replay_verdict(server: dict[str, Any], matches: bool, why: str, same: bool | None
                        ) -> None:
    verdict = replay_verdict("d", 4, server)
    assert verdict["final_state_matches_replay"] is matches and verdict["why"] == why
    assert verdict.get("backup_matches_primary") is same


class Unseeded:
    """A stateful operator with no ``compute_seeded``: its randomness cannot be replayed."""

    def initialize(self) -> dict[str, Any]:
        return {}

    def compute(self, batch: Any, state: Any) -> tuple[Any, Any]:
        return batch, None

    def update(self, state: Any, pending: Any) -> None:
        pass


def test_an_operator_without_compute_seeded_is_refused(served: Any) -> None:
    replies, digests = served
    history = AuditedHistory("learner")
    for reply, row, label in replies:
        history.record(reply, row, label)
    with pytest.raises(TypeError, match="no compute_seeded"):
        replay_check(history, f"python:{__name__}:Unseeded", {}, digests)
