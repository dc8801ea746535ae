"""A stateful graph's recovery as one sans-I/O plan (issue 39, DESIGN: "a second failure
during recovery is a normal case").

Every stateful operator has a primary, a backup and a spare (a loaded process with no
state). The plan knows each member's role and what it holds; the driver feeds it what it
sees (a member started, loaded, lost; a backup admitted its primary, holds its first full
state; a member took over at a sequence number) and performs the actions it returns
(start a process, fence one, promote, roll back, let a backup in, attach it, pause, resume,
fail). Any loss at any step folds into the recovery under way, and the plan fails the
graph only when an operator has no member left that holds its state, saying which and why.

A member whose heartbeats stopped but whose process still exists is only suspected
(``suspected``): on a starved machine a healthy process can be silent past the timeout.
It is fenced like a lost one while another member that is not suspected holds its
operator's state (a stalled primary fails over to its backup); but the last holder is
never fenced on a timeout alone (``Suspect``): the graph waits for it, and goes on with it
when it is heard from again (``heard``). A false suspicion can delay replies; it never
turns into a permanent outage. Only a member that is gone for sure (``lost``) can leave an
operator with no holder, and fail the graph.

Who holds an operator's state: its primary (the live state and the copy its backup last
applied, H5), and its backup once it has applied a first full state (``seeded``). A
member that is taking over (a backup being promoted, or a primary rolling back in place,
Fig. 6) holds it too. A spare and a backup still being seeded hold nothing, except while
the operator is *pristine*: until a state past its initial one is durable (``durable``),
the initial state, which every member loads, is a state it may resume from (sequence 0;
what ran since re-runs, as after any failover: none of it left the frontend), so every
loaded member holds what recovery needs. A primary lost at start, before its backup applied
the first copy, is then no loss of state, even with batches in flight: a loaded member takes
over (before, the graph failed for good, answering 503 to a server that had served nothing).

The order of one recovery: the lost primaries' backups are promoted; once every member that
was asked has taken over, the planner (``plan_failover`` over the router's lineages) says
which other operators ran on discarded speculation; each of those rolls back too (its
backup is promoted, or its primary rolls back in place when the backup is gone or holds
nothing yet), and the planner is asked again with the points they really resumed at, until
it lists nothing new. Then ``Resume`` carries the final plan, and every operator without a
backup gets its spare attached and a new spare started. Backups are never attached while a
recovery is under way: the primary they would attach to may be about to change.

Who hears what is durable upstream: the frontend relays each upstream durability notice to
the operator's backup of the moment, and a backup let in with ``Allow`` learns the
watermarks then. A recovery loses notices three ways (a spare being seeded by a promotion is
nobody's backup yet; a member taking over sends its last ones when they count for nothing;
the points the plan resets to are carried by none), so on resuming every backup is told
the watermarks again (``Inform``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from parityserve.core.hams.recovery import Failover

__all__ = ["Allow", "Attach", "Fail", "Fence", "Inform", "Pause", "Planner", "Promote",
           "RecoveryAction", "RecoveryPlan", "Resume", "RollBack", "Start", "Suspect", "Unseed"]


@dataclass(frozen=True)
class Start:
    """Launch a process for ``op`` (it becomes its backup or spare); answer ``started``."""
    op: str


@dataclass(frozen=True)
class Fence:
    """Kill and forget ``member``: lost, or demoted; nothing it sends counts any more."""
    op: str
    member: str
    why: str


@dataclass(frozen=True)
class Suspect:
    """``member`` is silent (``why``) but its process exists, and no other member that is
    not suspected holds ``op``'s state: keep it, send it nothing new, and wait to hear from
    it (``heard``) or to know it gone (``lost``). Fencing it would lose the state for good
    on what may be only a starved scheduler."""
    op: str
    member: str
    why: str


@dataclass(frozen=True)
class Allow:
    """Tell ``backup`` to admit ``primary``'s key (and how far upstream is durable)."""
    op: str
    backup: str
    primary: str


@dataclass(frozen=True)
class Inform:
    """Tell ``backup`` (``op``'s, as a recovery resumes) how far each upstream stateful
    operator is durable, as the frontend knows it after ``Resume``. Without the notices a
    recovery lost, its watermarks stay behind, it applies nothing that needs them, and once
    every client waits for a reply only it can make durable, no later notice comes to move
    them: a reply held for good."""
    op: str
    backup: str


