"""The replay check: the final state equals a replay of the durable history (HAMS's third
consistency property), checked from the outside.

A client of an audited operator (``audit: true``) records every reply with the row and
label it sent (``AuditedHistory``). Once the graph is idle, ``replay_check`` rebuilds the
batches that became durable (``core.hams.durable_batches``), runs them again offline from
the operator's initial state with the seeds the replies name, and compares the digest with
the server's primary and backup (``GET /admin/graphs/{graph}/digests``).

The operator's inputs are taken to be the client's rows: the operators before it must be
echoes (as in the benchmark's and the tests' online-learning service).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from parityserve.core.hams import AuditRow, HistoryBatch, HistoryError, durable_batches

__all__ = ["AuditedHistory", "replay_check", "replay_verdict"]


@dataclass(frozen=True)
class _Sent:
    audit: AuditRow
    row: tuple[float, ...]
    label: int
    stream: str


@dataclass
class AuditedHistory:
    """Every reply a client got for one audited operator, with what the client sent."""

    op: str
    sent: list[_Sent] = field(default_factory=list)

    def record(self, reply: Mapping[str, Any], row: Sequence[float], label: int = -1,
               stream: str = "") -> None:
        """``reply["output"]`` ends with the operator's audit columns (row in its batch,
        batch size, noise seed): the operators after it must pass them through."""
        *_, place, size, seed = reply["output"]
        audit = AuditRow(int(reply["seqs"][self.op]), int(place), int(size), int(seed))
        self.sent.append(_Sent(audit, tuple(row), int(label), stream))

    def batches(self) -> list[HistoryBatch]:
        return durable_batches(s.audit for s in self.sent)


def replay_check(history: AuditedHistory, source: str, options: Mapping[str, Any],
                 digests: Mapping[str, Any]) -> dict[str, Any]:
    """Replay what clients saw through a fresh operator built from ``source`` and
    ``options`` (as the server built it) and compare with ``digests[history.op]``."""
    try:
        batches = history.batches()
    except HistoryError as exc:  # not one run of whole batches: nothing to replay
        return {"final_state_matches_replay": False, "why": f"history: {exc}",
                "requests": len(history.sent)}
    replayed = _replayed_digest(history, batches, source, options)
    last = batches[-1].seqs[-1] if batches else 0
    return {**replay_verdict(replayed, last, digests[history.op]),
            "batches": len(batches), "requests": len(history.sent), "replayed": replayed}


def replay_verdict(replayed: str, last_seq: int, server: Mapping[str, Any]
                   ) -> dict[str, Any]:
    """The server's primary must be after the history's last request with the replay's
    digest; a backup, where there is one, must hold the primary's bytes at the same point."""
    primary, backup = server["primary"], server.get("backup")
    if primary is None:
        return {"final_state_matches_replay": False, "why": "no primary to compare with"}
    problems = []
    if primary["seq"] != last_seq:
        problems.append(f"the primary is after request {primary['seq']}, the history after "
                        f"{last_seq}")
    if primary["digest"] != replayed:
        problems.append("the primary's state differs from the replay")
    same = None
    if backup is not None:
        same = (backup["seq"], backup["digest"]) == (primary["seq"], primary["digest"])
        if not same:
            problems.append(f"the backup (after {backup['seq']}) differs from the primary")
    return {"final_state_matches_replay": not problems, "why": "; ".join(problems),
            "backup_matches_primary": same, "primary": primary, "backup": backup}


def _replayed_digest(history: AuditedHistory, batches: Sequence[HistoryBatch], source: str,
                     options: Mapping[str, Any]) -> str:
    from parityserve.models.stateful import (
        OperatorBatch,
        SeededOperator,
        load_stateful,
        replay_state,
        state_digest,
    )

    op = load_stateful(source, options)
    if not isinstance(op, SeededOperator):
        raise TypeError(f"{source} has no compute_seeded(batch, state, seed): it cannot be "
                        "replayed")
    sent = {s.audit.seq: s for s in history.sent}
    todo = []
    for batch in batches:
        rows = [sent[seq] for seq in batch.seqs]  # in execution order, as the batch ran
        todo.append((OperatorBatch.from_numpy(np.array([r.row for r in rows], np.float32),
                                              [r.stream for r in rows],
                                              [r.label for r in rows]), batch.seed))
    return state_digest(replay_state(op, todo))
