"""Batches to a graph's operators, and the watchdog over the batches in flight.

A **stateful** operator's batch goes to its primary process; a **stateless** operator's to
its deployed model through the ordinary model path (replicas, restarts and re-queueing of a
crashed replica's batch included), searched for the rows its model refuses
(``RowBisection``). No exception on the send path leaves a batch in flight, and the watchdog
fails, and counts, any batch in flight past the graph's ``timeout_ms``, so a graph heals
instead of wedging.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import numpy as np

from parityserve.core.hams import Executed, RowBisection, frontier
from parityserve.errors import (
    DeadlineExceeded,
    InvalidInput,
    ModelError,
    Overloaded,
    PredictError,
    ServiceError,
    WorkerError,
)
from parityserve.runtime.graphs import hams_messages as hm
from parityserve.runtime.graphs.hams_context import Batch, GraphContext, Infer, Pair, log
from parityserve.runtime.graphs.hams_members import Member
from parityserve.runtime.graphs.hams_requests import Requests

__all__ = ["IN_FLIGHT", "Dispatch"]

IN_FLIGHT = 2  # batches per operator at once: the next one waits at the worker, no gap
_REDISPATCH_S = 0.02  # first wait before a row with applied state goes to a replica again


class Dispatch:
    def __init__(self, ctx: GraphContext, requests: Requests, infer: Infer) -> None:
        self.ctx, self.requests, self._infer = ctx, requests, infer
        self.bids = itertools.count(1)
        self.redispatched = 0  # rows with applied state sent to a stateless operator again
        self.on_expired: Callable[[str, int], None] | None = None  # (op, batches): a metric

    def pump_all(self) -> None:
        if self.ctx.paused:
            return
        for op in self.ctx.topology.operators:
            try:
                if op in self.ctx.pairs:
                    self._pump_stateful(self.ctx.pairs[op])
                else:
                    self._pump_stateless(op)
            except Exception:  # a bug: the other operators still run; readiness tells
                log.exception("graph %s: dispatching to %s failed", self.ctx.graph.name, op)

    def _pump_stateful(self, pair: Pair) -> None:
        primary, ctx = pair.primary, self.ctx
        if primary is None or primary.lost or not primary.hello.done():
            return
        manager, out = ctx.router.managers[pair.op], ctx.inflight[pair.op]
        while len(out) < IN_FLIGHT and manager.queued():
            batch = ctx.router.batch(pair.op, ctx.graph.max_batch, np.shape)
            self._send_batch(pair.op, primary, next(self.bids), batch)

    def _send_batch(self, op: str, primary: Member, bid: int, batch: Batch) -> None:
        """Pack, log (checkpoint-replay), put in flight, send: a step that raises fails the
        batch's rows now, and takes it out of flight, rather than leave it there for good."""
        ctx = self.ctx
        try:
            header, frames = self.batch_message(op, bid, batch).to_wire()
            if ctx.mode == "checkpoint-replay":
                ctx.replay[op].logged(header, frames)
            ctx.inflight[op].add(bid, batch, ctx.clock())
            ctx.send(primary, header, frames)
        except Exception as exc:
            log.exception("graph %s: sending a batch to %s failed", ctx.graph.name, op)
            ctx.inflight[op].pop(bid, ctx.clock())
            self.outputs_heard(op, batch)  # numbered, never run: no state waits for it
            self.requests.fail_batch(op, batch, PredictError(
                f"{op}: the batch could not be sent: {type(exc).__name__}: {exc}"))

    def batch_message(self, op: str, bid: int, batch: Batch) -> hm.Batch:
        """The batch for ``op``'s primary. Its state will depend on ``needs``: the highest
        number each row carries at each previous stateful operator and at ``op`` (Alg. 2
        needs no more than this frontier, not a lineage per row)."""
        rows = [self.requests.row_of(e) for e in batch]
        return hm.Batch(bid, tuple(e.seq for e in batch),
                        np.stack([e.arrival.payload for e in batch]),
                        tuple(r[0] if r is not None else "" for r in rows),
                        tuple(r[1] if r is not None else -1 for r in rows),
                        frontier((e.lineage for e in batch), self.ctx.watched[op]),
                        self.ctx.clock())  # the operator's now: a stream table's idle time

    def outputs_heard(self, op: str, batch: Batch) -> None:
        """The batch's outcomes are here: its state may be applied now (``Heard``)."""
        pair, heard = self.ctx.pairs[op], self.ctx.heard[op]
        if self.ctx.plan is not None and heard.add(e.seq for e in batch) \
                and pair.backup is not None:
            self.ctx.tell(pair.backup, hm.Notify(op, heard.upto))

    def _pump_stateless(self, op: str) -> None:
        ctx = self.ctx
        manager, out = ctx.router.managers[op], ctx.inflight[op]
        while len(out) < IN_FLIGHT and manager.queued():
            batch = ctx.router.batch(op, ctx.graph.max_batch, np.shape)
            bid = next(self.bids)
            out.add(bid, batch, ctx.clock())
            ctx.spawn(self._run_stateless(op, bid, batch))

    async def _run_stateless(self, op: str, bid: int, batch: Batch) -> None:
        ctx = self.ctx
        try:
            outcomes = await self._redispatched(
                op, bid, batch, await self._isolated(ctx.ops[op].model, batch))
        except Exception as exc:  # never leave the batch in flight: fail its rows
            log.exception("graph %s: operator %s failed", ctx.graph.name, op)
            outcomes = [exc] * len(batch)
        if ctx.inflight[op].pop(bid, ctx.clock()) is not None:  # else: the watchdog's
            self.requests.deliver(op, batch, outcomes)
        self.pump_all()

    async def _redispatched(self, op: str, bid: int, batch: Batch,
                            outcomes: list[np.ndarray | Exception]
                            ) -> list[np.ndarray | Exception]:
        """A row that failed for want of a replica (one killed, restarting, backing off; the
        model path's own deadline passed meanwhile) goes again, to a restarted or other
        replica, for as long as the batch is in flight (the watchdog's timeout_ms, the
        client's own deadline, bounds it, as for every batch). A row that has passed a
        stateful operator changed its state: failing it would have its client send it again
        and apply it twice. One that has not is still an accepted request, answered as a
        model route's in-flight query is when its replica dies; only a shed one
        (``Overloaded``: the model's queue is full, by design a fast answer) fails as it is."""
        delay = _REDISPATCH_S
        while bid in self.ctx.inflight[op]:
            again = [i for i, o in enumerate(outcomes) if self._again(o, batch[i])]
            if not again:
                break
            await asyncio.sleep(delay)
            delay = min(2 * delay, 0.5)
            self.redispatched += len(again)
            retried = await self._isolated(self.ctx.ops[op].model, [batch[i] for i in again])
            for i, outcome in zip(again, retried, strict=True):
                outcomes[i] = outcome
        return outcomes

    def _again(self, outcome: np.ndarray | Exception, entry: Executed[np.ndarray]) -> bool:
        """Whether a row's failure is no fault of its own, and sending it again is owed."""
        if not isinstance(outcome, ServiceError | WorkerError):
            return False  # an answer, or the row's own fault
        return not isinstance(outcome, Overloaded) or self._applied_state(entry)

    def _applied_state(self, entry: Executed[np.ndarray]) -> bool:
        return any(hop.op in self.ctx.pairs for hop in entry.lineage)

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

    def expire(self, now: float) -> None:
        """The watchdog: a batch in flight past the graph's deadline fails, its clients have
        given up anyway, and the operator's slot is free again. An operator that had nothing
        to do is not behind (readiness)."""
        ctx = self.ctx
        limit, stuck = ctx.graph.timeout_ms / 1000, False
        for op, out in ctx.inflight.items():
            late = out.expired(now, limit)
            for _, batch in late:
                if op in ctx.pairs:  # given up on: its state may be applied, unanswered
                    self.outputs_heard(op, batch)
                self.requests.fail_batch(op, batch, DeadlineExceeded(
                    f"{op}: a batch was in flight for more than the graph's timeout_ms "
                    f"({ctx.graph.timeout_ms:g} ms); the watchdog failed it"))
            if late:
                log.warning("graph %s: the watchdog failed %d batch(es) of %s", ctx.graph.name,
                            len(late), op)
                if self.on_expired is not None:
                    self.on_expired(op, len(late))
            queued = ctx.router.managers[op].queued()
            if not out and not queued:
                out.idle(now)
            stuck = stuck or bool(queued and len(out) < IN_FLIGHT)  # work, and room for it
        if stuck:  # a pass that failed (or a slot the watchdog freed): try again now
            self.pump_all()

    def stalled(self) -> list[str]:
        ctx = self.ctx
        now, limit = ctx.clock(), ctx.graph.timeout_ms / 1000
        return [op for op, out in ctx.inflight.items()
                if out.stalled(now, limit, ctx.router.managers[op].queued())]

