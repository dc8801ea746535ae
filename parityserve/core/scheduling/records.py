"""The records one model's serving path is made of, shared by the scheduler and its drivers.

A leaf: it imports nothing of the scheduler, so the state machine (``machine.py``), the
redundancy modes (``modes.py``), the asyncio driver (``runtime/modelpath/dispatch.py``) and the
simulator (``core/simulate.py``) all import it and none of them imports another.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from parityserve.core.admission import ServiceEstimate
from parityserve.core.batching import AIMDController
from parityserve.core.deadline_queue import Entry
from parityserve.core.isolation import Bisection
from parityserve.core.redundancy import BerrutGroup, ParmGroup, SystematicGroup
from parityserve.core.scheduling.pools import DATA_POOL

__all__ = ["CodingGroup", "Failure", "GroupRun", "InflightBatch", "Query", "Replica",
           "ReplicaState", "Task", "TaskKind", "TaskOwner", "rows_of"]

CodingGroup = ParmGroup | BerrutGroup | SystematicGroup


class TaskKind(StrEnum):
    """What a task computes: queries' own batch, a ParM parity batch, a Berrut-coded batch."""

    DATA = "data"
    PARITY = "parity"
    CODED = "coded"


class ReplicaState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    DEAD = "dead"
    RETIRING = "retiring"


@dataclass(eq=False, slots=True)
class Query:
    """One queued input. ``handle`` is the driver's (the runtime's future, the simulator's
    record); the scheduler never looks into it or into ``item``."""

    item: Any
    key: tuple[str, int, bytes] | None
    handle: Any
    answered: bool = False  # an answer, rebuilt answer or failure has gone out
    method: str | None = None  # how it was rebuilt by decoding, if it was
    # A later query shares this one's work (same input): keep it wanted until then.
    wanted_until: float = 0.0


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a task failed. ``raised``: the model itself raised on the payload, so splitting the
    batch can find the rows it raised on (core/isolation.py); not so for outputs the frontend
    refused. ``bad_input``: the model blamed its input (a ValueError or TypeError)."""

    error: str
    raised: bool = False
    bad_input: bool = False


class TaskOwner(Protocol):
    """The redundancy mode that made a task: its outcome goes back to that mode, even after
    the model switched to another (``modes.Redundancy``)."""

    def on_output(self, batch: InflightBatch, outputs: Any) -> None: ...

    def on_error(self, batch: InflightBatch, failure: Failure) -> None: ...

    def take_back(self, task: Task) -> int: ...


@dataclass(eq=False)
class GroupRun:
    """A coding group in flight: the pure group plus which queries and replicas it covers."""

    core: CodingGroup
    mode: str
    entries: dict[int, list[Entry[Query]]] = field(default_factory=dict)  # data slot -> queries
    workers: dict[int, str] = field(default_factory=dict)  # coded slot -> replica that served it
    # Replicas that took a task of this group: one replica must not serve two of them, or a
    # single Byzantine (or slow) replica would count as two.
    assigned: set[str] = field(default_factory=set)
    error: str | None = None
    raised: bool = False  # a task of it failed because the model raised (see ``Failure``)
    finished: bool = False
    # The group watches its tasks but does not own them: each task points at its group, and a
    # strong list back would make every group a reference cycle that only Python's cyclic
    # collector frees. With one group per k queries that was ~15 cyclic objects per query,
    # and the frontend's collector passes over them (10-66 ms each, every few seconds at
    # 150 q/s) landed in ParM's p99.9. The queues and in-flight batches own a task; one that
    # is gone from here was dropped by all of them, so it neither runs nor waits to run.
    _task_refs: list[weakref.ReferenceType[Task]] = field(default_factory=list, repr=False)

    @property
    def tasks(self) -> list[Task]:
        """The group's tasks still held anywhere, in the order they joined."""
        return [t for r in self._task_refs if (t := r()) is not None]

    def add_task(self, task: Task) -> None:
        self._task_refs.append(weakref.ref(task))

    def needs(self, task: Task) -> bool:
        """A group keeps wanting tasks while any of its queries waits for an answer."""
        if self.finished:
            return False
        pending = any(not e.item.answered for es in self.entries.values() for e in es)
        if task.kind == TaskKind.DATA:
            # An original whose own queries were rebuilt is no longer needed, except by ParM,
            # whose later decodes subtract it.
            return any(not e.item.answered for e in task.entries) or (
                pending and self.mode == "parm")
        return pending

    def unanswered(self) -> list[Entry[Query]]:
        return [e for es in self.entries.values() for e in es if not e.item.answered]


@dataclass(eq=False)
class Task:
    """One unit of work for a replica: a batch of queries, a copy of one, or a coded batch.

    ``entries`` are the queries its output answers directly (none for parity and Berrut-coded
    tasks, whose outputs only feed a decoder). ``group``/``slot`` place it in a coding group;
    a replicated or re-issued task is the same object sent to several replicas.
    """

    payload: object
    entries: list[Entry[Query]]
    via: TaskOwner  # the mode that made it (modes can change live)
    pool: str = DATA_POOL
    kind: TaskKind = TaskKind.DATA
    group: GroupRun | None = None
    slot: int = -1
    done: bool = False  # its output arrived (from any copy): later copies are not needed
    running: int = 0  # replicas working on it now
    # A part of a failed batch being split to find the rows the model raises on; None: a
    # batch as formed (core/isolation.py).
    split: Bisection | None = None
    rows: int = field(init=False)  # rows of the payload: what the replica computes

    def __post_init__(self) -> None:
        self.rows = rows_of(self.payload)

    def needed(self) -> bool:
        if self.done:
            return False
        if self.group is not None:
            return self.group.needs(self)
        return any(not e.item.answered for e in self.entries)


def rows_of(payload: object) -> int:
    size = getattr(payload, "__len__", None)  # not isinstance(Sized): the hot path
    return int(size()) if size is not None else 1


@dataclass(eq=False)
class InflightBatch:
    """A task sent to one replica, under the batch id its result must name."""

    bid: int
    replica: Replica
    entries: list[Entry[Query]]
    sent_at: float
    task: Task


@dataclass(eq=False)
class Replica:
    """What scheduling knows of one replica. The runtime adds its process bookkeeping
    (``runtime.modelpath.dispatch.Replica``); the fields here are keyword-only so it can."""

    rid: str
    index: int
    aimd: AIMDController
    state: str = field(default=ReplicaState.STARTING, kw_only=True)
    pool: str = field(default=DATA_POOL, kw_only=True)  # the data pool, or parity<j>
    batch: InflightBatch | None = field(default=None, kw_only=True)
    served: int = field(default=0, kw_only=True)
    located: int = field(default=0, kw_only=True)  # results the error locator excluded
    # Summed over its answered batches: send to result as the frontend saw it, and the time
    # the worker says it spent (predict plus any injected delay). The difference is transport
    # and socket queueing: what the replica is held for beyond its own work.
    round_trip_s: float = field(default=0.0, kw_only=True)
    worker_s: float = field(default=0.0, kw_only=True)
    # Its own service estimate (data batches it computed); admission pools the replicas'.
    service: ServiceEstimate = field(default_factory=ServiceEstimate, kw_only=True)

    @property
    def idle(self) -> bool:
        return self.state == ReplicaState.READY and self.batch is None
