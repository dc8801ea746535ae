"""The recovery plan model-checked (issue 39): hypothesis drives ``RecoveryPlan`` through
random interleavings of batches, copies, message deliveries, the plan's own round trips
(processes starting and loading, ALLOW, the base state, PROMOTE, ROLLBACK) and losses of any
member at any step: a primary, a backup, a spare, a backup still being seeded, a member
being promoted, the promoted primary again, and the next operator's members. And false
suspicions (issue 39's outage under load): any live member silent past the heartbeat
timeout (``suspected``), then heard from again (``heard``: any message it sends).

The graph is ``hams_sim.Sim`` (the real router, shippers and appliers, with injected
non-determinism); every action the plan returns is performed on it the way the runtime
performs it. Invariants: the plan fails the graph only when some operator has no live
member holding its state; a member fenced on a suspicion alone leaves a holder of its state
that is not suspected; after the run drains, every client request has exactly one
answer (a reply, or the failure): first with no new request (a client waits for its reply
before it sends more, so no reply may need later traffic to leave), then with the rest; no
(operator, sequence) had two durable values, and unless the graph failed, every state
equals the replay of its durable history with primary and backup identical
(``Sim.problems``). A primary sends states only to the backup it sent its base to.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from parityserve.core.hams import (
    FRONTEND,
    BackupApplier,
    CopyOrder,
    Failover,
    Heard,
    PrimaryShipper,
    StateRecord,
    Topology,
    plan_failover,
)
from parityserve.core.hams.recovery_plan import (
    Allow,
    Attach,
    Fail,
    Fence,
    Inform,
    Pause,
    Promote,
    RecoveryAction,
    RecoveryPlan,
    Resume,
    RollBack,
    Start,
    Suspect,
    Unseed,
)
from tests.unit.core.hams.hams_sim import Backup, Msg, Primary, Sim, Snapshot
from tests.unit.core.hams.test_hams_protocol import ADJACENT, CHAIN, THREE

MAX_LOSSES = 4
MAX_SUSPICIONS = 4
CLIENTS = 8


class PlanSim(Sim):
    """``Sim`` whose crashes and recoveries all go through one ``RecoveryPlan``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.dead: set[int] = set()
        self.paused = False
        self.failed: str | None = None
        self.failed_holders: dict[str, set[int]] = {}
        self.pending: list[tuple] = []
        self.seeded_spares: dict[str, Backup] = {}  # spares a promoted member sent its state
        self.early: dict[int, dict[str, int]] = {}  # notices a backup heard before its base
        self.attached: dict[int, int] = {}  # primary -> the backup it sent its base to
        self.suspects: set[int] = set()  # kept by the plan though silent: stalled, alive
        self.seeders: set[tuple[str, str]] = set()  # (op, member) told to seed a spare
        self.loaded: set[int] = set()  # members that said hello (their model is loaded)
        self.pristine = set(self.topology.stateful)  # nothing past the initial state durable
        trios = {}
        for op in sorted(self.topology.stateful):
            self.backups[op] = None  # attached through the plan, as at a real start
            trios[op] = (str(self.primaries[op].pid), str(self._pid()), str(self._pid()))
        self.plan = RecoveryPlan(trios, self._planner)
        for trio in trios.values():
            for member in trio:
                self.loaded.add(int(member))
                self.perform(self.plan.ready(member))

    def _planner(self, resumed: Mapping[str, int], epoch: int) -> Failover:
        applied = {o: self.router.commit.durable[o] for o in self.topology.stateful}
        applied.update(resumed)
        executed = {o: self.router.executed(o) for o in self.topology.operators}
        executed[FRONTEND] = self.router.held()
        return plan_failover(self.topology, resumed, applied, executed, epoch)

    # ---- the runtime's side: perform what the plan says ---------------------------------
    def perform(self, actions: list[RecoveryAction]) -> None:
        for action in actions:
            if isinstance(action, Start):
                self.pending.append(("started", action.op))
            elif isinstance(action, Fence):
                self._kill(action.op, int(action.member))
            elif isinstance(action, Suspect):
                self.suspects.add(int(action.member))
            elif isinstance(action, Allow):
                self.pending.append(("allowed", action.backup))
            elif isinstance(action, Attach):
                self.pending.append(("base", action.op, action.backup, action.primary))
            elif isinstance(action, Inform):
                self._inform(action.op, int(action.backup))
            elif isinstance(action, Promote):
                self._pristine_taker(action.op, action.member)
                self.pending.append(("promote", action.op, action.member, action.attach))
                if action.attach is not None:
                    self.seeders.add((action.op, action.member))
            elif isinstance(action, RollBack):
                self.pending.append(("take", action.op, action.member, True, None))
            elif isinstance(action, Unseed):  # only a member told to seed a spare is told
                assert (action.op, action.member) in self.seeders, action  # to stop; here
                # a promotion seeds no dead spare anyway (``_seed_spare``): nothing to undo
            elif isinstance(action, Pause):
                self.paused = True
            elif isinstance(action, Resume):
                self._resume(action.failover)
            elif isinstance(action, Fail):
                self.failed = action.reason
                self.failed_holders = {op: self.holders(op) for op in self.topology.stateful}

    def _kill(self, op: str, pid: int) -> None:
        self.dead.add(pid)
        self.suspects.discard(pid)
        backup = self.backups.get(op)
        if backup is not None and backup.pid == pid:
            self.backups[op] = None
        spare = self.seeded_spares.get(op)
        if spare is not None and spare.pid == pid:
            del self.seeded_spares[op]

    def _inform(self, op: str, pid: int) -> None:
        """The runtime's ``_inform``: the frontend's watermarks, as notices (kind "inform":
        not a durable state the oracle could observe)."""
        for upstream in self.topology.prev_stateful(op):
            self.net.append(Msg(pid, 0, "inform", upstream,
                                self.router.commit.durable[upstream]))

    def _resume(self, plan: Failover) -> None:
        for o, backup in self.backups.items():
            if backup is not None and o not in plan.bounds:
                backup.applier.discard_beyond(plan.bounds)
        self.router.apply(plan)
        for o, seq in plan.bounds.items():
            self.router.commit.durable.reset(o, seq)
        self.paused = False

    def holders(self, op: str) -> set[int]:
        """Live processes holding ``op``'s state: its primary, and its backup once seeded;
        while no state of ``op`` past the initial one is durable, every loaded member of it
        (all hold the initial state, a point it may resume from)."""
        found = {self.primaries[op].pid}
        for backup in (self.backups[op], self.seeded_spares.get(op)):
            if backup is not None:
                found.add(backup.pid)
        if op in self.pristine:
            found |= {int(m) for m in self.plan.roles(op) if m is not None} & self.loaded
        return found - self.dead

    # ---- the processes' side: the plan's round trips, one at a time ---------------------
    def hear(self, pid: int) -> None:
        """A message from a suspect: it is alive after all (the runtime's ``_on_message``)."""
        if pid in self.suspects and pid not in self.dead:
            self.suspects.discard(pid)
            self.perform(self.plan.heard(str(pid)))

    def suspect(self, op: str, pid: int) -> None:
        """``pid`` is silent past the timeout, its process alive. If the plan fences it, a
        member that is not suspected must hold its state still."""
        held = pid in self.holders(op)
        self.perform(self.plan.suspected(str(pid), "timeout"))
        if held and pid in self.dead and self.failed is None:
            assert self.holders(op) - self.suspects, \
                f"{pid} fenced on a timeout alone while the last holder of {op}'s state"
        if held and self.failed is not None:
            self.failed_holders[op].add(pid)  # alive: failing the graph for it is the bug

    def answer(self, index: int) -> None:
        event = self.pending.pop(index)
        kind = event[0]
        if kind != "started":
            self.hear(int(event[-1] if kind in ("ready", "allowed") else event[2]))
        if kind == "started":
            pid = self._pid()
            self.perform(self.plan.started(event[1], str(pid)))
            self.pending.append(("ready", str(pid)))
        elif int(event[-1] if kind in ("ready", "allowed") else event[2]) in self.dead:
            return  # a dead process answers nothing
        elif kind == "ready":
            self.loaded.add(int(event[1]))
            self.perform(self.plan.ready(event[1]))
        elif kind == "allowed":
            self.perform(self.plan.allowed(event[1]))
        elif kind == "base":
            self._base(event[1], int(event[2]), int(event[3]))
        elif kind == "promote":
            self._seed_spare(event[1], int(event[2]), event[3])
        else:
            self._take_over(event[1], int(event[2]), event[3], event[4])

    def _base(self, op: str, pid: int, primary_pid: int) -> None:
        """H6: the primary sends its retained copy; the backup applies it and says so."""
        primary = self.primaries[op]
        if primary.pid != primary_pid or primary_pid in self.dead:
            return  # that primary is gone: the plan attaches the backup again
        applied = primary.shipper.retained_seq
        pfm = self.topology.prev_stateful(op)
        early = self.early.pop(pid, {})
        seed = {m: max(self.known_durable(m), early.get(m, 0)) for m in pfm}
        self.attached[primary_pid] = pid
        self.backups[op] = Backup(pid, primary.copies[applied],
                                  BackupApplier(op, pfm, applied, seed))
        self._announce(op)
        self._ship(op, primary.shipper.lost_backup())
        self.perform(self.plan.seeded_at(str(pid)))

    def _holder(self, op: str, pid: int) -> Backup:
        backup = self.backups[op]
        if backup is not None and backup.pid == pid:
            self.backups[op] = None
            return backup
        spare = self.seeded_spares.pop(op)
        assert spare.pid == pid
        return spare

    def _pristine_taker(self, op: str, member: str) -> None:
        """A member promoted without a copy (the operator ran nothing yet) takes over
        with the state it loaded: the initial one."""
        pid = int(member)
        held = [b for b in (self.backups[op], self.seeded_spares.get(op)) if b is not None]
        if any(b.pid == pid for b in held):
            return
        assert op in self.pristine and pid in self.loaded, f"{pid} holds no {op} state"
        pfm = self.topology.prev_stateful(op)
        early = self.early.pop(pid, {})
        seed = {m: max(self.known_durable(m), early.get(m, 0)) for m in pfm}
        taker = Backup(pid, Snapshot(0, ()), BackupApplier(op, pfm, 0, seed))
        if self.backups[op] is None:
            self.backups[op] = taker
        else:
            assert op not in self.seeded_spares
            self.seeded_spares[op] = taker

    def _seed_spare(self, op: str, pid: int, spare: str | None) -> None:
        """PROMOTE with a spare to attach: the member sends it the state it takes over
        with, the spare applies it (and tells the frontend), then the member answers."""
        seeded = None
        if spare is not None and int(spare) not in self.dead:
            taker = self.backups[op] if self.backups[op] is not None and \
                self.backups[op].pid == pid else self.seeded_spares.get(op)  # type: ignore
            assert taker is not None and taker.pid == pid
            seq = taker.applier.applied_seq
            pfm = self.topology.prev_stateful(op)
            # what the runtime's ``_seed_spare`` sends: the frontend's watermarks of now
            seed = {m: self.router.commit.durable[m] for m in pfm}
            self.seeded_spares[op] = Backup(int(spare), taker.snap,
                                            BackupApplier(op, pfm, seq, seed))
            self.perform(self.plan.seeded_at(spare))
            seeded = spare
        self.pending.append(("take", op, str(pid), False, seeded))

    def _take_over(self, op: str, pid: int, in_place: bool, seeded: str | None) -> None:
        if in_place:  # Fig. 6: the primary rolls back to the copy it retains
            old = self.primaries[op]
            seq = old.shipper.retained_seq
            snap = old.copies[seq]
        else:  # the backup becomes the primary at the state it last applied
            taker = self._holder(op, pid)
            seq, snap = taker.applier.applied_seq, taker.snap
        self.primaries[op] = Primary(pid, snap, PrimaryShipper(op, seq, self.window),
                                     {seq: snap})
        if not in_place:  # a new primary: attached to the spare it seeded, or to none yet
            self.attached.pop(pid, None)
        spare = self.seeded_spares.get(op)
        if seeded is not None and spare is not None and spare.pid == int(seeded):
            self.backups[op] = self.seeded_spares.pop(op)  # attached to the new primary
            self.attached[pid] = int(seeded)
            self._announce(op)
        self.perform(self.plan.took_over(str(pid), seq, seeded))

    # ---- the sim, held by the plan's pause and its fences -------------------------------
    def _send_state(self, op: str, order: CopyOrder) -> None:
        """A primary sends its states to the backup it attached (its base went there), as
        the worker's state thread does: never to one the plan has only named so far."""
        primary = self.primaries[op]
        record = StateRecord(op, order.seq, order.lineages, primary.copies[order.seq])
        self.net.append(Msg(self.attached.get(primary.pid, -1), primary.pid, "state", op,
                            order.seq, record))

    def _backup_pid(self, op: str) -> int:
        """The backup the frontend relays notices to: the plan's, attached yet or not."""
        backup = self.plan.roles(op)[1] if hasattr(self, "plan") else None
        return int(backup) if backup is not None else super()._backup_pid(op)

    def deliver(self, index: int) -> None:
        """The frontend relays each durability notice to the next operators' backups of
        the moment (the runtime's ``_on_durable``), as well as the sender's direct one."""
        msg = self.net[index]
        if msg.to == 0:
            self.hear(msg.frm)
        alive = msg.frm in self._alive()
        super().deliver(index)
        for op in sorted(self.pristine):  # the runtime's ``_on_durable``: past 0, the plan
            seq = self.router.commit.durable[op]  # hears of it
            if seq > 0:
                self.pristine.discard(op)
                self.plan.durable(op, seq)
        if msg.to == 0 and msg.kind == "notify" and alive:
            for nfm in self.topology.next_stateful(msg.op):
                backup = self.plan.roles(nfm)[1] if nfm != FRONTEND else None
                if backup is not None:
                    self.net.append(Msg(int(backup), 0, "notify", msg.op, msg.seq, msg.record))

    def _at_backup(self, msg: Msg) -> None:
        """A backup not yet seeded keeps the notices it hears for the base to come (the
        worker's ``seed``): earlier notices will not be sent again."""
        installed = {b.pid for b in self.backups.values() if b is not None}
        if msg.kind in ("notify", "inform") and msg.to not in installed:
            known = self.early.setdefault(msg.to, {})
            known[msg.op] = max(known.get(msg.op, 0), msg.seq)
            return
        super()._at_backup(msg)

    def _alive(self) -> set[int]:
        return super()._alive() - self.dead

    def runnable(self) -> list[str]:
        if self.paused or self.failed is not None:
            return []
        return [op for op in super().runnable()  # nothing is sent to a suspect
                if op not in self.primaries or self.primaries[op].pid not in
                self.dead | self.suspects]

    def copying(self) -> list[str]:
        return [op for op in super().copying() if self.primaries[op].pid not in self.dead]

    def members(self) -> list[tuple[str, int]]:
        """Every live member the plan knows of, whatever its role or step."""
        found = []
        for op in sorted(self.topology.stateful):
            primary, backup, spare = self.plan.roles(op)
            for member in (primary, backup, spare, self.plan.taker(op)):
                if member is not None and int(member) not in self.dead:
                    found.append((op, int(member)))
        return sorted(set(found))

    def lose(self, op: str, pid: int) -> None:
        self.suspects.discard(pid)
        self.perform(self.plan.lost(str(pid), "killed"))

    def settle(self, limit: int = 100_000) -> None:
        """No more losses: answer every round trip and run the graph until nothing is left."""
        for _ in range(limit):
            if self.pending:
                self.answer(0)
                continue
            choices = self.step_choices()
            if not choices:
                return
            self.do(choices[0])
        raise AssertionError("the graph did not quiesce")


