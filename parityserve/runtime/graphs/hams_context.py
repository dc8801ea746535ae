"""What every piece of one graph's runtime shares, and the records it hands out.

``GraphRuntime`` (``hams_graph``) is a thin face over pieces with one job each:
``hams_requests`` (admission, answers and their release), ``hams_dispatch`` (batches to
operators, and the watchdog over them), ``hams_inbox`` (what operators say, parsed once),
``hams_membership`` (the processes, by id), ``hams_watch`` (failure detection),
``hams_recovery`` (performing ``RecoveryPlan``'s actions), ``hams_handover`` (what a member
is told when state changes hands), ``hams_baselines`` (bare and
checkpoint-replay) and ``hams_inspect`` (statistics and state digests). They share one
``GraphContext``: the graph, its clock, router and link, the batches in flight, the plan, and
whether the graph is paused or broken. Every piece logs under one name, the runtime's.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from parityserve.config import Deployment, Graph
from parityserve.core.hams import (
    FRONTEND,
    Executed,
    Failover,
    GraphRouter,
    Heard,
    InFlight,
    RecoveryPlan,
    plan_failover,
)
from parityserve.core.hams.placement import ROLES
from parityserve.errors import Unavailable
from parityserve.runtime.graphs import hams_messages as hm
from parityserve.runtime.graphs.hams_members import Member
from parityserve.runtime.graphs.hams_replay import ReplayLog
from parityserve.runtime.workers.rpc import WorkerLink

__all__ = ["UNHELD", "Batch", "FailoverRecord", "GraphAnswer", "GraphContext", "Infer", "Pair",
           "log"]

log = logging.getLogger("parityserve.runtime.graphs.hams_graph")

Infer = Callable[[str, np.ndarray], Awaitable[np.ndarray]]
Batch = list[Executed[np.ndarray]]
UNHELD = ("bare", "checkpoint-replay")  # modes without a backup: replies leave at once


@dataclass(frozen=True)
class GraphAnswer:
    client: int
    output: np.ndarray
    seqs: dict[str, int]  # the request's sequence number at every operator it passed


@dataclass
class FailoverRecord:
    """One recovery, with its phases on the frontend's clock (H13's breakdown)."""

    op: str
    detection: str  # "exit" or "timeout"
    detected_at: float
    lost_pid: int
    protocol_done_at: float = 0.0
    first_reply_at: float | None = None
    bounds: dict[str, int] = field(default_factory=dict)
    rolled_back_in_place: list[str] = field(default_factory=list)
    discarded_replies: int = 0
    replayed: int = 0  # checkpoint-replay: batches run again

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "detection": self.detection, "lost_pid": self.lost_pid,
                "detected_at": self.detected_at, "protocol_done_at": self.protocol_done_at,
                "first_reply_at": self.first_reply_at, "bounds": self.bounds,
                "rolled_back_in_place": self.rolled_back_in_place,
                "discarded_replies": self.discarded_replies, "replayed_batches": self.replayed,
                "protocol_ms": round((self.protocol_done_at - self.detected_at) * 1e3, 3)}


@dataclass
class Pair:
    """A stateful operator's members by role (what the plan says, for everyone to read)."""

    op: str
    primary: Member | None = None
    backup: Member | None = None
    spare: Member | None = None


class GraphContext:
    def __init__(self, graph: Graph, deployments: dict[str, Deployment],
                 clock: Callable[[], float], router: GraphRouter[np.ndarray],
                 link: WorkerLink, store: str) -> None:
        self.graph, self.clock, self.router, self.link = graph, clock, router, link
        self.deployments = deployments
        self.topology = router.topology
        self.mode = graph.fault_tolerance
        self.ops = {op.name: op for op in graph.operators}
        self.store = store  # checkpoint-replay's "global storage": a private folder
        self.pairs = {op: Pair(op) for op in self.topology.stateful}
        # what a stateful operator's state depends on: previous stateful operators and itself
        self.watched = {op: frozenset((*self.topology.prev_stateful(op), op)) - {FRONTEND}
                        for op in self.pairs}
        self.replay = {op: ReplayLog() for op in self.pairs}  # checkpoint-replay only
        self.heard = {op: Heard() for op in self.pairs}  # outputs here: what may be applied
        # every operator's batches in flight (the watchdog's and readiness's view)
        self.inflight: dict[str, InFlight[Batch]] = {
            op: InFlight(clock()) for op in self.topology.operators}
        self.plan: RecoveryPlan | None = None  # hams and remus: every recovery, one plan
        self.recovery = asyncio.Lock()  # bare and checkpoint-replay: one recovery at a time
        self.paused = False
        self.broken: str | None = None
        self.failovers: list[FailoverRecord] = []
        self.tasks: set[asyncio.Task[Any]] = set()

    @property
    def held(self) -> bool:
        """Replies wait for a backup (hams, remus): there are backups and spares."""
        return self.mode not in UNHELD

    def member_roles(self) -> dict[str, str]:
        """Worker id -> its role now, as the plan says (placement keeps roles apart)."""
        return {m.worker_id: role for pair in self.pairs.values()
                for role in ROLES
                if (m := getattr(pair, role)) is not None}

    def failover_plan(self, resumed: Mapping[str, int], epoch: int) -> Failover:
        """``plan_failover`` over what the router saw: which other operators ran on the
        speculation the operators that took over discard (``RecoveryPlan``'s planner)."""
        router, topology = self.router, self.topology
        applied = {op: router.commit.durable[op] for op in topology.stateful}
        applied.update(resumed)
        executed = {op: router.executed(op) for op in topology.operators}
        executed[FRONTEND] = router.held()
        return plan_failover(topology, resumed, applied, executed, epoch)

    def checkpoint_path(self, op: str) -> str:
        return os.path.join(self.store, f"{op}.ckpt") if self.store else ""

    def spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def send(self, member: Member, header: dict[str, Any], frames: list[Any] | None = None
             ) -> None:
        try:
            self.link.send(member.worker_id, header, frames)
        except Exception as exc:  # not connected (yet, or any more): the monitor decides
            log.debug("cannot reach %s: %s", member.worker_id, exc)

    def tell(self, member: Member, message: hm.Order) -> None:
        self.send(member, *message.to_wire())

    async def ask(self, member: Member, kind: str, message: hm.Order,
                  timeout_s: float = 5.0) -> Any:
        """Send and wait for the answer; a member that exits meanwhile fails it at once."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        member.extra[kind] = future
        self.tell(member, message)
        return await self.answer(member, kind, message.KIND, future, timeout_s)

    async def answer(self, member: Member, kind: str, asked: str,
                     future: asyncio.Future[Any], timeout_s: float) -> Any:
        deadline = self.clock() + timeout_s
        while not future.done():
            if member.exited() or self.clock() > deadline:
                member.extra.pop(kind, None)
                raise Unavailable(f"{member.worker_id} did not answer {asked}")
            await asyncio.wait([future], timeout=0.005)
        return future.result()
