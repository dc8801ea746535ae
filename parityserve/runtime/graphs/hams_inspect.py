"""What a graph shows of itself: ``statistics()`` (the graph's part of ``/admin/state``) and
the state digests the replay check compares, asked of the operator processes themselves.
"""

from __future__ import annotations

import asyncio
from typing import Any

from parityserve.runtime.graphs import hams_messages as hm
from parityserve.runtime.graphs import hams_protocol as hp
from parityserve.runtime.graphs.hams_baselines import Baselines
from parityserve.runtime.graphs.hams_context import GraphContext, Pair
from parityserve.runtime.graphs.hams_dispatch import Dispatch
from parityserve.runtime.graphs.hams_members import Member
from parityserve.runtime.graphs.hams_recovery import RecoveryDriver
from parityserve.runtime.graphs.hams_requests import Requests
from parityserve.runtime.graphs.hams_watch import Watch

__all__ = ["Inspection"]


class Inspection:
    def __init__(self, ctx: GraphContext, requests: Requests, dispatch: Dispatch,
                 recovery: RecoveryDriver, baselines: Baselines, watch: Watch) -> None:
        self.ctx, self.requests, self.dispatch = ctx, requests, dispatch
        self.recovery, self.baselines, self.watch = recovery, baselines, watch
        self.slow: dict[str, float] = {}  # injected state delays (shown in the statistics)

    def ready(self) -> bool:
        """Not broken, every primary up, and no operator stalled: one that has had work
        for longer than ``timeout_ms`` without finishing a batch is as good as wedged."""
        return self.ctx.broken is None and all(
            p.primary is not None and p.primary.hello.done()
            for p in self.ctx.pairs.values()) and not self.dispatch.stalled()

    def whole(self, pair: Pair) -> bool:
        """Can take one more failure at full speed: a live primary, a seeded backup (with a
        backup mode), a loaded spare, and no loss noticed but not yet recovered from."""
        held = self.ctx.held
        members = [pair.primary] + ([pair.backup, pair.spare] if held else [])
        if any(m is None or m.lost or not m.hello.done() for m in members):
            return False  # a spare still loading its model could not take over yet
        return not held or bool(pair.backup and pair.backup.extra.get("synced"))

    async def state_digests(self) -> dict[str, dict[str, Any]]:
        """Each stateful operator's state on its primary and its backup: the sha256 digest
        (``state_digest``) and the request it is after, asked of the processes themselves.
        Read when no batch is running, the replay check compares them with a replay of what
        clients saw, and a synced backup's with its primary's."""
        ctx, out = self.ctx, {}
        while ctx.plan is not None and ctx.plan.recovering():
            await asyncio.sleep(0.01)  # no member changes role while we ask
        async with ctx.recovery:
            for op, pair in ctx.pairs.items():
                backup = await self._digest(pair.backup)
                if backup is not None and pair.backup is not None:  # holds a full state yet?
                    backup["synced"] = bool(pair.backup.extra.get("synced"))
                out[op] = {"primary": await self._digest(pair.primary), "backup": backup}
        return out

    async def _digest(self, member: Member | None) -> dict[str, Any] | None:
        if member is None or member.lost or not member.hello.done():
            return None
        answer: hm.Digest = await self.ctx.ask(member, hp.DIGEST, hm.DigestAsk())
        found: dict[str, Any] = {"seq": answer.seq, "digest": answer.digest, "pid": member.pid}
        if answer.shipped is not None:  # a primary: full copies and deltas sent
            found["shipped"] = dict(answer.shipped)
        return found

    def statistics(self) -> dict[str, Any]:
        ctx, requests = self.ctx, self.requests
        now, router = ctx.clock(), ctx.router
        closing = requests.gate.closing()  # new streams refused at the door, until when
        ops = {}
        for op in ctx.topology.operators:
            manager = router.managers[op]
            out = ctx.inflight[op].statistics(now)
            entry: dict[str, Any] = {"last_seq": manager.last_seq, "queued": manager.queued(),
                                     "stateful": op in ctx.pairs, "inflight": out.inflight,
                                     "oldest_inflight_s": round(out.oldest_s, 3),
                                     "expired_batches": out.expired,
                                     "batches_sent": out.sent, "rows_sent": out.rows}
            if op in ctx.pairs:
                entry.update(self._stateful(op, ctx.pairs[op]))
                until = closing.get(op)
                entry["new_streams_refused_for_s"] = round(max(0.0, until - now), 3) \
                    if until is not None else 0.0
            ops[op] = entry
        return {"mode": ctx.mode, "ready": self.ready(), "broken": ctx.broken,
                "recovering": ctx.recovery.locked() or bool(
                    ctx.plan and ctx.plan.recovering()),
                "held_replies": router.commit.held(), "waiting": len(requests.waiting),
                "abandoned": len(requests.abandoned),
                "records": router.records(), "stalled": self.dispatch.stalled(),
                "input_shape": list(requests.input_shape)
                if requests.input_shape is not None else None,
                "epoch": router.epoch, "operators": ops, "state_delay_s": self.slow,
                "replay_conflicts": self.baselines.replay_conflicts,
                "redispatched_rows": self.dispatch.redispatched,
                "losses": list(self.watch.losses), "suspects": list(self.recovery.suspects),
                "failovers": [r.to_json() for r in ctx.failovers]}

    def _stateful(self, op: str, pair: Pair) -> dict[str, Any]:
        replay = self.ctx.replay[op]
        return dict(durable=self.ctx.router.commit.durable[op] if self.ctx.held else None,
                    primary_pid=pair.primary.pid if pair.primary else None,
                    backup_pid=pair.backup.pid if pair.backup else None,
                    backup_synced=bool(pair.backup and pair.backup.extra.get("synced")),
                    since_checkpoint=replay.since_checkpoint,
                    answered_since_checkpoint=replay.answered_since_checkpoint,
                    checkpoint=replay.checkpoint, whole=self.whole(pair),
                    spare_pid=pair.spare.pid if pair.spare else None,
                    primary_node=pair.primary.node if pair.primary else None,
                    backup_node=pair.backup.node if pair.backup else None,
                    spare_node=pair.spare.node if pair.spare else None)