@dataclass(frozen=True)
class Attach:
    """Tell ``primary`` to send its retained copy to ``backup``, then every state after."""
    op: str
    primary: str
    backup: str


@dataclass(frozen=True)
class Promote:
    """``member`` (a seeded backup) becomes ``op``'s primary; answer ``took_over``. With
    ``attach`` (a loaded spare), it first sends the spare the state it takes over with and
    waits for it to be applied, so that from the moment it answers, a second member holds
    the state (a loss of the new primary then is not a loss of the state)."""
    op: str
    member: str
    attach: str | None = None


@dataclass(frozen=True)
class Unseed:
    """``member``, taking over, stops seeding the spare its ``Promote`` attached: that spare
    is lost, so the state will never be applied there, and waiting out the member's seeding
    limit (2 s) would hold every reply of the graph for nothing (a primary and its spare
    lost together). It answers ``took_over`` at once, unseeded; a spare is started after."""
    op: str
    member: str


@dataclass(frozen=True)
class RollBack:
    """``member`` (the primary, whose backup holds nothing) rolls back to its retained
    copy (Fig. 6); answer ``took_over``."""
    op: str
    member: str


@dataclass(frozen=True)
class Pause:
    """Send no more batches to any stateful operator until ``Resume``."""


@dataclass(frozen=True)
class Resume:
    """Apply ``failover`` to the router (what rolled back re-runs, what was in flight on a
    lost primary is sent again), note it, and dispatch again."""
    failover: Failover
    lost: tuple[tuple[str, str], ...]  # (op, member) primaries lost in this recovery


@dataclass(frozen=True)
class Fail:
    """No member holds an operator's state any more: the graph cannot answer consistently."""
    reason: str


RecoveryAction = (Start | Fence | Suspect | Allow | Inform | Attach | Promote | Unseed | RollBack
                  | Pause | Resume | Fail)
Planner = Callable[[Mapping[str, int], int], Failover]  # (resumed points, epoch) -> plan


@dataclass
class _Member:
    op: str
    ready: bool = False  # loaded its model and said hello
    seeded: bool = False  # a backup that applied a first full state
    allow_for: str | None = None  # the primary it was last told to admit
    admitted: bool = False  # ... and it said it does
    attached_to: str | None = None  # the primary last told to send it its base


@dataclass
class _Op:
    primary: str | None = None
    backup: str | None = None
    spare: str | None = None
    starting: int = 0  # Start actions not answered yet
    taker: str | None = None  # the member taking over in the recovery under way
    rolling: bool = False  # the taker is the primary itself, rolling back in place
    seeding: str | None = None  # the spare the taker's Promote attached
    pristine: bool = True  # nothing past the initial state durable: any loaded member will do


@dataclass
class _Recovery:
    lost: list[tuple[str, str]] = field(default_factory=list)  # (op, primary member)
    resumed: dict[str, int] = field(default_factory=dict)  # op -> seq it took over at
    in_place: list[str] = field(default_factory=list)
    promoted: list[str] = field(default_factory=list)


