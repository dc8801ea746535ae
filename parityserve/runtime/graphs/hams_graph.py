"""Serving one stateful service graph (HAMS): the asyncio driver around ``core.hams``.

The frontend's graph router is every operator's request manager (decision H10, see
``core/hams/requests.py``): each client request enters the router, which numbers it at
every operator in execution order, carries its lineage, joins fan-ins and holds the reply
until every state in its lineage is durable. This module only moves data:

* a **stateless** operator's batch goes to its deployed model through the ordinary model
  path (replicas, restarts and re-queueing of a crashed replica's batch included);
* a **stateful** operator has a primary, a hot backup and a warm spare process
  (``hams_worker``). The primary answers batches; its backup tells us what is durable;
  we forward that to the next stateful operators' backups and release replies;
* a lost primary is replaced by its backup (``plan_failover`` says which other operators
  must roll back with it), the spare becomes the new backup, and a new spare is started.
  A member silent past ``heartbeat_timeout_ms`` whose process exists is only suspected:
  it is fenced if another member holds its state, else kept and waited for until it
  speaks again (``RecoveryPlan.suspected``; issue 39: under load, a promoted backup
  starved past the timeout was fenced, and the graph gave up for good).

One client never hurts another (issue 38): rows of two shapes never share an operator batch,
and rows that do not fit the shape the graph declares (``Graph.door``; never one learned from
traffic, which a client could choose) are refused at the door; an operator's refusal fails
the refused rows alone (a stateless operator's batch is searched for them, ``RowBisection``;
a stateful primary searches its own and says which it refused);
no exception on the send or answer path leaves a batch in flight; and a watchdog fails, and
counts, any batch in flight past the graph's ``timeout_ms``, so a graph heals instead of
wedging, while ``ready()`` says no for as long as an operator finishes nothing.

Everything that decides is in ``core/hams``; what is here is sockets, processes and timers.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import logging
import os
import shutil
import tempfile
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from parityserve.config import Deployment, Graph
from parityserve.core.hams import (
    FRONTEND,
    Executed,
    Failover,
    GraphRouter,
    Heard,
    Held,
    InFlight,
    OutputCommit,
    RecoveryPlan,
    RowBisection,
    admits,
    client_of,
    frontier,
    plan_failover,
    seq_at,
)
from parityserve.core.hams.door import StreamGate
from parityserve.core.hams.recovery_plan import (
    Allow,
    Attach,
    Fail,
    Fence,
    Inform,
    Pause,
    Promote,
    RecoveryAction,
    Resume,
    RollBack,
    Start,
    Suspect,
)
from parityserve.errors import (
    DeadlineExceeded,
    InvalidInput,
    ModelError,
    ModelLoadError,
    PredictError,
    ProtocolError,
    ServiceError,
    TooManyStreams,
    Unavailable,
    UnknownModel,
    WorkerError,
)
from parityserve.runtime.graphs import hams_messages as hm
from parityserve.runtime.graphs import hams_protocol as hp
from parityserve.runtime.graphs.hams_members import Member, MemberLauncher
from parityserve.runtime.graphs.hams_replay import ReplayLog
from parityserve.runtime.workers.keys import ServerKeys
from parityserve.runtime.workers.rpc import RejectLog, WorkerLink

__all__ = ["FailoverRecord", "GraphAnswer", "GraphRuntime"]

log = logging.getLogger(__name__)

Infer = Callable[[str, np.ndarray], Awaitable[np.ndarray]]
Batch = list[Executed[np.ndarray]]
_IN_FLIGHT = 2  # batches per operator at once: the next one waits at the worker, no gap
_RELEASED_KEPT = 100_000  # answered requests remembered to drop a late duplicate
_CHECK_EVERY_S = 0.005
_START_TRIES = 3  # a member killed while loading at start is launched again this often
_REDISPATCH_S = 0.02  # first wait before a row with applied state goes to a replica again
_UNHELD = ("bare", "checkpoint-replay")  # modes without a backup: replies leave at once
_REPORT_KINDS = (hp.HELLO, hp.BEAT, hp.OUT, hp.FAILED, hp.CHECKPOINT, hp.DURABLE, hp.PROMOTED,
                 hp.ALLOW, hp.DIGEST)  # what an operator may say to the frontend


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
class _Pair:
    op: str
    primary: Member | None = None
    backup: Member | None = None
    spare: Member | None = None


@dataclass
class _Waiting:
    stream: str
    label: int
    future: asyncio.Future[GraphAnswer]
    name: str = ""  # how an error names the row: "input_batch[3]: " in a request of several


class GraphRuntime:
    def __init__(self, graph: Graph, deployments: dict[str, Deployment], infer: Infer, *,
                 keys: ServerKeys | None, clock: Callable[[], float],
                 log_dir: Path | None = None, host: str = "127.0.0.1") -> None:
        self.graph, self.clock, self._infer = graph, clock, infer
        self.topology = graph.topology()
        self.mode = graph.fault_tolerance
        self._ops = {op.name: op for op in graph.operators}
        self._deployments = deployments
        self.router: GraphRouter[np.ndarray] = GraphRouter(self.topology, _combine)
        if self.mode in _UNHELD:  # nothing waits for a backup, so nothing is held
            self.router.commit = OutputCommit(())
        self.link = WorkerLink(host, 0, keys=keys, on_reject=RejectLog())
        self._host = host
        # primary -> backup on this host: Unix sockets in a folder only this user can enter
        self._ipc_dir = tempfile.mkdtemp(prefix="parityserve-hams-") \
            if graph.state_link == "unix" else ""
        # checkpoint-replay's "global storage": a private folder; its log is in ``replay``
        self._store = tempfile.mkdtemp(prefix="parityserve-ckpt-") \
            if self.mode == "checkpoint-replay" else ""
        self.launcher = MemberLauncher(self.link, keys, log_dir)
        self.pairs = {op: _Pair(op) for op in self.topology.stateful}
        # what a stateful operator's state depends on: previous stateful operators and itself
        self._watched = {op: frozenset((*self.topology.prev_stateful(op), op)) - {FRONTEND}
                         for op in self.pairs}
        self.replay = {op: ReplayLog() for op in self.pairs}  # checkpoint-replay only
        self._members: dict[str, tuple[str, Member]] = {}
        self._waiting: dict[int, _Waiting] = {}
        self._abandoned: dict[int, _Waiting] = {}  # timed out, their rows still in the graph
        self._released: deque[int] = deque()
        self._clients = itertools.count(1)
        self._bids = itertools.count(1)
        # every operator's batches in flight (the watchdog's and readiness's view)
        self.inflight: dict[str, InFlight[Batch]] = {
            op: InFlight(clock()) for op in self.topology.operators}
        # declared only: learned from the first answer, one client chose it for everyone
        self.input_shape = graph.door(deployments.values())
        # a stateful operator's "no room for a new stream until t", repeated at the door
        self.gate = StreamGate(self.topology.stateful)
        self.on_expired: Callable[[str, int], None] | None = None  # (op, batches): a metric
        self.on_protocol_error: Callable[[str], None] | None = None  # (kind): a metric
        self._rejects = RejectLog()  # a malformed message's log line, a few per peer
        self._recovery = asyncio.Lock()  # bare and checkpoint-replay: one recovery at a time
        self.plan: RecoveryPlan | None = None  # hams and remus: every recovery, one plan
        self._lost_at: dict[str, tuple[str, float, int]] = {}  # member -> (how, when, pid)
        self._heard = {op: Heard() for op in self.pairs}  # outputs here: what may be applied
        self._paused = False
        self.broken: str | None = None
        self.failovers: list[FailoverRecord] = []
        self.replay_conflicts = 0  # checkpoint-replay: replayed outputs that differed
        self.redispatched = 0  # rows with applied state sent to a stateless operator again
        self.losses: deque[dict[str, Any]] = deque(maxlen=100)  # members seen lost, newest last
        # members silent past the timeout but alive and kept as their operator's last
        # holder (issue 39), and whether they were heard from again: newest last
        self.suspects: deque[dict[str, Any]] = deque(maxlen=100)
        self.slow: dict[str, float] = {}  # injected state delays (shown in the statistics)
        self._replaying: dict[int, tuple[list[int], asyncio.Future[None]]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._monitor: asyncio.Task[None] | None = None

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self, timeout_s: float = 120.0) -> None:
        self.link.start(self._on_message)
        for pair in self.pairs.values():
            pair.primary = self._launch(pair.op, "primary")
            if self.mode not in _UNHELD:
                pair.backup = self._launch(pair.op, "backup")
                pair.spare = self._launch(pair.op, "backup")
        await asyncio.wait_for(self._all_hellos(), timeout_s)
        if self.mode not in _UNHELD:
            self.plan = RecoveryPlan({op: _ids(p) for op, p in self.pairs.items()},
                                     self._planner)
            for pair in self.pairs.values():  # every member is loaded: attach the backups
                for member in (pair.primary, pair.backup, pair.spare):
                    assert member is not None
                    self._act(self.plan.ready(member.worker_id))
        self._monitor = asyncio.get_running_loop().create_task(self._watch())

    async def _all_hellos(self) -> None:
        """Every member loaded. One killed while loading (no state yet to lose) is launched
        again; one whose model cannot load stops the start with the reason."""
        for pair in self.pairs.values():
            for role in ("primary", "backup", "spare"):
                for attempt in itertools.count(1):
                    member = getattr(pair, role)
                    if member is None:
                        break
                    try:
                        await self._hello(member)
                        break
                    except _KilledLoading:
                        if attempt >= _START_TRIES:
                            raise
                        log.warning("graph %s: %s was killed while loading; starting it "
                                    "again", self.graph.name, member.worker_id)
                        self._forget(member)
                        setattr(pair, role, self._launch(
                            pair.op, "primary" if role == "primary" else "backup"))

    async def _hello(self, member: Member) -> hm.Hello:
        while not member.hello.done():
            if member.exited():
                code = member.popen.returncode
                error = _KilledLoading if code < 0 else ModelLoadError  # a signal, not a
                raise error(f"operator process {member.worker_id} exited with "  # reason
                            f"{code} before it said hello")
            await asyncio.sleep(0.02)
        return member.hello.result()

    def _launch(self, op: str, role: str) -> Member:
        model = self._deployments[self._ops[op].model]
        spec = hp.OperatorSpec(
            worker_id=self.launcher.next_id(self.graph.name, op, role), op=op,
            source=model.source, role=role, mode=self.mode, options=dict(model.options),
            pfm=tuple(m for m in self.topology.prev_stateful(op) if m != FRONTEND),
            bind_host=self._host, ipc_dir=self._ipc_dir,
            checkpoint_every=self.graph.checkpoint_every,
            full_state_every=self.graph.full_state_every,
            checkpoint_path=self._checkpoint_path(op),
            restore_seq=self.replay[op].checkpoint if op in self.replay else 0)
        member = self.launcher.start(spec, self.clock())
        self._members[member.worker_id] = (op, member)
        return member

    async def close(self) -> None:
        if self._monitor is not None:
            self._monitor.cancel()
        for task in list(self._tasks):
            task.cancel()
        for _, member in list(self._members.values()):
            self.launcher.forget(member)
        self._break("the graph is shutting down")
        await self.link.close()
        for folder in (self._ipc_dir, self._store):
            if folder:
                shutil.rmtree(folder, ignore_errors=True)

    def ready(self) -> bool:
        """Not broken, every primary up, and no operator stalled: one that has had work
        for longer than ``timeout_ms`` without finishing a batch is as good as wedged."""
        return self.broken is None and all(
            p.primary is not None and p.primary.hello.done() for p in self.pairs.values()) \
            and not self.stalled()

    def stalled(self) -> list[str]:
        now, limit = self.clock(), self.graph.timeout_ms / 1000
        return [op for op, out in self.inflight.items()
                if out.stalled(now, limit, self.router.managers[op].queued())]

    # ---- queries ---------------------------------------------------------------------------
    async def predict(self, rows: Sequence[np.ndarray], streams: Sequence[str],
                      labels: Sequence[int], timeout_s: float) -> list[GraphAnswer]:
        if self.broken is not None:
            raise Unavailable(f"graph {self.graph.name!r} lost state it cannot rebuild: "
                              f"{self.broken}")
        self._check_shapes(rows)
        self._check_gate(streams)
        loop = asyncio.get_running_loop()
        futures, clients = [], []
        origin = object()  # this request's rows take turns with other requests' in batches
        for i, (row, stream, label) in enumerate(zip(rows, streams, labels, strict=True)):
            client = next(self._clients)
            waiting = _Waiting(stream, label, loop.create_future(),
                               f"input_batch[{i}]: " if len(rows) > 1 else "")
            self._waiting[client] = waiting
            clients.append(client)
            futures.append(waiting.future)
            self.router.submit(client, row, origin)
        self._pump_all()
        done, pending = await asyncio.wait(futures, timeout=timeout_s)
        for client in clients:  # given up on: nobody waits for it any more, but its row
            if (gone := self._waiting.pop(client, None)) is not None:  # still runs on its
                self._abandoned[client] = gone  # stream, and is collected when it leaves
        if pending:
            raise DeadlineExceeded(f"graph {self.graph.name!r} did not answer within "
                                   f"{timeout_s:g} s ({len(pending)} of {len(futures)} rows)")
        return [f.result() for f in futures]

    def _check_shapes(self, rows: Sequence[np.ndarray]) -> None:
        """A row that does not fit the declared shape is refused here, before it enters
        any batch. With none declared, every row goes on and stands or falls alone."""
        shape = self.input_shape
        for i, row in enumerate(rows):
            if not admits(np.shape(row), shape):
                where = f"input_batch[{i}]" if len(rows) > 1 else "the input"
                raise InvalidInput(f"graph {self.graph.name!r} takes rows of shape "
                                   f"{list(shape or ())} (declared; -1 is any size); "
                                   f"{where} has shape {list(np.shape(row))}")

    def _check_gate(self, streams: Sequence[str]) -> None:
        """A new stream while an operator on the way says its table has no room: the 429
        it would answer, now, before the rows cross the operators ahead of it."""
        closed = self.gate.closed(streams, self.clock())
        if closed is None:
            return
        where = f"input_batch[{closed.row}]: " if len(streams) > 1 else ""
        raise TooManyStreams(
            f"{where}{closed.reason or closed.op + ': no room for a new stream'} (refused at "
            f"the graph's door: {closed.op} takes no new stream for {closed.retry_after_s:.3g} "
            "s more, and this one is new to it)", closed.retry_after_s)

    # ---- dispatch --------------------------------------------------------------------------
    def _pump_all(self) -> None:
        if self._paused:
            return
        for op in self.topology.operators:
            try:
                if op in self.pairs:
                    self._pump_stateful(self.pairs[op])
                else:
                    self._pump_stateless(op)
            except Exception:  # a bug: the other operators still run; readiness tells
                log.exception("graph %s: dispatching to %s failed", self.graph.name, op)

    def _pump_stateful(self, pair: _Pair) -> None:
        primary = pair.primary
        if primary is None or primary.lost or not primary.hello.done():
            return
        manager, out = self.router.managers[pair.op], self.inflight[pair.op]
        while len(out) < _IN_FLIGHT and manager.queued():
            batch = self.router.batch(pair.op, self.graph.max_batch, np.shape)
            if self.plan is not None:  # its state may change from now: only copies hold it
                self.plan.dispatched(pair.op)
            self._send_batch(pair.op, primary, next(self._bids), batch)

    def _send_batch(self, op: str, primary: Member, bid: int, batch: Batch) -> None:
        """Pack, log (checkpoint-replay), put in flight, send: a step that raises fails the
        batch's rows now, and takes it out of flight, rather than leave it there for good."""
        try:
            header, frames = self._batch_message(op, bid, batch).to_wire()
            if self.mode == "checkpoint-replay":
                self.replay[op].logged(header, frames)
            self.inflight[op].add(bid, batch, self.clock())
            self._send(primary, header, frames)
        except Exception as exc:
            log.exception("graph %s: sending a batch to %s failed", self.graph.name, op)
            self.inflight[op].pop(bid, self.clock())
            self._outputs_heard(op, batch)  # numbered, never run: no state waits for it
            self._fail_batch(op, batch, PredictError(f"{op}: the batch could not be sent: "
                                                     f"{type(exc).__name__}: {exc}"))

    def _batch_message(self, op: str, bid: int, batch: Batch) -> hm.Batch:
        """The batch for ``op``'s primary. Its state will depend on ``needs``: the highest
        number each row carries at each previous stateful operator and at ``op`` (Alg. 2
        needs no more than this frontier, not a lineage per row)."""
        rows = [self._waiting.get(c) or self._abandoned.get(c)
                for c in (client_of(e.lineage) for e in batch)]
        return hm.Batch(bid, tuple(e.seq for e in batch),
                        np.stack([e.arrival.payload for e in batch]),
                        tuple(w.stream if w is not None else "" for w in rows),
                        tuple(w.label if w is not None else -1 for w in rows),
                        frontier((e.lineage for e in batch), self._watched[op]),
                        self.clock())  # the operator's now: a stream table's idle time

    def _pump_stateless(self, op: str) -> None:
        manager, out = self.router.managers[op], self.inflight[op]
        while len(out) < _IN_FLIGHT and manager.queued():
            batch = self.router.batch(op, self.graph.max_batch, np.shape)
            bid = next(self._bids)
            out.add(bid, batch, self.clock())
            self._spawn(self._run_stateless(op, bid, batch))

    async def _run_stateless(self, op: str, bid: int, batch: Batch) -> None:
        try:
            outcomes = await self._redispatched(
                op, bid, batch, await self._isolated(self._ops[op].model, batch))
        except Exception as exc:  # never leave the batch in flight: fail its rows
            log.exception("graph %s: operator %s failed", self.graph.name, op)
            outcomes = [exc] * len(batch)
        if self.inflight[op].pop(bid, self.clock()) is not None:  # else: the watchdog's
            self._deliver(op, batch, outcomes)
        self._pump_all()

    async def _redispatched(self, op: str, bid: int, batch: Batch,
                            outcomes: list[np.ndarray | Exception]
                            ) -> list[np.ndarray | Exception]:
        """A row that has passed a stateful operator changed its state: failing it for want
        of a replica (one killed, restarting, backing off; the model path's own deadline
        passed meanwhile) would have its client send it again and apply it twice. Such
        rows go again, to a restarted or other replica, for as long as the batch is in
        flight (the watchdog's timeout_ms bounds it, as for every batch)."""
        delay = _REDISPATCH_S
        while bid in self.inflight[op]:
            again = [i for i, o in enumerate(outcomes)
                     if isinstance(o, ServiceError | WorkerError)  # no row's fault:
                     and self._applied_state(batch[i])]  # no replica, or none in time
            if not again:
                break
            await asyncio.sleep(delay)
            delay = min(2 * delay, 0.5)
            self.redispatched += len(again)
            retried = await self._isolated(self._ops[op].model, [batch[i] for i in again])
            for i, outcome in zip(again, retried, strict=True):
                outcomes[i] = outcome
        return outcomes

    def _applied_state(self, entry: Executed[np.ndarray]) -> bool:
        return any(hop.op in self.pairs for hop in entry.lineage)

    async def _isolated(self, model: str, batch: Batch) -> list[np.ndarray | Exception]:
        """Each row's output or error. A batch the model raises on is split and its halves
        run again until each bad row has failed alone; an error that is no row's fault (no
        replica, overload, a deadline) fails the part as it is."""
        plan: RowBisection[Exception] = RowBisection(len(batch))
        answered: dict[int, np.ndarray] = {}
        while (part := plan.next_part()) is not None:
            try:
                outputs = await self._infer(model, np.stack([batch[i].arrival.payload
                                                             for i in part]))
                if len(outputs) != len(part):
                    raise PredictError(f"model {model!r} answered {len(outputs)} rows for "
                                       f"{len(part)}")
            except (ModelError, InvalidInput, ValueError, TypeError) as exc:
                plan.failed(part, exc)
            except Exception as exc:
                plan.failed(part, exc, culprits=part)
            else:
                plan.passed(part)
                answered.update(zip(part, (np.asarray(o) for o in outputs), strict=True))
        return [answered[i] if i in answered else plan.errors[i] for i in range(len(batch))]

    def _deliver(self, op: str, batch: Batch, outcomes: Sequence[np.ndarray | Exception]
                 ) -> None:
        """Each row's output goes on through the graph; each error fails its request. A row
        whose output cannot go on fails alone."""
        for entry, outcome in zip(batch, outcomes, strict=True):
            try:
                if isinstance(outcome, Exception):
                    self._refuse(op, entry, outcome)
                else:
                    self._output(op, entry, outcome)
            except Exception as exc:
                log.exception("graph %s: %s's output could not go on", self.graph.name, op)
                self._refuse(op, entry, PredictError(
                    f"{op}: its output could not go on: {type(exc).__name__}: {exc}"))

    def _output(self, op: str, entry: Executed[np.ndarray], row: np.ndarray) -> None:
        """An operator answered ``entry``; ignored when a failover renumbered it since."""
        if self.router.managers[op].current(entry.seq) is not entry or entry.done:
            return
        if op in self.pairs:  # it answered a row of this stream: the stream has a slot
            self.gate.took(op, self._stream_of(client_of(entry.lineage)))
        self._release(self.router.output(op, entry.seq, row))

    def _stream_of(self, client: int) -> str:
        waiting = self._waiting.get(client) or self._abandoned.get(client)
        return "" if waiting is None else waiting.stream

    def _fail_batch(self, op: str, batch: Batch, exc: Exception) -> None:
        for entry in batch:
            self._refuse(op, entry, exc)

    def _refuse(self, op: str, entry: Executed[np.ndarray], exc: Exception) -> None:
        """The operator refused this row (bad input, no room, a model error). Its client
        gets the error now: an error shows no state, so it waits for no durability. The row
        stops here, and its request leaves the graph everywhere."""
        manager = self.router.managers[op]
        if manager.current(entry.seq) is not entry or entry.done:
            return  # a failover renumbered it, or it was answered already
        manager.record(entry.seq, np.empty(0))
        if isinstance(exc, TooManyStreams) and op in self.pairs:
            self.gate.refused(op, self.clock(), exc.retry_after_s, str(exc))
        client = client_of(entry.lineage)
        self._abandoned.pop(client, None)
        waiting = self._waiting.pop(client, None)
        if waiting is not None and not waiting.future.done():
            waiting.future.set_exception(_named(exc, waiting.name))
            waiting.future.exception()  # retrieved: a client that left logs nothing
        self.router.collect(client)

    def _release(self, held: list[Held[np.ndarray]]) -> None:
        now = self.clock()
        for reply in held:
            self._note_first_reply(reply, now)
            self._abandoned.pop(reply.client, None)
            waiting = self._waiting.pop(reply.client, None)
            if waiting is not None and not waiting.future.done():
                seqs = {h.op: h.seq for h in reply.lineage}
                waiting.future.set_result(GraphAnswer(reply.client, reply.reply, seqs))
            self.router.collect(reply.client)
            self._released.append(reply.client)
            if len(self._released) > _RELEASED_KEPT:
                self.router.commit.forget(self._released.popleft())

    def _note_first_reply(self, reply: Held[np.ndarray], now: float) -> None:
        for record in self.failovers:
            if record.first_reply_at is None:
                seq = seq_at(reply.lineage, record.op)
                if seq is not None and seq > record.bounds.get(record.op, 0):
                    record.first_reply_at = now

    # ---- messages from operator processes --------------------------------------------------
    def _on_message(self, worker_id: str, header: dict[str, Any], buffers: list[Any]) -> None:
        found = self._members.get(worker_id)
        if found is None:
            return
        op, member = found
        member.last_beat = self.clock()  # any message shows the process is alive
        if member.lost is not None and self.plan is not None \
                and worker_id in self.plan.suspects():
            self._heard_again(member)
        try:
            message = hm.parse_report(header, buffers)  # the one place a message is read
        except ProtocolError as exc:
            self._malformed(op, member, header.get("t"), exc)
            return
        try:
            self._handle(op, member, message)
        except Exception:  # whatever it was, no batch stays in flight for it: see _on_outputs
            log.exception("graph %s: %s's %s message failed", self.graph.name, worker_id,
                          message.KIND)

    def _malformed(self, op: str, member: Member, kind: Any, exc: ProtocolError) -> None:
        """Dropped and counted, never raised; an unreadable answer to a batch in flight
        fails that batch (its clients would otherwise wait for the watchdog)."""
        kind = kind if kind in _REPORT_KINDS else "unknown"  # a bounded metric label
        self._rejects(member.worker_id, "malformed", f"dropping a malformed {kind} message "
                      f"of graph {self.graph.name}: {exc}")
        if self.on_protocol_error is not None:
            self.on_protocol_error(kind)
        if isinstance(exc, hm.BadAnswer) and member is self.pairs[op].primary:
            batch = self.inflight[op].pop(exc.bid, self.clock())
            if batch is not None:
                self._outputs_heard(op, batch)
                self._fail_batch(op, batch, PredictError(
                    f"{op}: its answer could not be read: {exc}"))
                self._pump_all()

    def _handle(self, op: str, member: Member, message: hm.Report) -> None:
        if isinstance(message, hm.Hello):
            if not member.hello.done():
                member.hello.set_result(message)
                if self.plan is not None:
                    self._act(self.plan.ready(member.worker_id))
        elif isinstance(message, hm.Out):
            self._on_outputs(self.pairs[op], member, message)
        elif isinstance(message, hm.Checkpointed):
            self._checkpointed(op, message.seq)
        elif isinstance(message, hm.Durable):
            self._on_durable(self.pairs[op], member, message.seq)
        elif isinstance(message, hm.Promoted | hm.Allowed | hm.Digest):
            future = member.extra.pop(message.KIND, None)
            if future is not None and not future.done():
                future.set_result(message)
        elif isinstance(message, hm.Failed) and not member.hello.done():
            member.hello.set_exception(ModelLoadError(f"{op}: {message.error}"))
            member.hello.exception()  # the start raises it once, for the first member

    def _on_outputs(self, pair: _Pair, member: Member, message: hm.Out) -> None:
        bid = message.bid
        replayed = self._replaying.pop(bid, None)
        if replayed is not None:  # here, not in the replay's task: a checkpoint that follows
            seqs, done = replayed  # on the socket must not drop these outputs' log first
            try:
                if member is pair.primary:
                    self._replayed(pair.op, seqs, self._outcomes(pair.op, message, len(seqs)))
            finally:
                if not done.done():
                    done.set_result(None)
            return
        if member is not pair.primary:
            return
        batch = self.inflight[pair.op].pop(bid, self.clock())
        if batch is None:  # expired, or taken over by a failover
            return
        self._outputs_heard(pair.op, batch)
        try:
            outcomes = self._outcomes(pair.op, message, len(batch))
            if self.mode == "checkpoint-replay":
                for entry, outcome in zip(batch, outcomes, strict=True):
                    if not isinstance(outcome, Exception):
                        self.replay[pair.op].answered_one(entry.seq, outcome)
            self._deliver(pair.op, batch, outcomes)
        except Exception as exc:  # an answer that cannot be read fails what it left open
            log.exception("graph %s: %s's answer failed", self.graph.name, pair.op)
            self._fail_batch(pair.op, batch, PredictError(
                f"{pair.op}: its answer could not be read: {type(exc).__name__}: {exc}"))
        finally:
            self._pump_all()

    def _outcomes(self, op: str, message: hm.Out, n: int) -> list[np.ndarray | Exception]:
        """Each row's output, or the error its refusal becomes."""
        return [_refusal_error(op, o) if isinstance(o, hp.Refusal) else np.asarray(o)
                for o in message.outcomes(n)]

    def _outputs_heard(self, op: str, batch: Batch) -> None:
        """The batch's outcomes are here: its state may be applied now (``Heard``)."""
        pair = self.pairs[op]
        if self.plan is not None and self._heard[op].add(e.seq for e in batch) \
                and pair.backup is not None:
            self._tell(pair.backup, hm.Notify(op, self._heard[op].upto))

    def _on_durable(self, pair: _Pair, member: Member, seq: int) -> None:
        if member is pair.spare and self.plan is not None:  # seeded by a member being
            self._act(self.plan.seeded_at(member.worker_id))  # promoted: not durability
            return
        if member is not pair.backup:
            return
        if not member.extra.get("synced"):  # it holds a full state: it may be promoted now
            member.extra["synced"] = True
            if self.plan is not None:
                self._act(self.plan.seeded_at(member.worker_id))
        self._release(self.router.notify(pair.op, seq))
        for nxt in self.topology.stateful:
            if pair.op in self.topology.prev_stateful(nxt):
                backup = self.pairs[nxt].backup
                if backup is not None:
                    self._tell(backup, hm.Notify(pair.op, seq))

    def _checkpoint_path(self, op: str) -> str:
        return os.path.join(self._store, f"{op}.ckpt") if self._store else ""

    def _checkpointed(self, op: str, seq: int) -> None:
        """The operator's state after ``seq`` is stored, and its outputs are here (they came
        first on the same socket): a fresh primary starts from it now, so the log before it
        and the checkpoint before it can go. A checkpoint whose primary died before saying
        so is never restored, and stays until the graph closes its store."""
        older = self.replay[op].checkpoint
        self.replay[op].checkpointed(seq)
        if 0 < older < seq:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(hp.checkpoint_file(self._checkpoint_path(op), older))

    def _send(self, member: Member, header: dict[str, Any], frames: list[Any] | None = None
              ) -> None:
        try:
            self.link.send(member.worker_id, header, frames)
        except Exception as exc:  # not connected (yet, or any more): the monitor decides
            log.debug("cannot reach %s: %s", member.worker_id, exc)

    def _tell(self, member: Member, message: hm.Order) -> None:
        self._send(member, *message.to_wire())

    async def _ask(self, member: Member, kind: str, message: hm.Order,
                   timeout_s: float = 5.0) -> Any:
        """Send and wait for the answer; a member that exits meanwhile fails it at once."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        member.extra[kind] = future
        self._tell(member, message)
        return await self._answer(member, kind, message.KIND, future, timeout_s)

    async def _answer(self, member: Member, kind: str, asked: str,
                      future: asyncio.Future[Any], timeout_s: float) -> Any:
        deadline = self.clock() + timeout_s
        while not future.done():
            if member.exited() or self.clock() > deadline:
                member.extra.pop(kind, None)
                raise Unavailable(f"{member.worker_id} did not answer {asked}")
            await asyncio.wait([future], timeout=0.005)
        return future.result()

    # ---- backups ---------------------------------------------------------------------------
    # ---- the recovery plan's actions (hams, remus) -----------------------------------------
    def _act(self, actions: list[RecoveryAction]) -> None:
        """Perform what the plan says, then show its roles in ``pairs``. An action that
        raises is logged; the plan hears of its member through the monitor."""
        for action in actions:
            try:
                self._perform(action)
            except Exception:
                log.exception("graph %s: recovery action %s failed", self.graph.name, action)
        self._sync_pairs()

    def _perform(self, action: RecoveryAction) -> None:
        assert self.plan is not None
        if isinstance(action, Start):
            member = self._launch(action.op, "backup")
            self._act(self.plan.started(action.op, member.worker_id))
        elif isinstance(action, Fence):
            if (found := self._member(action.member)) is not None:
                log.warning("graph %s: %s fenced (%s)", self.graph.name, action.member,
                            action.why)
                self._forget(found)
        elif isinstance(action, Suspect):
            self._keep(action)
        elif isinstance(action, Allow):
            self._spawn(self._allow(action))
        elif isinstance(action, Attach):
            self._attach(action)
        elif isinstance(action, Inform):
            self._inform(action)
        elif isinstance(action, Promote | RollBack):
            self._spawn(self._take_over(action))
        elif isinstance(action, Pause):
            self._paused = True
        elif isinstance(action, Resume):
            self._resume(action)
        elif isinstance(action, Fail):
            log.error("graph %s: %s", self.graph.name, action.reason)
            self._break(action.reason)

    def _member(self, worker_id: str | None) -> Member | None:
        found = self._members.get(worker_id or "")
        return found[1] if found is not None else None

    def _sync_pairs(self) -> None:
        assert self.plan is not None
        for op, pair in self.pairs.items():
            pair.primary, pair.backup, pair.spare = (
                self._member(m) for m in self.plan.roles(op))
            if pair.backup is not None and self.plan.seeded(pair.backup.worker_id):
                pair.backup.extra["synced"] = True  # (seeded as a spare, by a promotion)

    def _planner(self, resumed: Mapping[str, int], epoch: int) -> Failover:
        """``plan_failover`` over what the router saw: which other operators ran on the
        speculation the operators that took over discard."""
        applied = {op: self.router.commit.durable[op] for op in self.topology.stateful}
        applied.update(resumed)
        executed = {op: self.router.executed(op) for op in self.topology.operators}
        executed[FRONTEND] = self.router.held()
        return plan_failover(self.topology, resumed, applied, executed, epoch)

    def _lost(self, member: Member, why: str) -> None:
        assert self.plan is not None
        self._lost_at.setdefault(member.worker_id, (why, self.clock(), member.pid))
        self._act(self.plan.lost(member.worker_id, why))

    def _suspect(self, member: Member, why: str) -> None:
        """Silent past the timeout, or no answer in time. A process that exited is lost;
        one that exists is only suspected (a starved machine can hold a healthy process
        that long), and the plan keeps it if it is the last holder of its state."""
        assert self.plan is not None
        if member.exited():
            self._lost(member, why)
            return
        self._lost_at.setdefault(member.worker_id, (why, self.clock(), member.pid))
        self._act(self.plan.suspected(member.worker_id, why))

    def _kept(self, member: Member, why: str) -> bool:
        """After ``member`` did not answer in time: is it still to be waited for?"""
        assert self.plan is not None
        if member.worker_id not in self.plan.suspects():
            self._suspect(member, why)
        return member.worker_id in self.plan.suspects()

    def _keep(self, action: Suspect) -> None:
        """The plan keeps a silent member, its operator's last holder: nothing new goes to
        it (``lost`` holds dispatch) until it speaks again (``_heard_again``)."""
        member = self._member(action.member)
        if member is None:
            return
        member.lost = "timeout"
        self.suspects.append({"member": member.worker_id, "pid": member.pid, "op": action.op,
                              "why": action.why, "silent_ms": round(
                                  (self.clock() - member.last_beat) * 1e3, 1),
                              "heard_again": False})
        log.warning("graph %s: %s is silent (%s) but its process exists, and no other member "
                    "holds %s's state: kept, not fenced; the graph waits for it",
                    self.graph.name, member.worker_id, action.why, action.op)

    def _heard_again(self, member: Member) -> None:
        """A kept suspect spoke: it was alive all along; it goes on in its role."""
        assert self.plan is not None
        member.lost = None
        self._lost_at.pop(member.worker_id, None)
        for record in self.suspects:
            if record["member"] == member.worker_id:
                record["heard_again"] = True
        log.warning("graph %s: %s is heard from again: it goes on", self.graph.name,
                    member.worker_id)
        self._act(self.plan.heard(member.worker_id))
        self._pump_all()

    async def _allow(self, action: Allow) -> None:
        """The backup admits only the primary's key and learns how far upstream is durable
        (earlier notices will not come again); then the plan attaches it."""
        backup, primary = self._member(action.backup), self._member(action.primary)
        if backup is None or primary is None or self.plan is None:
            return
        key = primary.keys.public.decode() if primary.keys is not None else ""
        durable = {m: self.router.commit.durable[m] for m in backup.spec.pfm}
        durable[action.op] = self._heard[action.op].upto  # its own outputs held here
        try:
            await self._ask(backup, hp.ALLOW, hm.Allow(key, durable))
        except Unavailable as exc:  # dead or hung: a lost backup, which the plan replaces
            self._suspect(backup, str(exc))  # (it holds no state: never kept)
            return
        self._act(self.plan.allowed(action.backup))

    def _attach(self, action: Attach) -> None:
        """The primary sends the backup its retained copy as a base, then every state."""
        backup, primary = self._member(action.backup), self._member(action.primary)
        if backup is None or primary is None:
            return
        hello = backup.hello.result()
        if hello.address is None:
            raise ProtocolError(f"{backup.worker_id} said hello without its address")
        self._tell(primary, hm.Attach(hello.address, hello.key))

    def _inform(self, action: Inform) -> None:
        """A recovery resumed: the backup hears every upstream watermark the frontend holds
        (``_on_durable`` relayed notices to the backup of the moment only, and ignored a
        taker's; ``_resume`` reset the points). One it has already changes nothing: a
        watermark never moves back."""
        backup = self._member(action.backup)
        if backup is None:
            return
        for upstream in backup.spec.pfm:
            self._tell(backup, hm.Notify(upstream, self.router.commit.durable[upstream]))

    async def _take_over(self, action: Promote | RollBack) -> None:
        member = self._member(action.member)
        if member is None or self.plan is None:
            return
        order: hm.Order = hm.Rollback()
        spare = self._member(action.attach) if isinstance(action, Promote) else None
        if isinstance(action, Promote):
            order = self._seed_spare(member, spare)
        future: asyncio.Future[hm.Promoted] = asyncio.get_running_loop().create_future()
        member.extra[hp.PROMOTED] = future
        self._tell(member, order)
        while True:  # (it answers once the spare holds its state, or in 2 s)
            try:
                answer = await self._answer(member, hp.PROMOTED, order.KIND, future, 8.0)
                break
            except Unavailable as exc:  # alive and the last holder: its answer still counts
                if not self._kept(member, str(exc)):
                    return
                member.extra[hp.PROMOTED] = future
        seeded = spare.worker_id if answer.seeded and spare is not None else None
        self._act(self.plan.took_over(action.member, answer.seq, seeded))

    def _seed_spare(self, member: Member, spare: Member | None) -> hm.Promote:
        """Let the spare in for the member being promoted (not waited for: it answers the
        promotion only once the spare applied its state), and say where it listens."""
        if spare is None or not spare.hello.done():
            return hm.Promote()
        key = member.keys.public.decode() if member.keys is not None else ""
        durable = {m: self.router.commit.durable[m] for m in spare.spec.pfm}
        op = spare.spec.op  # outputs beyond the durable point may be renumbered: not those
        durable[op] = self.router.commit.durable[op]
        self._tell(spare, hm.Allow(key, durable))
        hello = spare.hello.result()
        return hm.Promote(hello.address, hello.key)

    def _resume(self, action: Resume) -> None:
        """The plan is complete: roll back and discard in the router, note each lost
        primary's failover, dispatch again (what rolled back runs again)."""
        plan = action.failover
        discarded = self.router.apply(plan)
        covered: list[Held[np.ndarray]] = []  # by a promoted backup's point: they leave
        for op, seq in plan.bounds.items():
            covered += self.router.commit.reset(op, seq)
            self.inflight[op].clear()
            if op in self._heard:
                self._heard[op].reset(seq)
        now = self.clock()
        for op, lost in action.lost:
            how, at, pid = self._lost_at.get(lost, ("exit", now, 0))
            self.failovers.append(FailoverRecord(
                op, how, at, pid, protocol_done_at=now, bounds=dict(plan.bounds),
                rolled_back_in_place=list(plan.roll_back_in_place),
                discarded_replies=len(discarded)))
            log.warning("graph %s: %s primary %s lost (%s); resumed at %s, protocol %.1f ms",
                        self.graph.name, op, lost, how, plan.bounds, (now - at) * 1e3)
        self._lost_at.clear()
        self._release(covered)
        self._paused = False
        self._pump_all()

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- failure detection -----------------------------------------------------------------
    async def _watch(self) -> None:
        last = self.clock()
        while True:
            await asyncio.sleep(_CHECK_EVERY_S)
            now = self.clock()
            self._forgive_stall(now - last - _CHECK_EVERY_S)
            last = now
            self._expire(now)
            for op, member in list(self._members.values()):
                if member.lost is None:
                    self._check(op, member, now)
                elif self.plan is not None and member.exited() \
                        and member.worker_id in self.plan.suspects():
                    self._note_loss(member, "exit", now)  # a kept suspect, gone for sure
                    self._lost(member, "exit")

    def _check(self, op: str, member: Member, now: float) -> None:
        how = self._loss(member, now)
        if how is None:
            return
        member.lost = how
        log.warning("graph %s: %s %s %s (exit code %s)", self.graph.name, op,
                    member.worker_id, "exited" if how == "exit" else "silent past the timeout",
                    member.popen.poll())
        if self.plan is None:
            self._note_loss(member, how, now)
            self._spawn(self._recover(op, member, how, now))
            return
        self._suspect(member, how)
        if member.worker_id not in self.plan.suspects():  # (a kept one is in ``suspects``)
            self._note_loss(member, how, now)

    def _note_loss(self, member: Member, how: str, now: float) -> None:
        self.losses.append({"member": member.worker_id, "pid": member.pid, "how": how,
                            "silent_ms": round((now - member.last_beat) * 1e3, 1)})

    def _expire(self, now: float) -> None:
        """The watchdog: a batch in flight past the graph's deadline fails, its clients have
        given up anyway, and the operator's slot is free again. An operator that had nothing
        to do is not behind (readiness)."""
        limit, stuck = self.graph.timeout_ms / 1000, False
        for op, out in self.inflight.items():
            late = out.expired(now, limit)
            for _, batch in late:
                if op in self.pairs:  # given up on: its state may be applied, unanswered
                    self._outputs_heard(op, batch)
                self._fail_batch(op, batch, DeadlineExceeded(
                    f"{op}: a batch was in flight for more than the graph's timeout_ms "
                    f"({self.graph.timeout_ms:g} ms); the watchdog failed it"))
            if late:
                log.warning("graph %s: the watchdog failed %d batch(es) of %s", self.graph.name,
                            len(late), op)
                if self.on_expired is not None:
                    self.on_expired(op, len(late))
            queued = self.router.managers[op].queued()
            if not out and not queued:
                out.idle(now)
            stuck = stuck or bool(queued and len(out) < _IN_FLIGHT)  # work, and room for it
        if stuck:  # a pass that failed (or a slot the watchdog freed): try again now
            self._pump_all()

    def _forget(self, member: Member) -> None:
        """Kill and unregister a member: its late messages are ignored, and the monitor,
        which checks every member every few ms, no longer looks at it."""
        self.launcher.forget(member)
        self._members.pop(member.worker_id, None)

    def _forgive_stall(self, stall_s: float) -> None:
        """The frontend's own loop was held up (a fork, a garbage collection, a busy core):
        heartbeats that arrived meanwhile are still unread, so that time counts against no
        operator. Without this a stalled frontend declares healthy primaries dead."""
        if stall_s > 0.02:
            for _, member in self._members.values():
                member.last_beat += stall_s

    def _loss(self, member: Member, now: float) -> str | None:
        if not member.hello.done():
            return "exit" if member.exited() else None
        if self.graph.detection == "exit" and member.exited():
            return "exit"
        if now - member.last_beat > self._silence_limit_s():
            return "timeout"
        return None

    def _silence_limit_s(self) -> float:
        """A hung member is a lost one, whatever the detection mode: exit detection sees a
        dead process at once, and this catches one that is alive and answers nothing (a
        stalled backup would hold every reply, a stalled primary every request). The
        frontend's own stalls are forgiven (``_forgive_stall``)."""
        return self.graph.heartbeat_timeout_ms / 1000

    async def _recover(self, op: str, member: Member, how: str, detected_at: float) -> None:
        """bare and checkpoint-replay: a lost primary is started afresh (no backup to lose)."""
        async with self._recovery:
            pair = self.pairs[op]
            try:
                if member is pair.primary:
                    self._paused = True
                    self._forget(member)
                    record = FailoverRecord(pair.op, how, detected_at, member.pid)
                    if self.mode == "checkpoint-replay":
                        await self._replay(pair, record)
                    else:
                        await self._restart_bare(pair, record)
                else:
                    self._forget(member)
            except Exception as exc:  # beyond the failure model: say so, stop accepting
                log.exception("graph %s: recovery of %s failed", self.graph.name, op)
                self._break(f"recovery of {op} failed: {exc}")
            finally:
                self._paused = False
                self._pump_all()

    async def _replay(self, pair: _Pair, record: FailoverRecord) -> None:
        """Checkpoint-replay: a fresh process restores the last checkpoint, then every
        logged batch since it runs again, in order, under its original numbers. Outputs
        that clients already have are compared, not sent: with non-determinism they differ,
        and each difference is a conflict this baseline cannot avoid (HAMS's point)."""
        self.inflight[pair.op].clear()
        for attempt in itertools.count(1):
            pair.primary = self._launch(pair.op, "primary")
            try:
                restored = await self._replay_into(pair, pair.primary)
                break
            except Unavailable:  # the fresh process died too: start over, from the file
                if attempt >= 3:
                    raise
        log_ = self.replay[pair.op]
        record.bounds = {pair.op: restored}
        record.replayed = log_.replayed_batches
        record.protocol_done_at = self.clock()
        self.failovers.append(record)

    async def _replay_into(self, pair: _Pair, primary: Member) -> int:
        hello = await self._hello(primary)
        restored = hello.restored
        for header, rows in self.replay[pair.op].after(restored):
            bid = next(self._bids)
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._replaying[bid] = (header["seqs"], done)
            self._send(primary, {**header, "bid": bid}, rows)
            while not done.done():
                if primary.exited():
                    self._replaying.pop(bid, None)
                    raise Unavailable(f"{pair.op}: the replaying process died")
                await asyncio.wait([done], timeout=0.01)
        return restored

    def _replayed(self, op: str, seqs: list[int],
                  outcomes: Sequence[np.ndarray | Exception]) -> None:
        """Compare with what was answered; answer what never was."""
        log_ = self.replay[op]
        manager = self.router.managers[op]
        for seq, row in zip(seqs, outcomes, strict=True):
            entry = manager.current(seq)
            if isinstance(row, Exception):
                if entry is not None:
                    self._refuse(op, entry, row)
                continue
            if log_.conflicts_with(seq, row):
                self.replay_conflicts += 1
            if entry is not None and not entry.done:
                log_.answered_one(seq, row)
                self._output(op, entry, np.asarray(row))

    async def _restart_bare(self, pair: _Pair, record: FailoverRecord) -> None:
        """No fault tolerance: a fresh primary with a fresh state; the requests the lost one
        never answered run again on it (the state they had built is gone)."""
        manager = self.router.managers[pair.op]
        done = 0
        for entry in manager.dispatched():
            if not entry.done:
                break
            done = entry.seq
        self.inflight[pair.op].clear()
        pair.primary = self._launch(pair.op, "primary")
        await self._hello(pair.primary)
        self.router.apply(Failover(self.router.epoch + 1, (pair.op,), {pair.op: done},
                                   (), (), False))
        record.bounds = {pair.op: done}
        record.protocol_done_at = self.clock()
        self.failovers.append(record)

    def _break(self, reason: str) -> None:
        self.broken = reason
        for client, waiting in list(self._waiting.items()):
            if not waiting.future.done():
                waiting.future.set_exception(Unavailable(reason))
                waiting.future.exception()  # retrieved: a client that left logs nothing
            del self._waiting[client]
        self._abandoned.clear()

    def _whole(self, pair: _Pair) -> bool:
        """Can take one more failure at full speed: a live primary, a seeded backup (with a
        backup mode), a loaded spare, and no loss noticed but not yet recovered from."""
        members = [pair.primary] + ([pair.backup, pair.spare] if self.mode not in _UNHELD
                                    else [])
        if any(m is None or m.lost or not m.hello.done() for m in members):
            return False  # a spare still loading its model could not take over yet
        return self.mode in _UNHELD or bool(pair.backup and pair.backup.extra.get("synced"))

    def slow_state(self, op: str, delay_s: float) -> None:
        """Fault injection: ``op``'s primary waits this long before each state leaves, so
        downstream runs ahead on speculation (the paper's Fig. 6 set-up)."""
        pair = self.pairs.get(op)
        if pair is None:
            raise UnknownModel(f"graph {self.graph.name!r} has no stateful operator {op!r}; "
                               f"stateful: {sorted(self.pairs)}")
        self.slow[op] = delay_s
        if pair.primary is not None:  # else a recovery is under way: nothing to slow
            self._tell(pair.primary, hm.Slow(delay_s))

    # ---- inspection ------------------------------------------------------------------------
    async def state_digests(self) -> dict[str, dict[str, Any]]:
        """Each stateful operator's state on its primary and its backup: the sha256 digest
        (``state_digest``) and the request it is after, asked of the processes themselves.
        Read when no batch is running, the replay check compares them with a replay of what
        clients saw, and a synced backup's with its primary's."""
        out = {}
        while self.plan is not None and self.plan.recovering():
            await asyncio.sleep(0.01)  # no member changes role while we ask
        async with self._recovery:
            for op, pair in self.pairs.items():
                backup = await self._digest(pair.backup)
                if backup is not None and pair.backup is not None:  # holds a full state yet?
                    backup["synced"] = bool(pair.backup.extra.get("synced"))
                out[op] = {"primary": await self._digest(pair.primary), "backup": backup}
        return out

    async def _digest(self, member: Member | None) -> dict[str, Any] | None:
        if member is None or member.lost or not member.hello.done():
            return None
        answer: hm.Digest = await self._ask(member, hp.DIGEST, hm.DigestAsk())
        found: dict[str, Any] = {"seq": answer.seq, "digest": answer.digest, "pid": member.pid}
        if answer.shipped is not None:  # a primary: full copies and deltas sent
            found["shipped"] = dict(answer.shipped)
        return found

    def statistics(self) -> dict[str, Any]:
        ops = {}
        for op in self.topology.operators:
            manager = self.router.managers[op]
            out = self.inflight[op].statistics(self.clock())
            entry: dict[str, Any] = {"last_seq": manager.last_seq, "queued": manager.queued(),
                                     "stateful": op in self.pairs, "inflight": out.inflight,
                                     "oldest_inflight_s": round(out.oldest_s, 3),
                                     "expired_batches": out.expired}
            if op in self.pairs:
                pair = self.pairs[op]
                entry.update(durable=self.router.commit.durable[op]
                             if self.mode not in _UNHELD else None,
                             primary_pid=pair.primary.pid if pair.primary else None,
                             backup_pid=pair.backup.pid if pair.backup else None,
                             backup_synced=bool(pair.backup and pair.backup.extra.get("synced")),
                             since_checkpoint=self.replay[op].since_checkpoint,
                             answered_since_checkpoint=self.replay[op]
                             .answered_since_checkpoint,
                             checkpoint=self.replay[op].checkpoint,
                             whole=self._whole(pair),
                             spare_pid=pair.spare.pid if pair.spare else None)
                until = self.gate.closing().get(op)  # new streams refused at the door
                entry["new_streams_refused_for_s"] = round(max(0.0, until - self.clock()), 3) \
                    if until is not None else 0.0
            ops[op] = entry
        return {"mode": self.mode, "ready": self.ready(), "broken": self.broken,
                "recovering": self._recovery.locked() or bool(
                    self.plan and self.plan.recovering()),
                "held_replies": self.router.commit.held(), "waiting": len(self._waiting),
                "abandoned": len(self._abandoned),
                "records": self.router.records(), "stalled": self.stalled(),
                "input_shape": list(self.input_shape) if self.input_shape is not None else None,
                "epoch": self.router.epoch, "operators": ops, "state_delay_s": self.slow,
                "replay_conflicts": self.replay_conflicts,
                "redispatched_rows": self.redispatched, "losses": list(self.losses),
                "suspects": list(self.suspects),
                "failovers": [r.to_json() for r in self.failovers]}


class _KilledLoading(ModelLoadError):
    """A member died of a signal before it said hello: no fault of its model's."""


def _ids(pair: _Pair) -> tuple[str, str, str]:
    members = (pair.primary, pair.backup, pair.spare)
    assert all(m is not None for m in members)
    return tuple(m.worker_id for m in members if m is not None)  # type: ignore[return-value]


def _refusal_error(op: str, refused: hp.Refusal) -> Exception:
    """What a row an operator refused answers: 429 for no room (a full stream table), 400
    for a bad row, 500 for anything else the operator raised."""
    message = f"{op}: {refused.message}"
    if refused.kind == "busy":
        return TooManyStreams(message, refused.retry_after_s)
    return InvalidInput(message) if refused.kind == "bad_input" else PredictError(message)


def _named(exc: Exception, name: str) -> Exception:
    """``exc`` with the row it fails named first ("input_batch[3]: ..."), when the request
    had several; a copy, since one error may fail several rows."""
    if not name:
        return exc
    try:
        named = copy.copy(exc)
    except Exception:  # an error that cannot be copied keeps its words
        return exc
    named.args = (f"{name}{exc}",)
    return named


def _combine(parts: Sequence[np.ndarray]) -> np.ndarray:
    """A join's input: its predecessors' outputs side by side, flattened (H4)."""
    return np.concatenate([np.ravel(p) for p in parts])
