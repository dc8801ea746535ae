"""What the frontend and a stateful operator's processes say to each other: the message
kinds, the operator's launch spec, lineage on the wire and checkpoint file names.

A leaf with no framework import: the frontend's graph runtime (``hams_graph``) speaks this
protocol without loading torch, which only the operator processes (``hams_worker``) need.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from parityserve.core.hams import Hop, Lineage
from parityserve.errors import ProtocolError

__all__ = ["ALLOW", "APPLIED", "ATTACH", "BATCH", "BEAT", "CHECKPOINT", "DIGEST", "DURABLE",
           "FAILED", "HELLO", "NOTIFY", "OUT", "PROMOTE", "PROMOTED", "RECEIVED", "ROLLBACK",
           "SEED_LIMIT_S", "SLOW", "STATE", "STOP", "UNSEED", "OperatorSpec", "Refusal",
           "checkpoint_file", "lineage_from_wire", "lineage_to_wire", "refusal"]

# message types on the frontend <-> operator and primary <-> backup links
HELLO, BEAT, BATCH, OUT, FAILED = "h.hello", "h.hb", "h.batch", "h.out", "h.failed"
ATTACH, ALLOW, NOTIFY, DURABLE = "h.attach", "h.allow", "h.notify", "h.durable"
PROMOTE, PROMOTED, ROLLBACK, STOP = "h.promote", "h.promoted", "h.rollback", "h.stop"
STATE, RECEIVED, APPLIED, SLOW = "h.state", "h.recv", "h.applied", "h.slow"
CHECKPOINT, DIGEST, UNSEED = "h.ckpt", "h.digest", "h.unseed"

# the longest a promoted member waits for the spare it seeds to apply the state before it
# answers unseeded (the frontend cuts it short with UNSEED when that spare is lost)
SEED_LIMIT_S = 2.0


@dataclass(frozen=True)
class OperatorSpec:
    """Everything a stateful operator process needs; travels as JSON on the command line."""

    worker_id: str
    op: str
    source: str
    role: str  # "primary" | "backup"
    mode: str = "hams"  # "hams" | "remus" | "bare" | "checkpoint-replay"
    options: dict[str, Any] = field(default_factory=dict)
    pfm: tuple[str, ...] = ()  # previous stateful operators (whose durability we wait for)
    heartbeat_s: float = 0.05
    bind_host: str = "127.0.0.1"  # where a backup listens for its primary (across hosts)
    ipc_dir: str = ""  # a 0700 folder: primary and backup share this host, use a Unix socket
    checkpoint_every: int = 0  # checkpoint-replay: batches between checkpoints
    checkpoint_path: str = ""  # checkpoint-replay: checkpoints go to PATH.SEQ (one per SEQ)
    restore_seq: int = 0  # checkpoint-replay: the checkpoint a fresh primary starts from
    full_state_every: int = 50  # batches between full copies when the operator declares deltas

    def to_json(self) -> str:
        return orjson.dumps(asdict(self)).decode()

    @classmethod
    def from_json(cls, text: str) -> OperatorSpec:
        raw = orjson.loads(text)
        raw["pfm"] = tuple(raw.get("pfm", ()))
        return cls(**raw)


def lineage_to_wire(lineage: Lineage) -> list[list[Any]]:
    return [[h.pred, h.pred_seq, h.op, h.seq] for h in lineage]


def lineage_from_wire(raw: Any) -> Lineage:
    try:
        return tuple(Hop(str(p), int(ps), str(o), int(s)) for p, ps, o, s in raw)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"bad lineage: {exc}") from exc


def checkpoint_file(path: str, seq: int) -> str:
    """Each checkpoint keeps its own file. The newest on disk is not always the one to
    restore: a primary killed just after writing one may never have sent the outputs it
    covers, and a restore from it would skip them. The frontend names the checkpoint it was
    told of (``restore_seq``), whose outputs it has, and deletes the older ones."""
    return f"{path}.{seq}"


# ---- one batch's outcome, row by row ---------------------------------------------------------
# An OUT message answers a whole batch (``hams_messages.Out``): ``outputs`` (a payload, one
# row per answered row), ``rows`` (which rows of the batch those are; absent: every row) and
# ``refused`` (one [row, kind, message, retry_after_s] per row the operator refused, nothing
# written for it).

_MESSAGE_CHARS = 1000


@dataclass(frozen=True)
class Refusal:
    """A row the operator refused: ``bad_input`` (the row's fault: 400), ``busy`` (no room
    for it now, e.g. a full stream table: 429 after ``retry_after_s``) or ``error`` (500)."""

    row: int
    kind: str
    message: str
    retry_after_s: float = 0.0


def refusal(row: int, exc: BaseException) -> list[Any]:
    """A refused row on the wire. An exception with ``retry_after_s`` says there is no room
    for the row now; ``ValueError``/``TypeError`` say the row is bad."""
    message = f"{type(exc).__name__}: {exc}"[:_MESSAGE_CHARS]
    wait = getattr(exc, "retry_after_s", None)
    if isinstance(wait, int | float) and not isinstance(wait, bool) and math.isfinite(wait):
        return [row, "busy", message, float(wait)]
    return [row, "bad_input" if isinstance(exc, ValueError | TypeError) else "error", message,
            0.0]
