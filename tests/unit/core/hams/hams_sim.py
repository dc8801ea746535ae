"""A pure, step-by-step model of a HAMS graph for property tests: the real core pieces
(``GraphRouter``, ``PrimaryShipper``, ``BackupApplier``, ``plan_failover``) wired by a
message network whose deliveries, batches, copies and crashes a test chooses one at a time.

Operators compute on integers with injected non-determinism (a random term in every output
and every state update), so a re-execution really differs from the first run and the
consistency oracle has something to catch. A batch is atomic (compute then update); the
copy of the state it leaves is a separate step that must finish before the next batch
(the update gate).

Every message is addressed to one incarnation of a process; a replaced or promoted process
has a new incarnation, so stale messages die in the network, as a fenced RPC would.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from parityserve.core.hams import (
    FRONTEND,
    BackupApplier,
    CopyOrder,
    Executed,
    GraphRouter,
    Held,
    PrimaryShipper,
    StateRecord,
    Topology,
    plan_failover,
)

Consumed = tuple[int, tuple[tuple[str, int], ...], int, int]  # seq, sources, input, noise


@dataclass
class Snapshot:
    state: int
    history: tuple[Consumed, ...]  # every request folded into this state, in seq order


@dataclass
class Primary:
    pid: int
    snap: Snapshot
    shipper: PrimaryShipper
    copies: dict[int, Snapshot]  # the copy the backup applied (H5) and the one in flight
    copying: Snapshot | None = None


@dataclass
class Backup:
    pid: int
    snap: Snapshot
    applier: BackupApplier[Snapshot]


@dataclass
class Msg:
    to: int  # incarnation (0: the frontend)
    frm: int
    kind: str
    op: str
    seq: int = 0
    record: StateRecord[Snapshot] | None = None


@dataclass
class Sim:
    topology: Topology
    rng: random.Random
    batch_limit: int = 2
    window: int = 1  # states in flight per primary (PrimaryShipper)
    router: GraphRouter[int] = field(init=False)
    primaries: dict[str, Primary] = field(default_factory=dict)
    backups: dict[str, Backup | None] = field(default_factory=dict)
    net: deque[Msg] = field(default_factory=deque)
    replies: dict[int, list[int]] = field(default_factory=dict)
    seen: dict[tuple[str, int], int] = field(default_factory=dict)
    durable_history: dict[str, tuple[Consumed, ...]] = field(default_factory=dict)
    released: list[Held[int]] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    submitted: dict[int, int] = field(default_factory=dict)
    next_pid: int = 0
    epoch: int = 0

    def __post_init__(self) -> None:
        self.router = GraphRouter(self.topology, sum)
        for op in self.topology.stateful:
            self.primaries[op] = Primary(self._pid(), Snapshot(0, ()),
                                         PrimaryShipper(op, window=self.window),
                                         {0: Snapshot(0, ())})
            self.backups[op] = self._new_backup(op, Snapshot(0, ()), 0)

    def _pid(self) -> int:
        self.next_pid += 1
        return self.next_pid

    def _new_backup(self, op: str, snap: Snapshot, applied: int) -> Backup:
        pfm = self.topology.prev_stateful(op)
        # the manager asks the upstream backups how far they are (earlier notices are gone)
        seed = {m: self.known_durable(m) for m in pfm if m in self.backups}
        return Backup(self._pid(), snap, BackupApplier(op, pfm, applied, seed))

    # -- the actions a test may choose -------------------------------------------------
    def submit(self) -> None:
        client = len(self.submitted) + 1
        self.submitted[client] = value = self.rng.randint(1, 9)
        self.router.submit(client, value)

    def runnable(self) -> list[str]:
        return [op for op in self.topology.operators if self.router.managers[op].queued()
                and (op not in self.primaries or self.primaries[op].shipper.update_allowed)]

    def run_batch(self, op: str) -> None:
        batch = self.router.batch(op, self.batch_limit)
        if op not in self.primaries:
            for e in batch:
                self._answer(op, e.seq, e.arrival.payload + 1 + self.rng.randint(0, 2))
            return
        outputs = [self._stateful_step(self.primaries[op], e) for e in batch]
        self._finish_batch(op, batch)
        for e, out in zip(batch, outputs, strict=True):
            self._answer(op, e.seq, out)

    def _stateful_step(self, primary: Primary, e: Executed[int]) -> int:
        noise = self.rng.randint(0, 2)  # injected non-determinism (S1/S2 stand-in)
        out = 2 * e.arrival.payload + primary.snap.state + self.rng.randint(0, 2)
        consumed = (e.seq, e.arrival.sources, e.arrival.payload, noise)
        primary.snap = Snapshot(primary.snap.state + e.arrival.payload + noise,
                                (*primary.snap.history, consumed))
        return out

    def _finish_batch(self, op: str, batch: list[Executed[int]]) -> None:
        primary = self.primaries[op]
        order = primary.shipper.batch_finished(tuple(e.lineage for e in batch), batch[-1].seq)
        # the worker takes what a batch's end returns for a new copy (``Primary._number``):
        # an existing one here would be labelled with the live state (5e76004)
        assert order is None or not order.existing, order
        self._ship(op, order)

    def copying(self) -> list[str]:
        return [op for op, p in self.primaries.items() if p.copying is not None]

    def finish_copy(self, op: str) -> None:
        primary = self.primaries[op]
        assert primary.copying is not None
        seq = primary.copying.history[-1][0] if primary.copying.history else 0
        primary.copies[seq], primary.copying = primary.copying, None
        self._ship(op, primary.shipper.copy_finished(seq))

    def _ship(self, op: str, order: CopyOrder | None) -> None:
        """Follow a copy order: send a copy taken before, or take one now (the state is at
        rest between atomic batches)."""
        if order is None:
            return
        if order.existing:
            self._send_state(op, order)
        else:
            self.primaries[op].copying = self.primaries[op].snap

    def _send_state(self, op: str, order: CopyOrder) -> None:
        primary = self.primaries[op]
        record = StateRecord(op, order.seq, order.lineages, primary.copies[order.seq])
        self.net.append(Msg(self._backup_pid(op), primary.pid, "state", op, order.seq, record))

    def deliver(self, index: int) -> None:
        msg = self.net[index]
        del self.net[index]
        if msg.frm not in self._alive():
            return  # fenced: the sender was declared dead
        if msg.kind == "notify" and msg.to in self._alive():
            assert msg.record is not None  # a durability notice that someone acts on
            self._observe_durable(msg.op, msg.record.tensors)
        if msg.to == 0:
            self._released(self.router.notify(msg.op, msg.seq))
        elif msg.kind in ("received", "applied"):
            self._at_primary(msg)
        else:
            self._at_backup(msg)

    def _at_backup(self, msg: Msg) -> None:
        for op, backup in self.backups.items():
            if backup is None or backup.pid != msg.to:
                continue
            if msg.kind == "state":
                assert msg.record is not None
                self.net.append(Msg(self.primaries[op].pid, backup.pid, "received", op, msg.seq))
                self._applied(op, backup, backup.applier.receive(msg.record))
            else:
                self._applied(op, backup, backup.applier.notify(msg.op, msg.seq))

    def _applied(self, op: str, backup: Backup, states: list[StateRecord[Snapshot]],
                 ack: bool = True) -> None:
        for state in states:
            backup.snap = state.tensors
            if ack:
                self.net.append(Msg(self.primaries[op].pid, backup.pid, "applied", op,
                                    state.seq))
            for nfm in self.topology.next_stateful(op):
                target = 0 if nfm == FRONTEND else self._backup_pid(nfm)
                self.net.append(Msg(target, backup.pid, "notify", op, state.seq, state))
            if FRONTEND not in self.topology.next_stateful(op):
                self.net.append(Msg(0, backup.pid, "notify", op, state.seq, state))

    def _backup_pid(self, op: str) -> int:
        backup = self.backups[op]
        return -1 if backup is None else backup.pid

    def _at_primary(self, msg: Msg) -> None:
        for op, primary in self.primaries.items():
            if primary.pid != msg.to:
                continue
            if msg.kind == "received":
                self._ship(op, primary.shipper.received(msg.seq))
            else:
                primary.shipper.applied(msg.seq)
                for old in [s for s in primary.copies if s < primary.shipper.retained_seq]:
                    del primary.copies[old]

    def _answer(self, op: str, seq: int, value: int) -> None:
        self._released(self.router.output(op, seq, value))

    def _released(self, replies: list[Held[int]]) -> None:
        for held in replies:
            self.replies.setdefault(held.client, []).append(held.reply)
            self.released.append(held)
            self.router.collect(held.client)

    # -- crashes ---------------------------------------------------------------------------
    def crash_backup(self, op: str) -> None:
        """The backup dies; what is sent to it is lost until a new one starts."""
        self.backups[op] = None

    def restart_backup(self, op: str) -> None:
        """H6: a new backup seeded with the copy the primary retains, then caught up by the
        ordinary state flow (the shipper re-sends every lineage not yet applied)."""
        primary = self.primaries[op]
        applied = primary.shipper.retained_seq
        self.backups[op] = self._new_backup(op, primary.copies[applied], applied)
        self._announce(op)
        self._ship(op, primary.shipper.lost_backup())

    def _announce(self, op: str) -> None:
        """A backup that starts from a seed announces it durable (H6): notices of it from a
        process now gone may have been fenced in the network."""
        backup = self.backups[op]
        assert backup is not None
        seed = StateRecord(op, backup.applier.applied_seq, (), backup.snap)
        self._applied(op, backup, [seed], ack=False)

    def crash_primary(self, op: str) -> None:
        """Kill ``op``'s primary, then run the recovery the manager would run."""
        dead = [o for o, b in self.backups.items() if b is None]
        applied = {o: self._applied_seq(o) for o in self.topology.stateful}
        executed = {o: self.router.executed(o) for o in self.topology.operators}
        executed[FRONTEND] = self.router.held()
        self.epoch += 1
        plan = plan_failover(self.topology, [op], applied, executed, self.epoch, dead)
        for o in plan.promote:
            self._promote(o, applied[o])
        for o in plan.roll_back_in_place:
            self._roll_back_in_place(o, applied[o])
        for o, backup in self.backups.items():
            if backup is not None and o not in plan.bounds:
                backup.applier.discard_beyond(plan.bounds)
        self.router.apply(plan)

    def _applied_seq(self, op: str) -> int:
        backup = self.backups[op]
        return self.known_durable(op) if backup is None else backup.applier.applied_seq

    def known_durable(self, op: str) -> int:
        """The newest state of ``op`` anyone was told is durable, or that its primary knows
        was applied (the manager asks the frontend, the downstream backups and the primary).
        Notices from a dead backup still in the network are fenced, so this is complete."""
        heard = [b.applier.durable.snapshot().get(op, 0) for b in self.backups.values() if b]
        return max(self.router.commit.durable[op], self.primaries[op].shipper.retained_seq,
                   *heard)

    def backup_ready(self, op: str) -> bool:
        """A rebuilt backup counts only once it caught up with what was announced durable:
        before that, losing the primary is losing both (outside HAMS's failure model)."""
        backup = self.backups[op]
        return backup is not None and backup.applier.applied_seq >= self.known_durable(op)

    def _alive(self) -> set[int]:
        pids = {0} | {p.pid for p in self.primaries.values()}
        return pids | {b.pid for b in self.backups.values() if b is not None}

    def _promote(self, op: str, applied: int) -> None:
        backup = self.backups[op]
        assert backup is not None
        snap = backup.snap
        # the backup process itself becomes the primary: its messages stay valid
        self.primaries[op] = Primary(backup.pid, snap, PrimaryShipper(op, applied, self.window),
                                     {applied: snap})
        # the demoted primary (alive) or a fresh process becomes the backup, full state
        self.backups[op] = self._new_backup(op, snap, applied)
        self._announce(op)

    def _roll_back_in_place(self, op: str, applied: int) -> None:
        old = self.primaries[op]
        snap = old.copies[applied]
        self.primaries[op] = Primary(self._pid(), snap, PrimaryShipper(op, applied, self.window),
                                     {applied: snap})

    # -- the oracle --------------------------------------------------------------------
    def _observe_durable(self, op: str, snap: Snapshot) -> None:
        """A state announced durable may only extend the durable history before it, never
        rewrite it, and every output it consumed keeps the value other durable states saw."""
        before = self.durable_history.get(op, ())
        longer, shorter = (snap.history, before) if len(snap.history) >= len(before) \
            else (before, snap.history)
        if longer[:len(shorter)] != shorter:
            self.conflicts.append(f"{op}: durable history rewritten")
        self.durable_history[op] = longer
        for _, sources, value, _ in snap.history:
            for source in sources:
                if self.seen.setdefault(source, value) != value:
                    self.conflicts.append(f"{source} seen as {self.seen[source]} and {value}")

    def step_choices(self) -> list[tuple[str, str | int]]:
        return ([("run", op) for op in self.runnable()]
                + [("copy", op) for op in self.copying()]
                + [("deliver", i) for i in range(len(self.net))])

    def drain(self, limit: int = 100_000) -> None:
        """Run to quiescence with no more crashes: restart dead backups, then deliver, copy
        and run until nothing is left to do."""
        for op, backup in self.backups.items():
            if backup is None:
                self.restart_backup(op)
        for _ in range(limit):
            choices = self.step_choices()
            if not choices:
                return
            self.do(choices[0])
        raise AssertionError("the graph did not quiesce")

    def do(self, choice: tuple[str, str | int]) -> None:
        kind, arg = choice
        if kind == "run":
            self.run_batch(str(arg))
        elif kind == "copy":
            self.finish_copy(str(arg))
        else:
            self.deliver(int(arg))

    def problems(self) -> list[str]:
        """After ``drain``: everything the protocol promises, checked from the outside."""
        found = list(self.conflicts)
        for client in self.submitted:
            if len(self.replies.get(client, [])) != 1:
                found.append(f"client {client} got {self.replies.get(client)}")
        for op in sorted(self.topology.stateful):
            found += self._state_problems(op)
        found += self._reply_problems()
        return found

    def _state_problems(self, op: str) -> list[str]:
        primary, backup = self.primaries[op], self.backups[op]
        assert backup is not None
        history = primary.snap.history
        found = []
        if backup.snap != primary.snap:
            found.append(f"{op}: backup {backup.snap.state} != primary {primary.snap.state}")
        if [c[0] for c in history] != list(range(1, len(history) + 1)):
            found.append(f"{op}: sequence numbers not contiguous")
        if primary.snap.state != sum(value + noise for _, _, value, noise in history):
            found.append(f"{op}: state is not the replay of its durable history")
        sources = [c[1] for c in history]
        if len(set(sources)) != len(sources) or len(sources) != len(self.submitted):
            found.append(f"{op}: {len(sources)} requests in state for {len(self.submitted)}")
        return found

    def _reply_problems(self) -> list[str]:
        """A released reply of a stateful exit is the output of its durable execution."""
        exit_op = self.topology.exits[0]
        if exit_op not in self.topology.stateful:
            return []
        history = self.primaries[exit_op].snap.history
        found = []
        for held in self.released:
            seq = next(h.seq for h in held.lineage if h.op == exit_op)
            if seq > len(history):
                found.append(f"client {held.client}: reply from {exit_op}'s lost seq {seq}")
                continue
            _, sources, value, _ = history[seq - 1]
            before = sum(v + n for _, _, v, n in history[:seq - 1])
            hops = tuple((h.pred, h.pred_seq) for h in held.lineage if h.op == exit_op)
            if hops != sources or not 0 <= held.reply - 2 * value - before <= 2:
                found.append(f"client {held.client}: reply not from the durable execution")
        return found