class RecoveryMachine(RuleBasedStateMachine):
    sim: PlanSim
    losses: int

    @initialize(graph=st.sampled_from([ADJACENT, CHAIN, THREE]), seed=st.integers(0, 2**16),
                settled=st.booleans())
    def start(self, graph: Topology, seed: int, settled: bool) -> None:
        """Half the runs start whole (every backup attached and seeded); the rest start
        as a server does, every member loaded and the first copies not yet asked for or
        sent, so that losses strike before any backup holds a copy."""
        self.sim = PlanSim(graph, random.Random(seed))
        self.losses = self.suspicions = 0
        if settled:
            self.sim.settle()

    @precondition(lambda self: len(self.sim.submitted) < CLIENTS)
    @rule()
    def submit(self) -> None:
        self.sim.submit()

    @rule(pick=st.integers(0, 2**16))
    def step(self, pick: int) -> None:
        choices = self.sim.step_choices()
        if choices:
            self.sim.do(choices[pick % len(choices)])

    @rule(pick=st.integers(0, 2**16))
    def answer(self, pick: int) -> None:
        if self.sim.pending:
            self.sim.answer(pick % len(self.sim.pending))

    @precondition(lambda self: self.losses < MAX_LOSSES)
    @rule(pick=st.integers(0, 2**16))
    def lose(self, pick: int) -> None:
        members = self.sim.members()
        if members:
            self.losses += 1
            self.sim.lose(*members[pick % len(members)])

    @precondition(lambda self: self.losses < MAX_LOSSES)
    @rule(pick=st.integers(0, 2**16))
    def lose_while_taking_over(self, pick: int) -> None:
        """The step that matters most: a loss while a member is taking over (the taker, or
        the primary it demotes, or any member of the next operator)."""
        takers = [(op, int(t)) for op in sorted(self.sim.topology.stateful)
                  if (t := self.sim.plan.taker(op)) is not None and int(t) not in self.sim.dead]
        if takers:
            self.losses += 1
            members = [*takers, *self.sim.members()]
            self.sim.lose(*members[pick % len(members)])

    @precondition(lambda self: self.losses + 2 <= MAX_LOSSES)
    @rule(pick=st.integers(0, 2**16))
    def lose_backup_then_primary(self, pick: int) -> None:
        """CI's case: an operator's backup, then its primary before the member that
        replaced the backup holds a copy. Recoverable only while nothing past the initial
        state is durable (any loaded member then holds a point to resume from)."""
        ops = sorted(self.sim.topology.stateful)
        op = ops[pick % len(ops)]
        primary, backup, _ = self.sim.plan.roles(op)
        if primary is None or backup is None:
            return
        self.losses += 2
        self.sim.lose(op, int(backup))
        if int(primary) not in self.sim.dead and self.sim.failed is None:
            self.sim.lose(op, int(primary))

    @precondition(lambda self: self.suspicions < MAX_SUSPICIONS)
    @rule(pick=st.integers(0, 2**16), taking_over=st.booleans())
    def suspect(self, pick: int, taking_over: bool) -> None:
        """A live member is silent past the heartbeat timeout (a starved machine), most
        often the step that broke under load: a member taking over."""
        takers = [(op, int(t)) for op in sorted(self.sim.topology.stateful)
                  if (t := self.sim.plan.taker(op)) is not None and int(t) not in self.sim.dead]
        members = (takers if taking_over else []) or self.sim.members()
        if members and self.sim.failed is None:
            self.suspicions += 1
            self.sim.suspect(*members[pick % len(members)])

    @rule(pick=st.integers(0, 2**16))
    def hear(self, pick: int) -> None:
        suspects = sorted(self.sim.suspects)
        if suspects:
            self.sim.hear(suspects[pick % len(suspects)])

    @invariant()
    def fails_only_with_no_holder(self) -> None:
        sim = getattr(self, "sim", None)
        if sim is not None and sim.failed is not None:
            assert any(not held for held in sim.failed_holders.values()), \
                f"failed while every operator had a live holder: {sim.failed}"

    def teardown(self) -> None:
        sim = getattr(self, "sim", None)
        if sim is None:
            return
        for pid in sorted(sim.suspects):  # every stall ends: each suspect speaks again
            sim.hear(pid)
        sim.settle()  # first with no new request: a client waits for its reply before it
        if sim.failed is None:  # sends more, so no reply may need later traffic to leave
            held = [c for c in sim.submitted if c not in sim.replies]
            assert not held, f"clients {held} unanswered with nothing more to come"
        while len(sim.submitted) < CLIENTS and sim.failed is None:
            sim.submit()
        sim.settle()
        if sim.failed is not None:  # the runtime fails every waiting client: one answer
            assert not sim.conflicts, sim.conflicts
            assert all(len(r) == 1 for r in sim.replies.values())
            return
        assert sim.problems() == []
        for op in sim.topology.stateful:  # whole again: a seeded backup and a loaded spare
            primary, backup, spare = sim.plan.roles(op)
            assert primary is not None and backup is not None and spare is not None
            assert sim.plan.seeded(backup)


