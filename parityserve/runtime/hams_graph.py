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
from collections.abc import Awaitable, Callable, Sequence
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
    Held,
    InFlight,
    OutputCommit,
    RowBisection,
    admits,
    client_of,
    plan_failover,
    seq_at,
)
from parityserve.errors import (
    DeadlineExceeded,
    InvalidInput,
    ModelError,
    ModelLoadError,
    PredictError,
    TooManyStreams,
    Unavailable,
    UnknownModel,
)
from parityserve.runtime import hams_protocol as hp
from parityserve.runtime import wire
from parityserve.runtime.hams_members import Member, MemberLauncher
from parityserve.runtime.hams_replay import ReplayLog
from parityserve.runtime.keys import ServerKeys
from parityserve.runtime.rpc import RejectLog, WorkerLink

__all__ = ["FailoverRecord", "GraphAnswer", "GraphRuntime"]

log = logging.getLogger(__name__)

Infer = Callable[[str, np.ndarray], Awaitable[np.ndarray]]
Batch = list[Executed[np.ndarray]]
_IN_FLIGHT = 2  # batches per operator at once: the next one waits at the worker, no gap
_RELEASED_KEPT = 100_000  # answered requests remembered to drop a late duplicate
_BACKUP_GRACE_S = 0.02  # a lost backup waits this long for a correlated primary loss
_CHECK_EVERY_S = 0.005
_HANG_S = 2.0  # exit-based detection: silence that means a hung operator
_UNHELD = ("bare", "checkpoint-replay")  # modes without a backup: replies leave at once


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
        self.replay = {op: ReplayLog() for op in self.pairs}  # checkpoint-replay only
        self._members: dict[str, tuple[str, Member]] = {}
        self._waiting: dict[int, _Waiting] = {}
        self._released: deque[int] = deque()
        self._clients = itertools.count(1)
        self._bids = itertools.count(1)
        # every operator's batches in flight (the watchdog's and readiness's view)
        self.inflight: dict[str, InFlight[Batch]] = {
            op: InFlight(clock()) for op in self.topology.operators}
        # declared only: learned from the first answer, one client chose it for everyone
        self.input_shape = graph.door(deployments.values())
        self.on_expired: Callable[[str, int], None] | None = None  # (op, batches): a metric
        self._recovery = asyncio.Lock()
        self._paused = False
        self.broken: str | None = None
        self.failovers: list[FailoverRecord] = []
        self.replay_conflicts = 0  # checkpoint-replay: replayed outputs that differed
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
        for pair in self.pairs.values():
            if pair.backup is not None:
                await self._attach(pair)
        self._monitor = asyncio.get_running_loop().create_task(self._watch())

    async def _all_hellos(self) -> None:
        for pair in self.pairs.values():
            for member in (pair.primary, pair.backup, pair.spare):
                if member is not None:
                    await self._hello(member)

    async def _hello(self, member: Member) -> dict[str, Any]:
        while not member.hello.done():
            if member.exited():
                raise ModelLoadError(f"operator process {member.worker_id} exited with "
                                     f"{member.popen.returncode} before it said hello")
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
        loop = asyncio.get_running_loop()
        futures = []
        origin = object()  # this request's rows take turns with other requests' in batches
        for i, (row, stream, label) in enumerate(zip(rows, streams, labels, strict=True)):
            client = next(self._clients)
            waiting = _Waiting(stream, label, loop.create_future(),
                               f"input_batch[{i}]: " if len(rows) > 1 else "")
            self._waiting[client] = waiting
            futures.append(waiting.future)
            self.router.submit(client, row, origin)
        self._pump_all()
        done, pending = await asyncio.wait(futures, timeout=timeout_s)
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
            self._send_batch(pair.op, primary, next(self._bids), batch)

    def _send_batch(self, op: str, primary: Member, bid: int, batch: Batch) -> None:
        """Pack, log (checkpoint-replay), put in flight, send: a step that raises fails the
        batch's rows now, and takes it out of flight, rather than leave it there for good."""
        try:
            header, frames = self._batch_message(bid, batch)
            if self.mode == "checkpoint-replay":
                self.replay[op].logged(header, frames)
            self.inflight[op].add(bid, batch, self.clock())
            self._send(primary, header, frames)
        except Exception as exc:
            log.exception("graph %s: sending a batch to %s failed", self.graph.name, op)
            self.inflight[op].pop(bid, self.clock())
            self._fail_batch(op, batch, PredictError(f"{op}: the batch could not be sent: "
                                                     f"{type(exc).__name__}: {exc}"))

    def _batch_message(self, bid: int, batch: Batch) -> tuple[dict[str, Any], list[Any]]:
        clients = [client_of(e.lineage) for e in batch]
        desc, frames = wire.pack_payload(np.stack([e.arrival.payload for e in batch]))
        header = {"t": hp.BATCH, "bid": bid, "seqs": [e.seq for e in batch], "inputs": desc,
                  "streams": [self._waiting[c].stream if c in self._waiting else ""
                              for c in clients],
                  "labels": [self._waiting[c].label if c in self._waiting else -1
                             for c in clients],
                  "lineages": [hp.lineage_to_wire(e.lineage) for e in batch],
                  "at": self.clock()}  # the operator's now: a stream table's idle time
        return header, frames

    def _pump_stateless(self, op: str) -> None:
        manager, out = self.router.managers[op], self.inflight[op]
        while len(out) < _IN_FLIGHT and manager.queued():
            batch = self.router.batch(op, self.graph.max_batch, np.shape)
            bid = next(self._bids)
            out.add(bid, batch, self.clock())
            self._spawn(self._run_stateless(op, bid, batch))

    async def _run_stateless(self, op: str, bid: int, batch: Batch) -> None:
        try:
            outcomes = await self._isolated(self._ops[op].model, batch)
        except Exception as exc:  # never leave the batch in flight: fail its rows
            log.exception("graph %s: operator %s failed", self.graph.name, op)
            outcomes = [exc] * len(batch)
        if self.inflight[op].pop(bid, self.clock()) is not None:  # else: the watchdog's
            self._deliver(op, batch, outcomes)
        self._pump_all()

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
        self._release(self.router.output(op, entry.seq, row))

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
        client = client_of(entry.lineage)
        waiting = self._waiting.pop(client, None)
        if waiting is not None and not waiting.future.done():
            waiting.future.set_exception(_named(exc, waiting.name))
            waiting.future.exception()  # retrieved: a client that left logs nothing
        self.router.collect(client)

    def _release(self, held: list[Held[np.ndarray]]) -> None:
        now = self.clock()
        for reply in held:
            self._note_first_reply(reply, now)
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
        try:
            self._handle(op, member, header, buffers)
        except Exception:  # whatever it was, no batch stays in flight for it: see _on_outputs
            log.exception("graph %s: %s's %s message failed", self.graph.name, worker_id,
                          header.get("t"))

    def _handle(self, op: str, member: Member, header: dict[str, Any], buffers: list[Any]
                ) -> None:
        kind = header["t"]
        if kind == hp.BEAT:
            pass
        elif kind == hp.HELLO and not member.hello.done():
            member.hello.set_result(header)
        elif kind == hp.OUT:
            self._on_outputs(self.pairs[op], member, header, buffers)
        elif kind == hp.CHECKPOINT:
            self._checkpointed(op, int(header["seq"]))
        elif kind == hp.DURABLE:
            self._on_durable(self.pairs[op], member, int(header["seq"]))
        elif kind in (hp.PROMOTED, hp.ALLOW, hp.DIGEST):
            future = member.extra.pop(kind, None)
            if future is not None and not future.done():
                future.set_result(header)
        elif kind == hp.FAILED and not member.hello.done():
            member.hello.set_exception(ModelLoadError(f"{op}: {header.get('error')}"))
            member.hello.exception()  # the start raises it once, for the first member

    def _on_outputs(self, pair: _Pair, member: Member, header: dict[str, Any],
                    buffers: list[Any]) -> None:
        bid = int(header["bid"])
        replayed = self._replaying.pop(bid, None)
        if replayed is not None:  # here, not in the replay's task: a checkpoint that follows
            seqs, done = replayed  # on the socket must not drop these outputs' log first
            try:
                if member is pair.primary:
                    self._replayed(pair.op, seqs, self._outcomes(pair.op, header, buffers,
                                                                 len(seqs)))
            finally:
                if not done.done():
                    done.set_result(None)
            return
        if member is not pair.primary:
            return
        batch = self.inflight[pair.op].pop(bid, self.clock())
        if batch is None:  # expired, or taken over by a failover
            return
        try:
            outcomes = self._outcomes(pair.op, header, buffers, len(batch))
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

    def _outcomes(self, op: str, header: dict[str, Any], buffers: list[Any], n: int
                  ) -> list[np.ndarray | Exception]:
        """Each row's output, or the error its refusal becomes."""
        outputs = _outputs(header, buffers) if "outputs" in header else None
        return [_refusal_error(op, o) if isinstance(o, hp.Refusal) else np.asarray(o)
                for o in hp.row_outcomes(header, outputs, n)]

    def _on_durable(self, pair: _Pair, member: Member, seq: int) -> None:
        if member is not pair.backup:
            return
        member.extra["synced"] = True  # it holds a full state: it may be promoted now
        self._release(self.router.notify(pair.op, seq))
        for nxt in self.topology.stateful:
            if pair.op in self.topology.prev_stateful(nxt):
                backup = self.pairs[nxt].backup
                if backup is not None:
                    self._send(backup, {"t": hp.NOTIFY, "op": pair.op, "seq": seq})

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

    async def _ask(self, member: Member, kind: str, header: dict[str, Any],
                   timeout_s: float = 5.0) -> dict[str, Any]:
        """Send and wait for the answer; a member that exits meanwhile fails it at once."""
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        member.extra[kind] = future
        self._send(member, header)
        deadline = self.clock() + timeout_s
        while not future.done():
            if member.exited() or self.clock() > deadline:
                member.extra.pop(kind, None)
                raise Unavailable(f"{member.worker_id} did not answer {header['t']}")
            await asyncio.wait([future], timeout=0.005)
        return future.result()

    # ---- backups ---------------------------------------------------------------------------
    async def _attach(self, pair: _Pair) -> None:
        """Make ``pair.backup`` the primary's backup: it admits only the primary's key and
        learns how far upstream is durable, then the primary sends it its base state."""
        assert pair.primary is not None and pair.backup is not None
        hello = await self._hello(pair.backup)
        key = pair.primary.keys.public.decode() if pair.primary.keys is not None else ""
        durable = {m: self.router.commit.durable[m] for m in pair.backup.spec.pfm}
        await self._ask(pair.backup, hp.ALLOW, {"t": hp.ALLOW, "key": key, "durable": durable})
        self._send(pair.primary, {"t": hp.ATTACH, "address": hello["address"],
                                  "key": hello.get("key", "")})

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
                how = self._loss(member, now) if member.lost is None else None
                if how is not None:
                    member.lost = how
                    log.warning("graph %s: %s %s lost (%s, exit code %s)", self.graph.name,
                                op, member.worker_id, how, member.popen.poll())
                    self._spawn(self._recover(op, member, how, now))

    def _expire(self, now: float) -> None:
        """The watchdog: a batch in flight past the graph's deadline fails, its clients have
        given up anyway, and the operator's slot is free again. An operator that had nothing
        to do is not behind (readiness)."""
        limit, stuck = self.graph.timeout_ms / 1000, False
        for op, out in self.inflight.items():
            late = out.expired(now, limit)
            for _, batch in late:
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
        """With exit-based detection the exit is the evidence and heartbeats only catch a
        hung process, so they get a longer limit: on a busy 2-core host an operator can be
        starved of CPU for a few hundred ms, and a false suspicion kills a healthy process."""
        limit = self.graph.heartbeat_timeout_ms / 1000
        return limit if self.graph.detection == "timeout" else max(limit, _HANG_S)

    async def _recover(self, op: str, member: Member, how: str, detected_at: float) -> None:
        if member is self.pairs[op].backup:
            # Correlated failures: a primary killed in the same instant may be noticed a pass
            # later (a big process takes a few ms to die). Its plan must go first, so that it
            # sees the backup gone and rolls back in place (Fig. 6) instead of a spare being
            # seeded with speculation that the plan then has to undo.
            await asyncio.sleep(_BACKUP_GRACE_S)
        async with self._recovery:
            pair = self.pairs[op]
            try:
                if member is pair.primary:
                    await self._primary_lost(pair, member, how, detected_at)
                elif member is pair.backup:
                    await self._backup_lost(pair, member)
                elif member is pair.spare:
                    self._forget(member)
                    pair.spare = self._launch(op, "backup")
            except Exception as exc:  # beyond the failure model: say so, stop accepting
                log.exception("graph %s: recovery of %s failed", self.graph.name, op)
                self._break(f"recovery of {op} failed: {exc}")
            finally:
                self._paused = False
                self._pump_all()

    async def _backup_lost(self, pair: _Pair, member: Member) -> None:
        """H6: the primary goes on; the spare becomes the backup and gets the full state."""
        self._forget(member)
        pair.backup = None
        await self._adopt_spare(pair)

    async def _adopt_spare(self, pair: _Pair) -> None:
        spare = pair.spare
        if spare is None or spare.lost:
            spare = self._launch(pair.op, "backup")
        pair.backup, pair.spare = spare, self._launch(pair.op, "backup")
        if spare.hello.done():
            await self._attach(pair)
        else:  # still loading its model: attach it later, without holding up recoveries
            self._spawn(self._attach_when_ready(pair, spare))

    async def _attach_when_ready(self, pair: _Pair, backup: Member) -> None:
        try:
            await self._hello(backup)
            async with self._recovery:  # the primary may change meanwhile: attach to the one
                if pair.backup is backup and not backup.lost:  # there is then
                    await self._attach(pair)
        except Exception:  # it died: the monitor sees a lost backup and adopts another
            log.warning("graph %s: %s's new backup did not come up", self.graph.name, pair.op)

    async def _primary_lost(self, pair: _Pair, member: Member, how: str,
                            detected_at: float) -> None:
        self._paused = True
        self._forget(member)
        record = FailoverRecord(pair.op, how, detected_at, member.pid)
        if self.mode == "checkpoint-replay":
            await self._replay(pair, record)
            return
        if self.mode == "bare":
            await self._restart_bare(pair, record)
            return
        resumed = {pair.op: await self._promote(pair)}
        plan = await self._close_plan(resumed, record)
        record.discarded_replies = len(self.router.apply(plan))
        for op, seq in plan.bounds.items():
            self.router.commit.durable.reset(op, seq)
        record.bounds = dict(plan.bounds)
        record.protocol_done_at = self.clock()
        self.failovers.append(record)
        self._paused = False
        self._pump_all()
        for op in plan.bounds:
            if self.pairs[op].backup is None:
                await self._adopt_spare(self.pairs[op])
        log.warning("graph %s: %s primary lost (%s), backup promoted at %s; protocol %.1f ms",
                    self.graph.name, pair.op, how, plan.bounds,
                    (record.protocol_done_at - detected_at) * 1e3)

    async def _close_plan(self, resumed: dict[str, int], record: FailoverRecord) -> Failover:
        """Plan, roll back every operator the plan lists (promote its backup, or roll its
        primary back in place when the backup is dead too), plan again with the points they
        really resumed at, until the plan lists nothing new."""
        while True:
            applied = {op: self.router.commit.durable[op] for op in self.topology.stateful}
            applied.update(resumed)
            executed = {op: self.router.executed(op) for op in self.topology.operators}
            executed[FRONTEND] = self.router.held()
            plan = plan_failover(self.topology, resumed, applied, executed,
                                 self.router.epoch + 1)
            extra = [op for op in plan.bounds if op not in resumed]
            if not extra:
                return plan
            for op in extra:
                resumed[op] = await self._demote(self.pairs[op], record)

    async def _promote(self, pair: _Pair) -> int:
        backup = pair.backup
        if backup is None or backup.lost or backup.exited():
            raise Unavailable(f"{pair.op}: primary and backup both lost")
        if not backup.extra.get("synced"):  # H6: a new backup is no backup until seeded
            raise Unavailable(f"{pair.op}: primary lost while its new backup was still "
                              "receiving its first full state")
        seq = int((await self._ask(backup, hp.PROMOTED, {"t": hp.PROMOTE}))["seq"])
        pair.primary, pair.backup = backup, None
        self.inflight[pair.op].clear()
        return seq

    async def _demote(self, pair: _Pair, record: FailoverRecord) -> int:
        """A downstream operator built on discarded speculation rolls back too."""
        backup, primary = pair.backup, pair.primary
        if backup is not None and backup.extra.get("synced") and not backup.exited():
            try:
                seq = await self._promote(pair)
            except Unavailable:  # it died meanwhile: the Fig. 6 case after all
                pair.primary = primary
            else:
                if primary is not None:  # demoted: it must not answer anything more
                    self._forget(primary)
                return seq
        if primary is None or primary.exited():
            raise Unavailable(f"{pair.op}: primary and backup both lost")
        record.rolled_back_in_place.append(pair.op)
        self.inflight[pair.op].clear()
        return int((await self._ask(primary, hp.PROMOTED, {"t": hp.ROLLBACK}))["seq"])

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
        restored = int(hello.get("restored", 0))
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
        if pair is None or pair.primary is None:
            raise UnknownModel(f"graph {self.graph.name!r} has no stateful operator {op!r}; "
                               f"stateful: {sorted(self.pairs)}")
        self.slow[op] = delay_s
        self._send(pair.primary, {"t": hp.SLOW, "s": delay_s})

    # ---- inspection ------------------------------------------------------------------------
    async def state_digests(self) -> dict[str, dict[str, Any]]:
        """Each stateful operator's state on its primary and its backup: the sha256 digest
        (``state_digest``) and the request it is after, asked of the processes themselves.
        Read when no batch is running, the replay check compares them with a replay of what
        clients saw, and a synced backup's with its primary's."""
        out = {}
        async with self._recovery:  # no member changes role while we ask
            for op, pair in self.pairs.items():
                backup = await self._digest(pair.backup)
                if backup is not None and pair.backup is not None:  # holds a full state yet?
                    backup["synced"] = bool(pair.backup.extra.get("synced"))
                out[op] = {"primary": await self._digest(pair.primary), "backup": backup}
        return out

    async def _digest(self, member: Member | None) -> dict[str, Any] | None:
        if member is None or member.lost or not member.hello.done():
            return None
        answer = await self._ask(member, hp.DIGEST, {"t": hp.DIGEST})
        return {"seq": int(answer["seq"]), "digest": str(answer["digest"]), "pid": member.pid}

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
                             checkpoint=self.replay[op].checkpoint,
                             whole=self._whole(pair),
                             spare_pid=pair.spare.pid if pair.spare else None)
            ops[op] = entry
        return {"mode": self.mode, "ready": self.ready(), "broken": self.broken,
                "recovering": self._recovery.locked(),
                "held_replies": self.router.commit.held(), "waiting": len(self._waiting),
                "records": self.router.records(), "stalled": self.stalled(),
                "input_shape": list(self.input_shape) if self.input_shape is not None else None,
                "epoch": self.router.epoch, "operators": ops, "state_delay_s": self.slow,
                "replay_conflicts": self.replay_conflicts,
                "failovers": [r.to_json() for r in self.failovers]}


def _outputs(header: dict[str, Any], buffers: list[Any]) -> np.ndarray:
    """An operator's outputs, one row per request of the batch."""
    return np.array(wire.unpack_payload(header["outputs"], buffers))


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
