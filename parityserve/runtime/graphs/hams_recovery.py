"""The driver of a graph's recovery plan (hams, remus): performs what the pure
``RecoveryPlan`` (``core/hams/recovery_plan.py``) decides, and tells it what happened.

A lost primary is replaced by its backup (``plan_failover`` says which other operators must
roll back with it), the spare becomes the new backup, and a new spare is started (what each
member is told: ``hams_handover``). A member
silent past the timeout whose process exists is only suspected: fenced if another member
holds its state, else kept and waited for until it speaks again (issue 39).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import numpy as np

from parityserve.core.hams import Held, RecoveryPlan
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
    Unseed,
)
from parityserve.errors import Unavailable
from parityserve.runtime.graphs import hams_messages as hm
from parityserve.runtime.graphs import hams_protocol as hp
from parityserve.runtime.graphs.hams_context import FailoverRecord, GraphContext, Pair, log
from parityserve.runtime.graphs.hams_dispatch import Dispatch
from parityserve.runtime.graphs.hams_handover import Handover
from parityserve.runtime.graphs.hams_members import Member
from parityserve.runtime.graphs.hams_membership import Membership
from parityserve.runtime.graphs.hams_requests import Requests

__all__ = ["RecoveryDriver"]


class RecoveryDriver:
    def __init__(self, ctx: GraphContext, members: Membership, requests: Requests,
                 dispatch: Dispatch) -> None:
        self.ctx, self.members, self.requests, self.dispatch = ctx, members, requests, dispatch
        self.handover = Handover(ctx, members)
        self._lost_at: dict[str, tuple[str, float, int]] = {}  # member -> (how, when, pid)
        # members silent past the timeout but alive and kept as their operator's last
        # holder (issue 39), and whether they were heard from again: newest last
        self.suspects: deque[dict[str, Any]] = deque(maxlen=100)

    def begin(self) -> None:
        """Every member is loaded: the plan takes over the roles, and attaches the backups."""
        ctx = self.ctx
        ctx.plan = RecoveryPlan({op: _ids(p) for op, p in ctx.pairs.items()},
                                ctx.failover_plan)
        for pair in ctx.pairs.values():
            for member in (pair.primary, pair.backup, pair.spare):
                assert member is not None
                self.act(ctx.plan.ready(member.worker_id))

    def act(self, actions: list[RecoveryAction]) -> None:
        """Perform what the plan says, then show its roles in ``pairs``. An action that
        raises is logged; the plan hears of its member through the monitor."""
        for action in actions:
            log.info("graph %s: recovery action %s", self.ctx.graph.name, action)
            try:
                self._perform(action)
            except Exception:
                log.exception("graph %s: recovery action %s failed", self.ctx.graph.name,
                              action)
        self._sync_pairs()

    def _perform(self, action: RecoveryAction) -> None:
        ctx = self.ctx
        assert ctx.plan is not None
        if isinstance(action, Start):
            member = self.members.launch(action.op, "backup")
            self.act(ctx.plan.started(action.op, member.worker_id))
        elif isinstance(action, Fence):
            if (found := self.members.member(action.member)) is not None:
                log.warning("graph %s: %s fenced (%s)", ctx.graph.name, action.member,
                            action.why)
                found.lost = found.lost or f"fenced: {action.why}"  # nothing is sent to it
                self.members.forget(found)
        elif isinstance(action, Suspect):
            self._keep(action)
        elif isinstance(action, Allow):
            ctx.spawn(self._allow(action))
        elif isinstance(action, Attach):
            self.handover.attach(action)
        elif isinstance(action, Inform):
            self.handover.inform(action)
        elif isinstance(action, Promote | RollBack):
            ctx.spawn(self._take_over(action))
        elif isinstance(action, Unseed):
            if (found := self.members.member(action.member)) is not None:
                ctx.tell(found, hm.Unseed())
        elif isinstance(action, Pause):
            ctx.paused = True
        elif isinstance(action, Resume):
            self._resume(action)
        elif isinstance(action, Fail):
            log.error("graph %s: %s", ctx.graph.name, action.reason)
            self.requests.break_all(action.reason)

    def _sync_pairs(self) -> None:
        ctx = self.ctx
        assert ctx.plan is not None
        for op, pair in ctx.pairs.items():
            pair.primary, pair.backup, pair.spare = (
                self.members.member(m) for m in ctx.plan.roles(op))
            if pair.backup is not None and ctx.plan.seeded(pair.backup.worker_id):
                pair.backup.extra["synced"] = True  # (seeded as a spare, by a promotion)

    def lost(self, member: Member, why: str) -> None:
        assert self.ctx.plan is not None
        self._lost_at.setdefault(member.worker_id, (why, self.ctx.clock(), member.pid))
        self.act(self.ctx.plan.lost(member.worker_id, why))

    def suspect(self, member: Member, why: str) -> None:
        """Silent past the timeout, or no answer in time. A process that exited is lost;
        one that exists is only suspected (a starved machine can hold a healthy process
        that long), and the plan keeps it if it is the last holder of its state."""
        assert self.ctx.plan is not None
        if member.exited():
            self.lost(member, why)
            return
        self._lost_at.setdefault(member.worker_id, (why, self.ctx.clock(), member.pid))
        self.act(self.ctx.plan.suspected(member.worker_id, why))

    def _kept(self, member: Member, why: str) -> bool:
        """After ``member`` did not answer in time: is it still to be waited for?"""
        assert self.ctx.plan is not None
        if member.worker_id not in self.ctx.plan.suspects():
            self.suspect(member, why)
        return member.worker_id in self.ctx.plan.suspects()

    def _keep(self, action: Suspect) -> None:
        """The plan keeps a silent member, its operator's last holder: nothing new goes to
        it (``lost`` holds dispatch) until it speaks again (``heard_again``)."""
        member = self.members.member(action.member)
        if member is None:
            return
        member.lost = "timeout"
        self.suspects.append({"member": member.worker_id, "pid": member.pid, "op": action.op,
                              "why": action.why, "silent_ms": round(
                                  (self.ctx.clock() - member.last_beat) * 1e3, 1),
                              "heard_again": False})
        log.warning("graph %s: %s is silent (%s) but its process exists, and no other member "
                    "holds %s's state: kept, not fenced; the graph waits for it",
                    self.ctx.graph.name, member.worker_id, action.why, action.op)

    def heard_again(self, member: Member) -> None:
        """A kept suspect spoke: it was alive all along; it goes on in its role."""
        assert self.ctx.plan is not None
        member.lost = None
        self._lost_at.pop(member.worker_id, None)
        for record in self.suspects:
            if record["member"] == member.worker_id:
                record["heard_again"] = True
        log.warning("graph %s: %s is heard from again: it goes on", self.ctx.graph.name,
                    member.worker_id)
        self.act(self.ctx.plan.heard(member.worker_id))
        self.dispatch.pump_all()

    async def _allow(self, action: Allow) -> None:
        """Let the backup in for its primary; then the plan attaches it."""
        try:
            backup = await self.handover.allow(action)
        except Unavailable as exc:  # dead or hung: a lost backup, which the plan replaces
            if (found := self.members.member(action.backup)) is not None:
                self.suspect(found, str(exc))  # (it holds no state: never kept)
            return
        if backup is not None and self.ctx.plan is not None:
            self.act(self.ctx.plan.allowed(action.backup))

    async def _take_over(self, action: Promote | RollBack) -> None:
        ctx = self.ctx
        member = self.members.member(action.member)
        if member is None or ctx.plan is None:
            return
        order, spare = self.handover.order(action, member)
        future: asyncio.Future[hm.Promoted] = asyncio.get_running_loop().create_future()
        member.extra[hp.PROMOTED] = future
        ctx.tell(member, order)
        awake = 0  # windows in which it spoke (so it runs) yet did not answer
        while True:
            opened = ctx.clock()
            try:
                answer = await ctx.answer(member, hp.PROMOTED, order.KIND, future,
                                          TAKE_OVER_S)
                break
            except Unavailable as exc:  # alive and the last holder: its answer still counts
                awake += member.last_beat >= opened
                if awake >= WEDGED_AFTER and not member.exited():
                    self.lost(member, f"wedged: it spoke but did not answer {order.KIND} in "
                              f"{awake} windows of {TAKE_OVER_S:g} s")
                    return
                if not self._kept(member, str(exc)):
                    return
                member.extra[hp.PROMOTED] = future
        seeded = spare.worker_id if answer.seeded and spare is not None else None
        self.act(ctx.plan.took_over(action.member, answer.seq, seeded))

    def _resume(self, action: Resume) -> None:
        """The plan is complete: roll back and discard in the router, note each lost
        primary's failover, dispatch again (what rolled back runs again)."""
        ctx, plan = self.ctx, action.failover
        # the roles as the plan has them now, before anything is dispatched: a demoted
        # primary, fenced in this same round of actions, was still the pair's primary, and
        # the work its operator re-runs went to a dead process, in flight until the
        # watchdog failed it timeout_ms later (the 30 s seq2 stalls after a failover)
        self._sync_pairs()
        discarded = ctx.router.apply(plan)
        covered: list[Held[np.ndarray]] = []  # by a promoted backup's point: they leave
        for op, seq in plan.bounds.items():
            covered += ctx.router.commit.reset(op, seq)
            ctx.inflight[op].clear()
            if op in ctx.heard:
                ctx.heard[op].reset(seq)
        now = ctx.clock()
        for op, lost in action.lost:
            how, at, pid = self._lost_at.get(lost, ("exit", now, 0))
            ctx.failovers.append(FailoverRecord(
                op, how, at, pid, protocol_done_at=now, bounds=dict(plan.bounds),
                rolled_back_in_place=list(plan.roll_back_in_place),
                discarded_replies=len(discarded)))
            log.warning("graph %s: %s primary %s lost (%s); resumed at %s, protocol %.1f ms",
                        ctx.graph.name, op, lost, how, plan.bounds, (now - at) * 1e3)
        self._lost_at.clear()
        self.requests.release(covered)
        ctx.paused = False
        self.dispatch.pump_all()


TAKE_OVER_S = 8.0  # a member taking over answers once the spare holds its state, or in 2 s
# A member starved of the CPU is silent, and kept while it holds the state (the plan's
# ``Suspect``) for as long as that lasts. One that keeps speaking (heartbeats) yet never
# answers its promotion is wedged, not starved: after this many windows it is lost, and the
# plan goes on without it (its seeded spare takes over) or says why it cannot. Before, it
# was suspected, heard and suspected again every 8 s, for ever.
WEDGED_AFTER = 3


def _ids(pair: Pair) -> tuple[str, str, str]:
    members = (pair.primary, pair.backup, pair.spare)
    assert all(m is not None for m in members)
    return tuple(m.worker_id for m in members if m is not None)  # type: ignore[return-value]