RecoveryMachine.TestCase.settings = settings(
    max_examples=400, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestRecoveryPlan = RecoveryMachine.TestCase


def test_a_promoted_primary_lost_before_its_backup_is_seeded_fails_with_the_reason() -> None:
    plan = RecoveryPlan({"s": ("p", "b", "x")}, lambda resumed, epoch: Failover(
        epoch, ("s",), dict(resumed), ("s",), (), False))
    for m in ("p", "b", "x"):
        plan.ready(m)
    plan.allowed("b")
    plan.seeded_at("b")
    assert plan.lost("p", "exit")[-1] == Promote("s", "b", "x")
    resumed = plan.took_over("b", 7)  # it could not seed the spare (no ``seeded``)
    assert any(isinstance(a, Resume) for a in resumed)
    assert Allow("s", "x", "b") in resumed  # the spare is the new backup
    fail = plan.lost("b", "exit")[-1]
    assert isinstance(fail, Fail) and "no member holds s's state" in fail.reason
    assert "x was still receiving its first full state" in fail.reason


def _started() -> RecoveryPlan:
    """One operator as a server starts it: p, b and x loaded, b not yet attached, and no
    batch sent yet (pristine: all three hold the initial state)."""
    plan = RecoveryPlan({"s": ("p", "b", "x")}, lambda resumed, epoch: Failover(
        epoch, ("s",), dict(resumed), ("s",), (), False))
    for m in ("p", "b", "x"):
        plan.ready(m)
    return plan


def test_a_primary_lost_at_start_before_its_backup_holds_a_copy_is_taken_over() -> None:
    """CI's failure: the primary was killed after it loaded but before its backup applied
    the first copy; the graph failed for good ('still receiving its first full state') and
    answered 503 to a server that had served nothing. The state is the initial one, which
    the backup loaded too: it takes over, and the spare becomes the backup."""
    plan = _started()
    assert plan.allowed("b") == [Attach("s", "p", "b")]  # the base is on its way
    actions = plan.lost("p", "exit")
    assert actions[-1] == Promote("s", "b", "x") and plan.failed is None
    resumed = plan.took_over("b", 0, seeded="x")
    assert isinstance(resumed[0], Resume) and plan.roles("s") == ("b", "x", None)
    assert resumed[1:] == [Start("s"), Inform("s", "x")]


def test_a_pristine_operator_whose_backup_is_still_loading_promotes_its_spare() -> None:
    """Its backup was lost at start and the one started for it still loads, then the
    primary goes: the loaded spare holds the initial state and takes over."""
    plan = _started()
    assert Start("s") in plan.lost("b", "exit")  # x is the backup, n1 its spare
    plan.started("s", "n1")
    assert Start("s") in plan.lost("x", "exit")  # n1, still loading, is the backup
    plan.started("s", "n2")  # and n2 the spare, which loads first
    plan.ready("n2")
    assert plan.roles("s") == ("p", "n1", "n2")
    assert plan.lost("p", "exit")[-1] == Promote("s", "n2", None)
    resumed = plan.took_over("n2", 0)
    assert plan.failed is None and plan.roles("s")[0] == "n2"
    assert Start("s") in resumed  # a spare again
    plan.ready("n1")  # the backup, once loaded, is attached to the new primary
    assert plan.allowed("n1") == [Attach("s", "n2", "n1")]


def test_once_a_state_is_durable_an_unseeded_backup_holds_nothing() -> None:
    """Pristine ends once a state past the initial one is durable (its replies may have
    left): then a primary lost before a new backup applied a copy is a real loss of state,
    and the graph fails with the reason. Batches in flight alone do not end it: a request
    that came in as the primary died at start re-runs, as after any failover (CI's second
    failure: the primary was sent one before its loss was seen)."""
    plan = _started()
    plan.allowed("b")
    assert plan.lost("p", "exit")[-1] == Promote("s", "b", "x")  # batches or not
    plan = _started()
    plan.allowed("b")
    plan.durable("s", 0)  # the base (the initial state) applied: still pristine
    plan.durable("s", 4)
    fail = plan.lost("p", "exit")[-1]
    assert isinstance(fail, Fail) and "b was still receiving its first full state" in fail.reason


def test_a_lost_spare_during_a_promotion_is_replaced_and_the_promotion_goes_on() -> None:
    plan = RecoveryPlan({"s": ("p", "b", "x")}, lambda resumed, epoch: Failover(
        epoch, ("s",), dict(resumed), ("s",), (), False))
    for m in ("p", "b", "x"):
        plan.ready(m)
    plan.allowed("b")
    plan.seeded_at("b")
    plan.lost("p", "exit")
    # nothing started mid-plan; b, seeding x, stops waiting for it (no 2 s pause)
    assert plan.lost("x", "exit") == [Fence("s", "x", "exit"), Unseed("s", "b")]
    after = plan.took_over("b", 3)
    assert [a for a in after if isinstance(a, Start)] == [Start("s"), Start("s")]
    assert plan.failed is None and plan.roles("s") == ("b", None, None)


def _two(plan_bounds: dict[str, int]) -> RecoveryPlan:
    """seq1 -> seq2, whose planner lists seq2 as built on seq1's discarded speculation."""
    def planner(resumed: Mapping[str, int], epoch: int) -> Failover:
        return Failover(epoch, ("a",), {**plan_bounds, **resumed}, (), (), False)
    plan = RecoveryPlan({"a": ("pa", "ba", "xa"), "b": ("pb", "bb", "xb")}, planner)
    for m in ("pa", "ba", "xa", "pb", "bb", "xb"):
        plan.ready(m)
    for b in ("ba", "bb"):
        plan.allowed(b)
        plan.seeded_at(b)
    plan.durable("a", 1)  # states past the initial ones are durable: only copies
    plan.durable("b", 1)  # hold them
    return plan


def test_a_demoted_operators_backup_lost_mid_promotion_rolls_its_primary_back() -> None:
    plan = _two({"b": 0})
    plan.lost("pa", "exit")
    assert plan.took_over("ba", 5)[-1] == Promote("b", "bb", "xb")  # b ran on a's
    # speculation
    assert plan.lost("bb", "exit")[-1] == RollBack("b", "pb")  # Fig. 6 after all
    resumed = plan.took_over("pb", 4)
    done = next(a for a in resumed if isinstance(a, Resume))
    assert done.failover.bounds == {"a": 5, "b": 4}
    assert done.failover.roll_back_in_place == ("b",) and done.failover.promote == ("a",)


def test_a_second_primary_lost_mid_recovery_folds_into_the_same_plan() -> None:
    plan = _two({})
    assert plan.lost("pa", "exit") == [Fence("a", "pa", "exit"), Pause(),
                                       Promote("a", "ba", "xa")]
    assert plan.lost("pb", "exit") == [Fence("b", "pb", "exit"), Promote("b", "bb", "xb")]
    assert plan.took_over("ba", 3) == []  # b is still taking over
    done = next(a for a in plan.took_over("bb", 2) if isinstance(a, Resume))
    assert done.failover.bounds == {"a": 3, "b": 2} and done.failover.failed == ("a", "b")


def test_the_spare_a_promoted_member_seeded_takes_over_when_that_member_is_lost() -> None:
    """Case 1: the promoted primary lost right after it took over. The spare it sent its
    state to before answering holds that state, and is promoted in turn."""
    plan = RecoveryPlan({"s": ("p", "b", "x")}, lambda resumed, epoch: Failover(
        epoch, ("s",), dict(resumed), ("s",), (), False))
    for m in ("p", "b", "x"):
        plan.ready(m)
    plan.allowed("b")
    plan.seeded_at("b")
    plan.lost("p", "exit")
    plan.seeded_at("x")  # the spare applied b's state: b may die now, the state lives
    assert plan.lost("b", "exit") == [Fence("s", "b", "exit"), Promote("s", "x")]
    resumed = plan.took_over("x", 7)
    assert any(isinstance(a, Resume) for a in resumed) and plan.failed is None
    plan2 = RecoveryPlan({"s": ("p", "b", "x")}, lambda resumed, epoch: Failover(
        epoch, ("s",), dict(resumed), ("s",), (), False))
    for m in ("p", "b", "x"):
        plan2.ready(m)
    plan2.allowed("b")
    plan2.seeded_at("b")
    plan2.lost("p", "exit")
    taken = plan2.took_over("b", 7, seeded="x")  # answered once the spare held its state
    assert Inform("s", "x") in taken  # after Resume: the upstream notices it missed
    assert plan2.roles("s") == ("b", "x", None) and plan2.seeded("x")
    assert isinstance(plan2.lost("b", "exit")[-1], Promote)  # the chain is survived


def test_heard_is_the_prefix_of_outcomes_here_and_a_rollback_renumbers_past_it() -> None:
    """What a backup may apply (case 3): only states whose outputs the frontend holds."""
    heard = Heard()
    assert not heard.add([2, 3]) and heard.upto == 0  # 1 is missing: nothing may apply
    assert heard.add([1]) and heard.upto == 3
    heard.add([5])
    heard.reset(2)  # rolled back to 2: 3 and 5 get numbered again
    assert heard.upto == 2 and not heard.add([4]) and heard.add([3]) and heard.upto == 4


def test_a_spare_seeded_by_a_promotion_hears_the_upstream_notices_it_missed() -> None:
    """The CI hang (test_hams_sequences: seq1's and seq2's primaries killed at once). B's
    backup is promoted and seeds the spare with the watermarks the frontend knows; then A's
    state for the request becomes durable and the frontend relays the notice to B's backup
    of the moment: none, mid-promotion. The spare becomes B's backup with A's watermark
    behind, so it never applies B's state for the request, whose reply waits for it, and no
    later notice comes (nothing else runs). ``Inform`` gives the new backup the
    watermarks it missed. Before it: 'client 1 got None'."""
    sim = PlanSim(ADJACENT, random.Random(0))
    sim.settle()
    sim.submit()
    sim.run_batch("A")  # A runs request 1; its output waits at B, its state is copied
    sim.finish_copy("A")
    primary_b = sim.primaries["B"].pid
    sim.lose("B", primary_b)
    sim.answer(_pending(sim, "promote"))  # the spare is seeded: A is durable at 0 so far
    backup_a = sim.backups["A"]
    assert backup_a is not None
    sim.deliver(_message(sim, "state", "A", backup_a.pid))  # A's backup applies request 1
    sim.deliver(_message(sim, "notify", "A", 0))  # and the frontend hears it; B is mid-
    assert sim.router.commit.durable["A"] == 1  # promotion: the relay reaches no backup
    taken = _pending(sim, "take")
    spare = int(sim.pending[taken][4])
    sim.answer(taken)
    assert sim.backups["B"] is not None and sim.backups["B"].pid == spare
    sim.settle()
    assert sim.problems() == []


def _pending(sim: PlanSim, kind: str) -> int:
    return next(i for i, event in enumerate(sim.pending) if event[0] == kind)


def _message(sim: PlanSim, kind: str, op: str, to: int) -> int:
    return next(i for i, m in enumerate(sim.net) if (m.kind, m.op, m.to) == (kind, op, to))


def _one() -> RecoveryPlan:
    """One operator: primary p, backup b (seeded), spare x (loaded)."""
    plan = _started()
    plan.allowed("b")
    plan.seeded_at("b")
    plan.durable("s", 1)  # a state past the initial one is durable: only copies hold it
    return plan


def test_a_promoted_backup_silent_while_taking_over_is_kept_and_the_recovery_goes_on() -> None:
    """Issue 39's outage under load: the primary was declared lost by timeout, its backup
    was starved past the timeout while taking over, and the graph gave up for good (the
    spare holds nothing yet). Silent is not dead: the last holder is kept and waited for."""
    plan = _one()
    assert plan.suspected("p", "timeout") == [Fence("s", "p", "timeout"), Pause(),
                                              Promote("s", "b", "x")]  # b holds the state
    assert plan.suspected("b", "timeout") == [Suspect("s", "b", "timeout")]
    assert plan.failed is None and plan.taker("s") == "b" and plan.suspects() == {
        "b": "timeout"}
    assert plan.heard("b") == [] and plan.suspects() == {}
    resumed = plan.took_over("b", 7)
    assert any(isinstance(a, Resume) for a in resumed) and plan.failed is None


def test_a_suspect_kept_as_the_last_holder_fails_the_graph_once_it_is_gone_for_sure() -> None:
    plan = _one()
    plan.suspected("p", "timeout")
    assert plan.suspected("b", "timeout") == [Suspect("s", "b", "timeout")]
    fail = plan.lost("b", "exit")[-1]
    assert isinstance(fail, Fail) and "b was lost (exit) while taking over" in fail.reason


def test_a_silent_primary_with_a_seeded_backup_still_fails_over() -> None:
    """Issue 39's rule: a stalled primary past the heartbeat timeout is replaced."""
    plan = _one()
    assert plan.suspected("p", "timeout")[-1] == Promote("s", "b", "x")


def test_a_silent_primary_whose_backup_holds_nothing_is_kept_and_goes_on() -> None:
    """Kept while it is the only holder (a spare holds nothing: fenced on a timeout like
    any member that holds no state); heard again, it goes on as the primary."""
    plan = RecoveryPlan({"s": ("p", "b", "x")}, lambda resumed, epoch: Failover(
        epoch, ("s",), dict(resumed), ("s",), (), False))
    for m in ("p", "b", "x"):
        plan.ready(m)
    plan.allowed("b")
    plan.durable("s", 1)  # (before, the backup would hold what recovery needs too)
    assert plan.suspected("p", "timeout") == [Suspect("s", "p", "timeout")]
    assert plan.suspected("x", "timeout") == [Fence("s", "x", "timeout"), Start("s")]
    assert plan.heard("p") == [] and plan.suspects() == {}
    assert plan.failed is None and plan.roles("s")[0] == "p"


def test_of_two_kept_suspects_the_one_still_silent_goes_once_the_other_speaks() -> None:
    """The primary, kept (its backup held nothing), sends its backup the base, and the
    backup is then silent too: kept as well, neither has a fellow holder that speaks. Once
    the backup speaks, the primary still silent is replaced (a stalled primary fails
    over); once the primary speaks instead, the silent backup goes."""
    def kept_both() -> RecoveryPlan:
        plan = RecoveryPlan({"s": ("p", "b", "x")}, lambda resumed, epoch: Failover(
            epoch, ("s",), dict(resumed), ("s",), (), False))
        for m in ("p", "b", "x"):
            plan.ready(m)
        plan.allowed("b")
        plan.durable("s", 1)
        assert plan.suspected("p", "timeout") == [Suspect("s", "p", "timeout")]
        assert plan.seeded_at("b") == []  # (p's base: p is alive, heard soon)
        assert plan.suspected("b", "timeout") == [Suspect("s", "b", "timeout")]
        return plan
    plan = kept_both()
    assert plan.heard("b") == [Fence("s", "p", "timeout"), Pause(), Promote("s", "b", "x")]
    plan = kept_both()
    assert plan.heard("p")[0] == Fence("s", "b", "timeout")
    assert plan.roles("s")[0] == "p" and plan.suspects() == {} and plan.failed is None


def test_a_suspect_whose_fellow_holder_was_suspected_first_is_kept_then_heard() -> None:
    """Both members silent: the backup first (the primary still holds: fenced), then the
    primary, now the last holder: kept, and it goes on once it speaks."""
    plan = _one()
    assert plan.suspected("b", "timeout")[0] == Fence("s", "b", "timeout")
    assert plan.suspected("p", "timeout") == [Suspect("s", "p", "timeout")]
    assert plan.heard("p") == [] and plan.failed is None and plan.roles("s")[0] == "p"


def test_after_states_are_durable_a_backup_then_its_primary_lost_fails_the_graph() -> None:
    """The sim end to end: requests answered (states past the initial one durable), then
    seq1's backup and its primary lost before the spare that replaced the backup holds a
    copy. The initial state is no point to resume from any more (replies built on later
    ones left): the graph fails, naming the backup, and never promotes it."""
    sim = PlanSim(CHAIN, random.Random(1))
    sim.settle()
    for _ in range(3):
        sim.submit()
    sim.settle()
    op = sorted(sim.topology.stateful)[0]
    assert sim.router.commit.durable[op] > 0 and op not in sim.pristine
    primary, backup, spare = sim.plan.roles(op)
    assert primary is not None and backup is not None and spare is not None
    sim.lose(op, int(backup))
    sim.lose(op, int(primary))  # (the sim asserts no unseeded member is promoted)
    assert sim.failed is not None and f"{spare} was still receiving" in sim.failed
