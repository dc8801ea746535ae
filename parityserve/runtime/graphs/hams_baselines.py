"""The baselines without a backup: ``bare`` (no fault tolerance) and ``checkpoint-replay``
(Lineage Stash's way). A lost primary is started afresh, one recovery at a time: bare's
loses its state, checkpoint-replay's restores the last checkpoint and runs the logged
batches again (``hams_replay``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import Sequence

import numpy as np

from parityserve.core.hams import Failover
from parityserve.errors import Unavailable
from parityserve.runtime.graphs import hams_protocol as hp
from parityserve.runtime.graphs.hams_context import FailoverRecord, GraphContext, Pair, log
from parityserve.runtime.graphs.hams_dispatch import Dispatch
from parityserve.runtime.graphs.hams_members import Member
from parityserve.runtime.graphs.hams_membership import Membership
from parityserve.runtime.graphs.hams_requests import Requests

__all__ = ["Baselines"]


class Baselines:
    def __init__(self, ctx: GraphContext, members: Membership, requests: Requests,
                 dispatch: Dispatch) -> None:
        self.ctx, self.members, self.requests, self.dispatch = ctx, members, requests, dispatch
        self.replaying: dict[int, tuple[list[int], asyncio.Future[None]]] = {}
        self.replay_conflicts = 0  # checkpoint-replay: replayed outputs that differed

    async def recover(self, op: str, member: Member, how: str, detected_at: float) -> None:
        """bare and checkpoint-replay: a lost primary is started afresh (no backup to lose)."""
        ctx = self.ctx
        async with ctx.recovery:
            pair = ctx.pairs[op]
            try:
                if member is pair.primary:
                    ctx.paused = True
                    self.members.forget(member)
                    record = FailoverRecord(pair.op, how, detected_at, member.pid)
                    if ctx.mode == "checkpoint-replay":
                        await self._replay(pair, record)
                    else:
                        await self._restart_bare(pair, record)
                else:
                    self.members.forget(member)
            except Exception as exc:  # beyond the failure model: say so, stop accepting
                log.exception("graph %s: recovery of %s failed", ctx.graph.name, op)
                self.requests.break_all(f"recovery of {op} failed: {exc}")
            finally:
                ctx.paused = False
                self.dispatch.pump_all()

    async def _replay(self, pair: Pair, record: FailoverRecord) -> None:
        """Checkpoint-replay: a fresh process restores the last checkpoint, then every
        logged batch since it runs again, in order, under its original numbers. Outputs
        that clients already have are compared, not sent: with non-determinism they differ,
        and each difference is a conflict this baseline cannot avoid (HAMS's point)."""
        ctx = self.ctx
        ctx.inflight[pair.op].clear()
        for attempt in itertools.count(1):
            pair.primary = self.members.launch(pair.op, "primary")
            try:
                restored = await self._replay_into(pair, pair.primary)
                break
            except Unavailable:  # the fresh process died too: start over, from the file
                if attempt >= 3:
                    raise
        log_ = ctx.replay[pair.op]
        record.bounds = {pair.op: restored}
        record.replayed = log_.replayed_batches
        record.protocol_done_at = ctx.clock()
        ctx.failovers.append(record)

    async def _replay_into(self, pair: Pair, primary: Member) -> int:
        hello = await self.members.hello(primary)
        restored = hello.restored
        for header, rows in self.ctx.replay[pair.op].after(restored):
            bid = next(self.dispatch.bids)
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.replaying[bid] = (header["seqs"], done)
            self.ctx.send(primary, {**header, "bid": bid}, rows)
            while not done.done():
                if primary.exited():
                    self.replaying.pop(bid, None)
                    raise Unavailable(f"{pair.op}: the replaying process died")
                await asyncio.wait([done], timeout=0.01)
        return restored

    def replayed(self, op: str, seqs: list[int],
                 outcomes: Sequence[np.ndarray | Exception]) -> None:
        """Compare with what was answered; answer what never was."""
        log_ = self.ctx.replay[op]
        manager = self.ctx.router.managers[op]
        for seq, row in zip(seqs, outcomes, strict=True):
            entry = manager.current(seq)
            if isinstance(row, Exception):
                if entry is not None:
                    self.requests.refuse(op, entry, row)
                continue
            if log_.conflicts_with(seq, row):
                self.replay_conflicts += 1
            if entry is not None and not entry.done:
                log_.answered_one(seq, row)
                self.requests.output(op, entry, np.asarray(row))

    async def _restart_bare(self, pair: Pair, record: FailoverRecord) -> None:
        """No fault tolerance: a fresh primary with a fresh state; the requests the lost one
        never answered run again on it (the state they had built is gone)."""
        ctx = self.ctx
        manager = ctx.router.managers[pair.op]
        done = 0
        for entry in manager.dispatched():
            if not entry.done:
                break
            done = entry.seq
        ctx.inflight[pair.op].clear()
        pair.primary = self.members.launch(pair.op, "primary")
        await self.members.hello(pair.primary)
        ctx.router.apply(Failover(ctx.router.epoch + 1, (pair.op,), {pair.op: done},
                                  (), (), False))
        record.bounds = {pair.op: done}
        record.protocol_done_at = ctx.clock()
        ctx.failovers.append(record)

    def checkpointed(self, op: str, seq: int) -> None:
        """The operator's state after ``seq`` is stored, and its outputs are here (they came
        first on the same socket): a fresh primary starts from it now, so the log before it
        and the checkpoint before it can go. A checkpoint whose primary died before saying
        so is never restored, and stays until the graph closes its store."""
        older = self.ctx.replay[op].checkpoint
        self.ctx.replay[op].checkpointed(seq)
        if 0 < older < seq:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(hp.checkpoint_file(self.ctx.checkpoint_path(op), older))
