"""A stateful operator's stream table: which slot each row's stream uses, which idle stream
a new one evicts, and which rows must wait (issue 38, item 3).

A per-stream operator keeps each stream's state in one of ``len(table)`` slots. A stream
that is held keeps its slot. A new stream takes a free slot, else the slot of the least
recently used stream that has been idle for at least ``idle_s`` (ties: the lowest slot),
never one whose stream is in this batch. When none is free or idle, the new stream's rows
are refused, and only they: every other row of the batch runs, and ``retry_after_s``
says when the first slot turns idle.

Time is the batch's stamp ``at`` (the frontend's clock when it formed the batch), never
the operator's own clock: the plan is a function of the state and the batch alone. A
replay of a logged batch (checkpoint-replay) carries the same stamp and plans the same,
and a backup, which installs the primary's state bytes, holds the same table after an
eviction as the primary. A slot's last use is kept in the state (``used``), written with
the slot's other tensors after the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["StreamPlan", "plan_streams"]


@dataclass(frozen=True)
class StreamPlan:
    """Where a batch's rows go. A lane is one stream of the batch, or one streamless row;
    a refused row has no lane (``-1``)."""

    lane_of_row: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)  # per lane: its slot, -1 when streamless
    keys: list[int] = field(default_factory=list)  # per lane: its stream's key, 0 if none
    known: list[bool] = field(default_factory=list)  # per lane: its slot holds its state
    refused: list[int] = field(default_factory=list)  # rows of new streams without a slot
    evicted: list[int] = field(default_factory=list)  # slots given up by an idle stream
    retry_after_s: float = 0.0  # with refused rows: when the first slot turns idle


def plan_streams(row_keys: Sequence[int], table: Sequence[int], used: Sequence[float],
                 at: float, idle_s: float) -> StreamPlan:
    """The plan for rows whose streams have keys ``row_keys`` (0: no stream), against the
    table's keys per slot (0: free) and each slot's last use, at time ``at``."""
    held = {key: slot for slot, key in enumerate(table) if key}
    in_batch = {key for key in row_keys if key}
    free = [slot for slot, key in enumerate(table) if not key]
    idle = sorted((used[slot], slot) for slot, key in enumerate(table)
                  if key and key not in in_batch and used[slot] + idle_s <= at)
    plan = StreamPlan()
    lane_of_key: dict[int, int] = {}
    refused_keys: set[int] = set()
    for row, key in enumerate(row_keys):
        if key in lane_of_key:
            plan.lane_of_row.append(lane_of_key[key])
        elif key in refused_keys:
            plan.refused.append(row)
            plan.lane_of_row.append(-1)
        elif not _add_lane(plan, row, key, held, free, idle):
            refused_keys.add(key)
            plan.lane_of_row.append(-1)
        elif key:
            lane_of_key[key] = plan.lane_of_row[-1]
    if not plan.refused:
        return plan
    return _with_retry(plan, table, used, at, idle_s)


def _add_lane(plan: StreamPlan, row: int, key: int, held: dict[int, int], free: list[int],
              idle: list[tuple[float, int]]) -> bool:
    """A lane for the row's stream: its slot, a free one, an idle one; False if none."""
    known = key in held
    if not key:
        slot = -1
    elif known:
        slot = held[key]
    elif free:
        slot = free.pop(0)
    elif idle:
        slot = idle.pop(0)[1]
        plan.evicted.append(slot)
    else:
        plan.refused.append(row)
        return False
    plan.lane_of_row.append(len(plan.slots))
    plan.slots.append(slot)
    plan.keys.append(key)
    plan.known.append(known)
    return True


def _with_retry(plan: StreamPlan, table: Sequence[int], used: Sequence[float], at: float,
                idle_s: float) -> StreamPlan:
    """When a slot turns idle: the slots this batch uses are used now."""
    taken = {slot for slot in plan.slots if slot >= 0}
    last = [at if slot in taken else used[slot] for slot in range(len(table))]
    wait = min(last, default=at) + idle_s - at
    return StreamPlan(plan.lane_of_row, plan.slots, plan.keys, plan.known, plan.refused,
                      plan.evicted, max(wait, 0.0))
