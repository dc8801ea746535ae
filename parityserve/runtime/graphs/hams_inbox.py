"""What a graph's operator processes say to the frontend: parsed once, here, into the typed
records of ``hams_messages``, and handed to the piece whose job it is. A message that does
not parse is dropped and counted (``on_protocol_error``, by the kind it claimed), never
raised; an unreadable answer to a batch in flight fails that batch at once.

A primary answers batches; its backup says what is durable, which releases replies and is
forwarded to the next stateful operators' backups.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from parityserve.errors import (
    InvalidInput,
    ModelLoadError,
    PredictError,
    ProtocolError,
    TooManyStreams,
)
from parityserve.runtime.graphs import hams_messages as hm
from parityserve.runtime.graphs import hams_protocol as hp
from parityserve.runtime.graphs.hams_baselines import Baselines
from parityserve.runtime.graphs.hams_context import GraphContext, Pair, log
from parityserve.runtime.graphs.hams_dispatch import Dispatch
from parityserve.runtime.graphs.hams_members import Member
from parityserve.runtime.graphs.hams_membership import Membership
from parityserve.runtime.graphs.hams_recovery import RecoveryDriver
from parityserve.runtime.graphs.hams_requests import Requests
from parityserve.runtime.workers.rpc import RejectLog

__all__ = ["Inbox"]

_REPORT_KINDS = (hp.HELLO, hp.BEAT, hp.OUT, hp.FAILED, hp.CHECKPOINT, hp.DURABLE, hp.PROMOTED,
                 hp.ALLOW, hp.DIGEST)  # what an operator may say to the frontend


class Inbox:
    def __init__(self, ctx: GraphContext, members: Membership, requests: Requests,
                 dispatch: Dispatch, recovery: RecoveryDriver, baselines: Baselines) -> None:
        self.ctx, self.members, self.requests, self.dispatch = ctx, members, requests, dispatch
        self.recovery, self.baselines = recovery, baselines
        self.on_protocol_error: Callable[[str], None] | None = None  # (kind): a metric
        self._rejects = RejectLog()  # a malformed message's log line, a few per peer

    def on_message(self, worker_id: str, header: dict[str, Any], buffers: list[Any]) -> None:
        ctx = self.ctx
        found = self.members.by_id.get(worker_id)
        if found is None:
            return
        op, member = found
        member.last_beat = ctx.clock()  # any message shows the process is alive
        if member.lost is not None and ctx.plan is not None \
                and worker_id in ctx.plan.suspects():
            self.recovery.heard_again(member)
        try:
            message = hm.parse_report(header, buffers)  # the one place a message is read
        except ProtocolError as exc:
            self._malformed(op, member, header.get("t"), exc)
            return
        try:
            self._handle(op, member, message)
        except Exception:  # whatever it was, no batch stays in flight for it: see _on_outputs
            log.exception("graph %s: %s's %s message failed", ctx.graph.name, worker_id,
                          message.KIND)

    def _malformed(self, op: str, member: Member, kind: Any, exc: ProtocolError) -> None:
        """Dropped and counted, never raised; an unreadable answer to a batch in flight
        fails that batch (its clients would otherwise wait for the watchdog)."""
        ctx = self.ctx
        kind = kind if kind in _REPORT_KINDS else "unknown"  # a bounded metric label
        self._rejects(member.worker_id, "malformed", f"dropping a malformed {kind} message "
                      f"of graph {ctx.graph.name}: {exc}")
        if self.on_protocol_error is not None:
            self.on_protocol_error(kind)
        if isinstance(exc, hm.BadAnswer) and member is ctx.pairs[op].primary:
            batch = ctx.inflight[op].pop(exc.bid, ctx.clock())
            if batch is not None:
                self.dispatch.outputs_heard(op, batch)
                self.requests.fail_batch(op, batch, PredictError(
                    f"{op}: its answer could not be read: {exc}"))
                self.dispatch.pump_all()

    def _handle(self, op: str, member: Member, message: hm.Report) -> None:
        ctx = self.ctx
        if isinstance(message, hm.Hello):
            if not member.hello.done():
                member.hello.set_result(message)
                if ctx.plan is not None:
                    self.recovery.act(ctx.plan.ready(member.worker_id))
        elif isinstance(message, hm.Out):
            self._on_outputs(ctx.pairs[op], member, message)
        elif isinstance(message, hm.Checkpointed):
            self.baselines.checkpointed(op, message.seq)
        elif isinstance(message, hm.Durable):
            self._on_durable(ctx.pairs[op], member, message.seq)
        elif isinstance(message, hm.Promoted | hm.Allowed | hm.Digest):
            future = member.extra.pop(message.KIND, None)
            if future is not None and not future.done():
                future.set_result(message)
        elif isinstance(message, hm.Failed) and not member.hello.done():
            member.hello.set_exception(ModelLoadError(f"{op}: {message.error}"))
            member.hello.exception()  # the start raises it once, for the first member

    def _on_outputs(self, pair: Pair, member: Member, message: hm.Out) -> None:
        ctx = self.ctx
        replayed = self.baselines.replaying.pop(message.bid, None)
        if replayed is not None:  # here, not in the replay's task: a checkpoint that follows
            seqs, done = replayed  # on the socket must not drop these outputs' log first
            try:
                if member is pair.primary:
                    self.baselines.replayed(pair.op, seqs,
                                            _outcomes(pair.op, message, len(seqs)))
            finally:
                if not done.done():
                    done.set_result(None)
            return
        if member is not pair.primary:
            return
        batch = ctx.inflight[pair.op].pop(message.bid, ctx.clock())
        if batch is None:  # expired, or taken over by a failover
            return
        self.dispatch.outputs_heard(pair.op, batch)
        try:
            outcomes = _outcomes(pair.op, message, len(batch))
            if ctx.mode == "checkpoint-replay":
                for entry, outcome in zip(batch, outcomes, strict=True):
                    if not isinstance(outcome, Exception):
                        ctx.replay[pair.op].answered_one(entry.seq, outcome)
            self.requests.deliver(pair.op, batch, outcomes)
        except Exception as exc:  # an answer that cannot be read fails what it left open
            log.exception("graph %s: %s's answer failed", ctx.graph.name, pair.op)
            self.requests.fail_batch(pair.op, batch, PredictError(
                f"{pair.op}: its answer could not be read: {type(exc).__name__}: {exc}"))
        finally:
            self.dispatch.pump_all()

    def _on_durable(self, pair: Pair, member: Member, seq: int) -> None:
        ctx = self.ctx
        if member is pair.spare and ctx.plan is not None:  # seeded by a member being
            self.recovery.act(ctx.plan.seeded_at(member.worker_id))  # promoted: not
            return  # durability
        if member is not pair.backup:
            return
        if not member.extra.get("synced"):  # it holds a full state: it may be promoted now
            member.extra["synced"] = True
            if ctx.plan is not None:
                self.recovery.act(ctx.plan.seeded_at(member.worker_id))
        if ctx.plan is not None:  # past the initial state: only copies hold it from now
            ctx.plan.durable(pair.op, seq)
        self.requests.release(ctx.router.notify(pair.op, seq))
        for nxt in ctx.topology.stateful:
            if pair.op in ctx.topology.prev_stateful(nxt):
                backup = ctx.pairs[nxt].backup
                if backup is not None:
                    ctx.tell(backup, hm.Notify(pair.op, seq))


def _outcomes(op: str, message: hm.Out, n: int) -> list[np.ndarray | Exception]:
    """Each row's output, or the error its refusal becomes."""
    return [_refusal_error(op, o) if isinstance(o, hp.Refusal) else np.asarray(o)
            for o in message.outcomes(n)]


def _refusal_error(op: str, refused: hp.Refusal) -> Exception:
    """What a row an operator refused answers: 429 for no room (a full stream table), 400
    for a bad row, 500 for anything else the operator raised."""
    message = f"{op}: {refused.message}"
    if refused.kind == "busy":
        return TooManyStreams(message, refused.retry_after_s)
    return InvalidInput(message) if refused.kind == "bad_input" else PredictError(message)
