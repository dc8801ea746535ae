"""What the per-stream operators (``StreamLSTM``, ``StreamMean``) share: the stream slot
table, their input check and their option checks.

A per-stream state is a fixed set of pre-allocated tensors, so ``StateBuffer`` copies it by
name and a backup installs it in place: ``keys`` (int64 [max_streams]) holds the stream in
each slot (``stream_key(name)``, 0 if free) and the operator's own tensors hold each slot's
values. A slot, once taken, stays taken; a batch bringing a stream the full table has no
room for raises ``StreamTableFull`` before anything is written.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from parityserve.models._stateful_base import OperatorBatch

__all__ = ["SlotPlan", "SlotWrites", "StreamTableFull", "check_noise", "check_sizes",
           "flat_inputs", "plan_slots", "stream_key"]

_KEY_BITS = 63


class StreamTableFull(RuntimeError):
    """A batch brings a new stream and every slot of the stream table is taken."""


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

    def rows_of_lanes(self) -> list[list[int]]:
        """Each lane's rows, in row order."""
        rows: list[list[int]] = [[] for _ in self.slots]
        for row, lane in enumerate(self.lane_of_row):
            rows[lane].append(row)
        return rows


def plan_slots(streams: Sequence[str], keys: Tensor, max_streams: int) -> SlotPlan:
    """Each row's lane, and each lane's slot: the one its stream holds, else the lowest free
    one. The table is read from ``keys`` every batch: it is the state, so a backup that
    installed the primary's bytes plans exactly as the primary would."""
    table = keys.tolist()
    held = {key: slot for slot, key in enumerate(table) if key}
    free = (slot for slot, key in enumerate(table) if not key)
    plan = SlotPlan([], [], [], [])
    lane_of_key: dict[int, int] = {}
    for name in streams:
        key = stream_key(name) if name else 0
        if key and key in lane_of_key:
            plan.lane_of_row.append(lane_of_key[key])
            continue
        slot = held.get(key, -1) if key else -1
        if key and slot < 0:
            slot = next(free, -1)
            if slot < 0:
                raise StreamTableFull(
                    f"stream table full: all max_streams={max_streams} slots hold a stream "
                    f"and stream {name!r} is new; nothing was written (raise max_streams)")
        if key:
            lane_of_key[key] = len(plan.slots)
        plan.lane_of_row.append(len(plan.slots))
        plan.slots.append(slot)
        plan.keys.append(key)
        plan.known.append(key in held)
    return plan


@dataclass(frozen=True)
class SlotWrites:
    """What a per-stream operator writes after a batch: each kept stream's slot, and that
    slot's new row of each state tensor (``keys`` among them)."""

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
        return cls(torch.tensor([plan.slots[lane] for lane in kept]),
                   {"keys": keys, **{name: t[kept] for name, t in per_lane.items()}})

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