class RecoveryPlan:
    """The members of every stateful operator of one graph, and the recovery under way."""

    def __init__(self, ops: Mapping[str, tuple[str, str, str]], planner: Planner) -> None:
        """``ops``: each operator's first (primary, backup, spare) member ids. The backup
        is not attached yet: ``ready`` of both, then ``Allow`` and ``Attach`` follow."""
        self._planner = planner
        self._ops = {op: _Op(*trio) for op, trio in ops.items()}
        self._members = {m: _Member(op) for op, trio in ops.items() for m in trio}
        self._recovery: _Recovery | None = None
        self._suspected: dict[str, str] = {}  # member -> why: kept, the last holder
        self.epoch = 0
        self.failed: str | None = None

    # ---- what the driver asks --------------------------------------------------------------
    def roles(self, op: str) -> tuple[str | None, str | None, str | None]:
        """(primary, backup, spare): a backup being promoted is nobody's backup any more."""
        o = self._ops[op]
        return o.primary, o.backup, o.spare

    def recovering(self) -> bool:
        return self._recovery is not None

    def taker(self, op: str) -> str | None:
        return self._ops[op].taker

    def seeded(self, member: str) -> bool:
        found = self._members.get(member)
        return found is not None and found.seeded

    def holds(self, member: str) -> bool:
        """Could take over ``member``'s operator: it holds its state (seeded, or loaded
        while the operator is pristine)."""
        found = self._members.get(member)
        return found is not None and self._has_state(found)

    def suspects(self) -> dict[str, str]:
        """The members kept though silent (member -> why), each its operator's last holder."""
        return dict(self._suspected)

    # ---- events ----------------------------------------------------------------------------
    def durable(self, op: str, seq: int) -> None:
        """``op``'s backup applied its state at ``seq``. Past 0, replies built on it may
        have left: from then on only a member given a copy holds what recovery needs."""
        if seq > 0:
            self._ops[op].pristine = False

    def started(self, op: str, member: str) -> list[RecoveryAction]:
        """A process asked for with ``Start`` is launched (not loaded yet)."""
        o = self._ops[op]
        o.starting = max(0, o.starting - 1)
        self._members[member] = _Member(op)
        if self.failed is not None:
            return [Fence(op, member, "the graph has failed")]
        if o.backup is None:
            o.backup = member
        elif o.spare is None:
            o.spare = member
        else:  # more than asked for (a loss crossed a start): not needed
            del self._members[member]
            return [Fence(op, member, "not needed")]
        return []

    def ready(self, member: str) -> list[RecoveryAction]:
        found = self._members.get(member)
        if found is None or self.failed is not None:
            return []
        found.ready = True
        return self._protect(found.op)

    def allowed(self, member: str) -> list[RecoveryAction]:
        """The backup admits its primary: the primary may connect and send its base."""
        found = self._members.get(member)
        if found is None:
            return []
        found.admitted = True
        return self._protect(found.op)  # not during a recovery: it attaches on resuming

    def seeded_at(self, member: str) -> list[RecoveryAction]:
        """The backup applied a first full state: it may be promoted from now on. Or the
        spare applied the state a member being promoted sent it (``Promote.attach``)."""
        found = self._members.get(member)
        if found is None:
            return []
        o = self._ops[found.op]
        if o.backup == member or (o.spare == member and o.taker is not None and not o.rolling):
            found.seeded = True  # (from a suspect? then it is alive, and soon heard)
        return []

    def took_over(self, member: str, seq: int, seeded: str | None = None
                  ) -> list[RecoveryAction]:
        """A promoted backup, or a primary rolled back in place, is at state ``seq``;
        ``seeded``: the spare it attached, which holds that state too."""
        found = self._members.get(member)
        rec = self._recovery
        if found is None or rec is None or self._ops[found.op].taker != member:
            return []
        o = self._ops[found.op]
        actions: list[RecoveryAction] = []
        if seeded is not None and seeded == o.spare and o.backup is None:
            spare = self._members[seeded]  # the new backup, attached to the new primary
            spare.seeded, spare.admitted = True, True
            spare.allow_for = spare.attached_to = member
            o.backup, o.spare = seeded, None
        if o.primary is not None and o.primary != member:  # demoted: it must answer nothing
            actions.append(self._drop(found.op, o.primary, "demoted: its backup took over"))
        if o.rolling and o.backup is not None:  # it may hold states of the discarded run:
            self._members[o.backup].allow_for = None  # attach it again, from a new base
        o.primary, o.taker, o.rolling, o.seeding = member, None, False, None
        o.pristine = o.pristine and seq == 0  # (a state past 0 was changed by a batch)
        rec.resumed[found.op] = seq
        return actions + self._advance()

    def suspected(self, member: str, why: str) -> list[RecoveryAction]:
        """``member`` is silent past the heartbeat timeout (or did not answer in time), but
        its process exists: not known to be dead. Lost, unless it is the last member
        holding its operator's state that is not suspected itself: then kept (``Suspect``)."""
        found = self._members.get(member)
        if found is None:
            return []
        if self.failed is None and member in self._holders(found.op) \
                and not self._another_holder(found.op, member):
            self._suspected[member] = why
            return [Suspect(found.op, member, why)]
        return self.lost(member, why)

    def heard(self, member: str) -> list[RecoveryAction]:
        """A suspected member spoke again: it is alive and goes on in its role. Another
        suspect of its operator that is no longer the last holder is lost now (a stalled
        primary whose backup was suspected too fails over once the backup is heard)."""
        found = self._members.get(member)
        if found is None or self._suspected.pop(member, None) is None:
            return []
        return self._recheck(found.op)

    def lost(self, member: str, why: str) -> list[RecoveryAction]:
        """Any member is gone for sure (it exited), or suspected and not the last holder."""
        found = self._members.get(member)
        self._suspected.pop(member, None)
        if found is None:
            return []
        op, o = found.op, self._ops[found.op]
        taker, primary = o.taker == member, o.primary == member
        seeder = o.taker if o.seeding == member else None  # it was seeding this spare
        actions: list[RecoveryAction] = [self._drop(op, member, why)]
        if seeder is not None:
            o.seeding = None
            actions.append(Unseed(op, seeder))
        if self.failed is not None:
            return actions
        if taker:
            return actions + self._taker_lost(op, member, why)
        if primary:
            return actions + self._primary_lost(op, member, why)
        return actions + self._protect(op)

    # ---- the plan --------------------------------------------------------------------------
    def _primary_lost(self, op: str, member: str, why: str) -> list[RecoveryAction]:
        o = self._ops[op]
        actions: list[RecoveryAction] = []
        if self._recovery is None:
            self._recovery = _Recovery()
            actions.append(Pause())
        rec = self._recovery
        rec.lost.append((op, member))
        if o.taker is not None:  # a demotion under way (its backup is taking over): it goes on
            return actions
        if op in rec.resumed:  # took over in this recovery, and lost again before a backup
            rec.resumed.pop(op)
        promote = self._promote_successor(op)
        if promote is None:
            return actions + self._fail(op, f"its primary {member} was lost ({why}) and "
                                        + self._no_backup(o))
        rec.promoted.append(op)
        return [*actions, promote]

    def _promote_successor(self, op: str) -> Promote | None:
        """The backup takes over if it holds the state; else a spare that does (one a
        promotion seeded, or any loaded one while ``op`` is pristine)."""
        o = self._ops[op]
        for candidate in (o.backup, o.spare):
            member = self._members.get(candidate) if candidate is not None else None
            if candidate is None or member is None or not self._has_state(member):
                continue
            if candidate == o.spare:
                o.spare = None
            else:
                o.backup = None
            o.taker, o.seeding = candidate, self._loaded_spare(o)
            return Promote(op, candidate, o.seeding)
        return None

    def _has_state(self, member: _Member) -> bool:
        return member.seeded or (member.ready and self._ops[member.op].pristine)

    def _taker_lost(self, op: str, member: str, why: str) -> list[RecoveryAction]:
        o = self._ops[op]
        o.taker = o.seeding = None
        if not o.rolling:  # a spare the lost member seeded (Promote.attach) holds the state
            promote = self._promote_successor(op)  # it took over with: it takes over instead
            if promote is not None:
                return [promote]
        if o.rolling or o.primary is None:
            o.rolling = False
            if o.primary == member:
                o.primary = None
            return self._fail(op, f"{member} was lost ({why}) while taking over, and no other "
                              "member holds the state (primary and backup both lost)")
        return self._roll_back(op)  # a demotion whose backup died: Fig. 6 after all

    def _advance(self) -> list[RecoveryAction]:
        """Everyone asked has taken over: plan again, until nothing new is listed."""
        rec = self._recovery
        if rec is None or any(o.taker is not None for o in self._ops.values()):
            return []
        if not rec.resumed:  # every loss so far was undone by another (cannot happen)
            return self._resume(rec, Failover(self.epoch + 1, (), {}, (), (), False))
        plan = self._planner(dict(rec.resumed), self.epoch + 1)
        extra = [op for op in plan.bounds if op not in rec.resumed]
        if not extra:
            return self._resume(rec, plan)
        actions: list[RecoveryAction] = []
        for op in extra:
            actions += self._demote(op)
        return actions + self._advance() if self.failed is None else actions

    def _demote(self, op: str) -> list[RecoveryAction]:
        """``op`` ran on discarded speculation: its seeded backup takes over (the primary
        is fenced once it has), else its primary rolls back in place."""
        o = self._ops[op]
        backup = o.backup
        if backup is not None and self._has_state(self._members[backup]):
            o.backup, o.taker = None, backup
            assert self._recovery is not None
            self._recovery.promoted.append(op)
            return [Promote(op, backup, self._loaded_spare(o))]
        return self._roll_back(op)

    def _roll_back(self, op: str) -> list[RecoveryAction]:
        o = self._ops[op]
        if o.primary is None:
            return self._fail(op, "its primary was lost and " + self._no_backup(o))
        o.taker, o.rolling = o.primary, True
        assert self._recovery is not None
        self._recovery.in_place.append(op)
        return [RollBack(op, o.primary)]

    def _resume(self, rec: _Recovery, plan: Failover) -> list[RecoveryAction]:
        self.epoch = plan.epoch
        final = replace(plan, failed=tuple(dict.fromkeys(op for op, _ in rec.lost)),
                        promote=tuple(op for op in dict.fromkeys(rec.promoted)
                                      if op not in rec.in_place),
                        roll_back_in_place=tuple(dict.fromkeys(rec.in_place)))
        self._recovery = None
        actions: list[RecoveryAction] = [Resume(final, tuple(rec.lost))]
        for op in self._ops:
            actions += self._protect(op)
            backup = self._ops[op].backup
            if backup is not None and self._members[backup].ready:
                actions.append(Inform(op, backup))
        return actions

    def _protect(self, op: str) -> list[RecoveryAction]:
        """Give ``op`` a backup (its spare, else a new process) and a spare, and attach a
        loaded, unseeded backup to the primary. Not during a recovery, not after failing."""
        o = self._ops[op]
        if self._recovery is not None or self.failed is not None or o.primary is None:
            return []
        actions: list[RecoveryAction] = []
        if o.backup is None and o.spare is not None:
            o.backup, o.spare = o.spare, None
        wanted = (o.backup is None) + (o.spare is None)
        for _ in range(max(0, wanted - o.starting)):
            o.starting += 1
            actions.append(Start(op))
        backup = self._members.get(o.backup) if o.backup is not None else None
        if o.backup is None or backup is None or not backup.ready or backup.seeded:
            return actions
        if backup.allow_for != o.primary:  # (again: the primary it admitted is gone)
            backup.allow_for, backup.admitted, backup.attached_to = o.primary, False, None
            actions.append(Allow(op, o.backup, o.primary))
        elif backup.admitted and backup.attached_to != o.primary:
            backup.attached_to = o.primary
            actions.append(Attach(op, o.primary, o.backup))
        return actions

    def _holders(self, op: str) -> set[str]:
        """The members holding ``op``'s state: its primary, a member taking over, and a
        backup (or a spare a promotion attached) that applied a full state."""
        o = self._ops[op]
        found = {m for m in (o.primary, o.taker) if m is not None}
        for m in (o.backup, o.spare):
            member = self._members.get(m) if m is not None else None
            if m is not None and member is not None and self._has_state(member):
                found.add(m)
        return found

    def _another_holder(self, op: str, member: str) -> bool:
        return any(m != member and m not in self._suspected for m in self._holders(op))

    def _recheck(self, op: str) -> list[RecoveryAction]:
        """Suspects of ``op`` kept as its last holder that no longer are: lost now."""
        actions: list[RecoveryAction] = []
        for member, why in list(self._suspected.items()):
            found = self._members.get(member)
            if found is not None and found.op == op and self._another_holder(op, member) \
                    and self.failed is None:
                actions += self.lost(member, why)
        return actions

    def _loaded_spare(self, o: _Op) -> str | None:
        spare = self._members.get(o.spare) if o.spare is not None else None
        return o.spare if spare is not None and spare.ready else None

    def _drop(self, op: str, member: str, why: str) -> Fence:
        self._members.pop(member, None)
        self._suspected.pop(member, None)
        o = self._ops[op]
        for role in ("primary", "backup", "spare", "taker"):
            if getattr(o, role) == member:
                setattr(o, role, None)
        return Fence(op, member, why)

    def _no_backup(self, o: _Op) -> str:
        if o.backup is None:
            return "it had no backup (lost before a new one was attached)"
        if not self._members[o.backup].ready:
            return f"its backup {o.backup} was still loading, with no state"
        return f"its backup {o.backup} was still receiving its first full state"

    def _fail(self, op: str, why: str) -> list[RecoveryAction]:
        self.failed = f"no member holds {op}'s state: {why}"
        self._recovery = None
        return [Fail(self.failed)]
