"""A ``Scheduler`` driven by hand: plain events in, each action written down as a short line
(``test_scheduler.py``). Times are relative to ``T0``; outputs echo the inputs (a linear
model, which every code decodes exactly or nearly so)."""

from __future__ import annotations

from typing import Any

import numpy as np

from parityserve.core.batching import AIMDController
from parityserve.core.deadline_queue import Entry
from parityserve.core.scheduling import (
    Action,
    Answer,
    Batching,
    CodingFailed,
    Expire,
    Fail,
    Late,
    Located,
    ModeSettings,
    Query,
    Redundant,
    Replica,
    Scheduler,
    Send,
    WakeAt,
)

T0 = 1000.0
SLO = 0.1


def stack(entries: list[Entry[Query]]) -> Any:
    return np.stack([e.item.item for e in entries])


def line(action: Action) -> str:
    """One action as a line: ``send r0 data [0]``, ``answer [1] parm-subtraction``..."""
    def qids(entries: Any) -> list[int]:
        return [e.item.handle for e in entries]

    if isinstance(action, Send):
        task = action.batch.task
        what = qids(task.entries) if task.entries else task.slot
        return f"send {action.batch.replica.rid} {task.kind} {what}"
    if isinstance(action, Answer):
        return f"answer {qids(action.entries)}" + (f" {action.method}" if action.method else "")
    if isinstance(action, Expire | Fail | Late):
        return f"{type(action).__name__.lower()} {qids(action.entries)}"
    if isinstance(action, WakeAt):
        return f"wake +{round((action.when - T0) * 1000, 6):g}ms"
    if isinstance(action, Redundant):
        return f"+{action.kind}"
    if isinstance(action, Located):
        return f"located {action.rid}"
    assert isinstance(action, CodingFailed)
    return f"coding failed: {action.message}"


class Rig:
    def __init__(self, mode: ModeSettings, *, max_batch: int = 8, max_delay_s: float = 0.0,
                 slo_s: float = SLO, busy_delay_s: float = 0.0) -> None:
        self.machine = Scheduler(Batching(max_batch, max_delay_s, busy_delay_s), mode,
                                 slo_s=slo_s, max_queue=100, assemble=stack)
        self.now = T0
        self.lines: list[str] = []
        self.actions: list[Action] = []
        self.queries: list[Query] = []

    def record(self, actions: list[Action]) -> list[Action]:
        self.actions += actions
        self.lines += [line(a) for a in actions]
        return actions

    def add(self, rid: str, *, pool: str = "data", initial: int = 1,
            state: str = "ready") -> Replica:
        aimd = AIMDController(self.machine.batching.max_batch_size, SLO, initial=initial)
        replica = Replica(rid, len(self.machine.replicas), aimd, state=state, pool=pool)
        self.machine.replicas[rid] = replica
        return replica

    def submit(self, value: Any = None, ttl: float = 10.0) -> Query:
        qid = len(self.queries)
        item = np.asarray([float(qid)] if value is None else value, dtype=np.float32)
        query = Query(item, None, qid)
        self.queries.append(query)
        self.record(self.machine.submit(query, self.now + ttl, self.now))
        return query

    def at(self, dt: float) -> Rig:
        self.now += dt
        return self

    def echo(self, rid: str, *, plus: float = 0.0) -> None:
        """The replica answers what it holds: outputs = inputs (+ ``plus``: a wrong answer)."""
        batch = self.machine.replicas[rid].batch
        assert batch is not None, f"{rid} holds nothing"
        outputs = np.asarray(batch.task.payload) + np.float32(plus)
        self.record(self.machine.task_output(batch, outputs, self.now))

    def fail(self, rid: str, error: str = "boom") -> None:
        batch = self.machine.replicas[rid].batch
        assert batch is not None, f"{rid} holds nothing"
        self.record(self.machine.task_error(batch, error, self.now))

    def crash(self, rid: str) -> int:
        """The supervisor's way: take its work back, the replica is gone, pump."""
        replica = self.machine.replicas[rid]
        back = self.machine.take_back(replica)
        replica.state = "dead"
        self.record(self.machine.pump_at(self.now))
        return back

    def ready(self, rid: str) -> None:
        self.machine.replicas[rid].state = "ready"
        self.record(self.machine.pump_at(self.now))

    def tick(self) -> None:
        """The last wake-up asked for is due."""
        wakes = [a.when for a in self.actions if isinstance(a, WakeAt)]
        self.now = max(self.now, wakes[-1])
        self.record(self.machine.tick(self.now))

    def answers(self) -> dict[int, Any]:
        """Query -> its answer's row (or method, for Expire/Fail: the action's type)."""
        out: dict[int, Any] = {}
        for action in self.actions:
            if isinstance(action, Answer):
                for entry, row in zip(action.entries, action.outputs, strict=True):
                    out[entry.item.handle] = np.asarray(row).tolist()
            elif isinstance(action, Expire | Fail):
                for entry in action.entries:
                    out[entry.item.handle] = type(action).__name__
        return out
