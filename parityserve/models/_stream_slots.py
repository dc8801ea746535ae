"""What the per-stream operators (``StreamLSTM``, ``StreamMean``) share: the stream slot
table, their input check and their option checks.

A per-stream state is a fixed set of pre-allocated tensors, so ``StateBuffer`` copies it by
name and a backup installs it in place: ``keys`` (int64 [max_streams]) holds the stream in
each slot (``stream_key(name)``, 0 if free), ``used`` (float64 [max_streams]) when its
stream last brought a row (the batch's ``at``), and the operator's own tensors hold each
slot's values. A new stream takes a free slot, else the least recently used stream's that
has been idle for ``stream_idle_s`` (its state is dropped: the slot starts from zeros);
with neither, the batch raises ``StreamTableFull`` naming that stream's rows, before
anything is written, and the server runs the other rows without them
(``core.hams.plan_streams`` decides).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from parityserve.core.hams.streams import plan_streams
from parityserve.models._stateful_base import OperatorBatch, State

__all__ = ["DEFAULT_IDLE_S", "SlotPlan", "SlotWrites", "StreamTableFull", "check_idle",
           "check_noise", "check_sizes", "flat_inputs", "plan_slots", "slot_table",
           "stream_key"]

_KEY_BITS = 63
DEFAULT_IDLE_S = 600.0  # a stream unused this long may give its slot to a new one


class StreamTableFull(RuntimeError):
    """A batch brings a new stream and every slot of the stream table holds a stream that
    is not idle yet. ``rows``: the batch's rows of such streams (the rest could run);
    ``retry_after_s``: when the first slot turns idle."""

    def __init__(self, message: str, rows: Sequence[int] = (),
                 retry_after_s: float = 0.0) -> None:
        super().__init__(message)
        self.rows = tuple(rows)
        self.retry_after_s = retry_after_s


def stream_key(name: str) -> int:
    """A stream's key in the slot table: a non-zero 63-bit blake2b hash of its name, the same
    in every process (unlike the salted ``hash()``)."""
    digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> (64 - _KEY_BITS) or 1


@dataclass(frozen=True)
class SlotPlan:
    """Where a batch's rows go. A "lane" is one stream of the batch, or one streamless row."""

    lane_of_row: list[int]
    slots: list[int]  # per lane: its slot, -1 for a streamless row
    keys: list[int]  # per lane: its stream's key, 0 for a streamless row
    known: list[bool]  # per lane: its slot already holds its values
    at: float = 0.0  # the batch's time: each kept lane's slot is used then

    def rows_of_lanes(self) -> list[list[int]]:
        """Each lane's rows, in row order."""
        rows: list[list[int]] = [[] for _ in self.slots]
        for row, lane in enumerate(self.lane_of_row):
            rows[lane].append(row)
        return rows


def plan_slots(batch: OperatorBatch, state: State, max_streams: int,
               idle_s: float) -> SlotPlan:
    """Each row's lane, and each lane's slot: the one its stream holds, else a free one,
    else an idle stream's (``plan_streams``). The table is read from the state every batch,
    so a backup that installed the primary's bytes plans exactly as the primary would.
    Raises ``StreamTableFull`` naming the rows of new streams no slot could take."""
    keys = [stream_key(name) if name else 0 for name in batch.streams]
    plan = plan_streams(keys, state["keys"].tolist(), state["used"].tolist(), batch.at, idle_s)
    if plan.refused:  # each refused row's client reads this: no key of another client
        raise StreamTableFull(
            f"stream table full: all max_streams={max_streams} slots hold a stream used "
            f"in the last stream_idle_s={idle_s:g} s, and no slot is left for a new "
            "stream; nothing was written", plan.refused, plan.retry_after_s)
    return SlotPlan(plan.lane_of_row, plan.slots, plan.keys, plan.known, batch.at)


@dataclass(frozen=True)
class SlotWrites:
    """What a per-stream operator writes after a batch: each kept stream's slot, and that
    slot's new row of each state tensor (``keys`` and ``used`` among them). A slot taken
    from an idle stream is overwritten whole: its old state is gone."""

    slots: Tensor
    rows: dict[str, Tensor]

    @classmethod
    def of(cls, plan: SlotPlan, **per_lane: Tensor) -> SlotWrites | None:
        """From tensors with one row per lane of ``plan``: the lanes with a slot (a row with
        no stream keeps nothing); ``None`` when no lane has one."""
        kept = [lane for lane, slot in enumerate(plan.slots) if slot >= 0]
        if not kept:
            return None
        keys = torch.tensor([plan.keys[lane] for lane in kept], dtype=torch.int64)
        used = torch.full((len(kept),), plan.at, dtype=torch.float64)
        return cls(torch.tensor([plan.slots[lane] for lane in kept]),
                   {"keys": keys, "used": used,
                    **{name: t[kept] for name, t in per_lane.items()}})

    def changed_rows(self) -> tuple[list[int], tuple[str, ...]]:
        """The declared delta: ``store`` writes these rows of these tensors and nothing
        else, so the primary ships only them to its backup (``core.hams.deltas``)."""
        return self.slots.tolist(), tuple(self.rows)

    def store(self, state: dict[str, Tensor]) -> None:
        with torch.no_grad():
            for name, rows in self.rows.items():
                state[name].index_copy_(0, self.slots, rows)


def flat_inputs(batch: OperatorBatch, width: int, method: str, option: str) -> Tensor:
    """``batch.inputs`` as [n, width], or an error naming ``method`` (``Class.method``) and
    the constructor ``option`` that set ``width``."""
    if not isinstance(batch, OperatorBatch):
        raise TypeError(f"{method} takes an OperatorBatch, got {type(batch).__name__}")
    x = batch.inputs
    flat = x.reshape(len(x), math.prod(x.shape[1:]))
    if flat.shape[1] != width:
        owner = method.partition(".")[0]
        raise ValueError(f"{owner}({option}={width}) takes {width} features per row; got "
                         f"shape {list(x.shape)}")
    return flat


def check_sizes(**sizes: int) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def check_noise(noise: float) -> float:
    """``noise`` as a float, or ``ValueError`` unless it is a finite number >= 0."""
    if isinstance(noise, bool) or not isinstance(noise, int | float) \
            or not math.isfinite(noise) or noise < 0:
        raise ValueError(f"noise must be a finite number >= 0, got {noise!r}")
    return float(noise)


def slot_table(max_streams: int) -> State:
    """The table's own tensors: each slot's stream key (0: free) and last use."""
    return {"keys": torch.zeros(max_streams, dtype=torch.int64),
            "used": torch.zeros(max_streams, dtype=torch.float64)}


def check_idle(idle_s: float) -> float:
    """``stream_idle_s`` as a float, or ``ValueError`` unless finite and > 0."""
    if isinstance(idle_s, bool) or not isinstance(idle_s, int | float) \
            or not math.isfinite(idle_s) or idle_s <= 0:
        raise ValueError(f"stream_idle_s must be a finite number > 0, got {idle_s!r}")
    return float(idle_s)
