"""A stateful graph operator's process: the primary, or its hot backup (HAMS NSPB, §III-B).

**Primary.** The frontend sends numbered batches. For each: compute (reads the state), send
the outputs at once (``hams``: they do not depend on the update), wait until the previous
state's copy is taken (H2), update (writes the state). A run-form operator does all three in
``run`` and waits on the same gate, so its outputs leave after its update (one path for
both forms: ``models._stateful_run.drive``). The state manager thread then copies the state
into a flat buffer while the next batch computes, and sends it to the backup directly,
never through the frontend. At most one undelivered state is in flight; batches
that finish meanwhile are folded into the next copy (``core.hams.PrimaryShipper``). An
operator that declares what each batch wrote (the stream operators' ``changed_rows``) ships
only the rows changed since the previous copy, with the full state on seeding and every
``full_state_every`` batches (``core.hams.DeltaLedger``); the backup applies them in order.

**Backup.** Buffers the primary's states and applies one only when every upstream state it
depends on is durable (Alg. 2, ``core.hams.BackupApplier``); then tells the primary
(``applied``: the primary may free older copies, H5) and the frontend (``durable``: replies
may leave, and the frontend tells the next stateful operators' backups).

**Modes.** ``remus`` stops instead: copy after the update, send, wait for the backup's
receipt, and only then release the outputs. ``bare`` keeps no backup at all.

Threads: the main thread owns the frontend socket and the model; the state thread owns the
socket to the backup. ``_mutex`` makes "update + number the batch" and "copy the state"
exclusive, so a copy never sees half an update and always matches the sequence number the
shipper gives it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import logging
import os
import queue
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import zmq
from zmq.auth.thread import ThreadAuthenticator

from parityserve.core.hams import (
    BackupApplier,
    CopyOrder,
    Lineage,
    PrimaryShipper,
    RowBisection,
    StateRecord,
)
from parityserve.core.hams.deltas import DeltaLedger, Shipment
from parityserve.errors import ModelLoadError, ProtocolError
from parityserve.models._stateful_base import OperatorBatch
from parityserve.models._stateful_run import CopyGate, drive
from parityserve.runtime.graphs import hams_messages as hm
from parityserve.runtime.graphs import hams_protocol as hp
from parityserve.runtime.graphs.hams_protocol import OperatorSpec, checkpoint_file, refusal
from parityserve.runtime.graphs.hams_stall import StallWatch
from parityserve.runtime.graphs.hams_state import FlatDelta, FlatState
from parityserve.runtime.workers import wire
from parityserve.runtime.workers.keys import ClientKeys
from parityserve.runtime.workers.niceness import take_niceness
from parityserve.runtime.workers.worker import keys_from_env

__all__ = ["main", "restore_checkpoint", "save_checkpoint", "serve"]

log = logging.getLogger(__name__)

STALL_REPORT_BEATS = 3  # intervals quiet before the member says why (the default timeout is 4)


class _Operator:
    """The model and its live state, shared by both roles."""

    def __init__(self, spec: OperatorSpec) -> None:
        from parityserve.models.stateful import load_stateful

        self.spec = spec
        self.model = load_stateful(spec.source, spec.options)
        self.state = self.model.initialize()

    def batch(self, order: hm.Batch) -> OperatorBatch:
        return OperatorBatch.from_numpy(order.inputs, order.streams, order.labels, order.at)


class _Process:
    """Sockets and the heartbeat, common to both roles."""

    def __init__(self, spec: OperatorSpec, connect: str, keys: ClientKeys | None) -> None:
        self.spec, self.keys = spec, keys
        self.ctx: zmq.Context[Any] = zmq.Context.instance()
        self.front = self.ctx.socket(zmq.DEALER)
        self.front.setsockopt(zmq.IDENTITY, spec.worker_id.encode())
        self.front.setsockopt(zmq.LINGER, 200)
        if keys is not None:
            self.front.curve_serverkey = keys.server_public
            self.front.curve_publickey, self.front.curve_secretkey = keys.public, keys.secret
        self.front.connect(connect)
        self.last_beat = 0.0
        self.running = True

    def tell(self, message: hm.Report) -> None:
        self.front.send_multipart(wire.encode(*message.to_wire()), copy=False)
        # the frontend counts any message as a sign of life: a member that just spoke
        # needs no heartbeat (each message costs both sides ~0.1 ms of CPU on the 2-core
        # VM, and a busy primary or backup sent 20 beats a second beside its batches)
        self.last_beat = time.monotonic()

    def receive(self) -> hm.Order | None:
        """The frontend's next order; one that does not parse is logged and dropped (a
        batch whose rows cannot be read is refused, row by row)."""
        frames = self.front.recv_multipart(copy=False)
        try:
            header, buffers = wire.decode(frames)
            return hm.parse_order(header, buffers)
        except hm.BadBatch as exc:
            self.tell(hm.Out(exc.bid, refused=tuple(
                hp.Refusal(*refusal(row, exc)) for row in range(exc.rows))))
        except ProtocolError as exc:
            log.warning("%s: dropping a malformed message from the frontend: %s",
                        self.spec.worker_id, exc)
        return None

    def beat_if_due(self) -> None:
        """A beat when nothing was sent for a heartbeat interval (``tell`` resets it)."""
        if time.monotonic() - self.last_beat >= self.spec.heartbeat_s:
            self.tell(hm.Beat())


class Primary:
    """Runs batches; ships states to the backup through the state thread."""

    def __init__(self, proc: _Process, operator: _Operator, start_seq: int = 0) -> None:
        self.proc, self.operator = proc, operator
        self.mode = proc.spec.mode
        self.mutex = threading.Lock()
        self.copied = threading.Event()
        self.copied.set()
        self.shipper = PrimaryShipper(proc.spec.op, start_seq, _window(self.mode))
        self.ledger = DeltaLedger(_table_rows(operator.state), proc.spec.full_state_every,
                                  start_seq)  # full state or delta, per copy
        # the retained copy (H5), always full, and those in flight since (full or deltas)
        self.copies: dict[int, FlatState | FlatDelta] = {start_seq: FlatState.capture(
            start_seq, operator.state)}
        self.received_upto = start_seq
        self.receipt = threading.Lock()  # guards received_upto
        self.applied_upto = threading.Event()  # a backup applied a state (the seeding wait)
        self.seeding = False  # seed() waits: an APPLIED wakes it through the receipt pipe
        self.slow_s = 0.0  # injected delay before each state leaves (the Fig. 6 case), or
        # checkpoint-replay: between storing each checkpoint and announcing it
        self.batches = 0
        self.last_seq = start_seq  # the request the live state is after
        self.orders: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self.deferred: deque[hm.Order] = deque()  # Remus, waiting
        self.pipe_out, pipe_in = _pipe(proc.ctx)
        # Remus waits for the backup's receipt and for control messages at once
        self.receipt_out, self.receipt_in = _pipe(proc.ctx)
        self.receipt_poller = zmq.Poller()
        self.receipt_poller.register(proc.front, zmq.POLLIN)
        self.receipt_poller.register(self.receipt_in, zmq.POLLIN)
        self.thread = threading.Thread(target=_StateThread(self, pipe_in).run, daemon=True,
                                       name="state-manager")
        if self.mode != "bare":
            self.thread.start()

    def handle(self, order: hm.Order) -> None:
        if isinstance(order, hm.Batch):
            self.run_batch(order)
        elif isinstance(order, hm.Attach):
            self._to_state_thread("attach", (order.address, order.key.encode()))
        elif isinstance(order, hm.Rollback):
            self.roll_back()
        elif isinstance(order, hm.Slow):
            self.slow_s = order.s
        elif isinstance(order, hm.DigestAsk):  # updates run on this thread too: none is
            self.proc.tell(_digest(self.last_seq, self.operator.state, {  # half done now
                "full": self.ledger.fulls, "deltas": self.ledger.deltas}))

    def run_batch(self, message: hm.Batch) -> None:
        """One batch, either operator form (``drive``): the write waits for the previous
        state's copy (H2), and "write + number the batch" holds the mutex (the gate takes it
        when it opens), so a copy never sees half of it. A batch the operator refuses before
        writing is searched for its bad rows (``RowBisection``): the other rows run, in their
        order, each part numbered as a batch of its own; only the bad rows are refused."""
        bid = message.bid
        try:
            batch = self.operator.batch(message)
        except Exception as exc:  # frames that make no batch: every row is refused
            self.proc.tell(hm.Out(bid, refused=tuple(
                hp.Refusal(*refusal(row, exc)) for row in range(len(message.seqs)))))
            return
        early = functools.partial(self._send_outputs, bid) if self.mode == "hams" else None
        plan: RowBisection[Exception] = RowBisection(len(batch))
        answered: list[Any] = []
        while (part := plan.next_part()) is not None:
            whole = len(part) == len(batch)  # NSPB: outputs leave early when the form allows
            try:
                answered.append(self._run_part(message, batch if whole else batch.rows(part),
                                               part, early if whole else None))
            except _NothingWritten as refused:
                plan.failed(part, refused.error, _culprits(refused.error, part))
            else:
                plan.passed(part)
        self._after_batch(message, plan, answered, sent=plan.runs == 1 and early is not None
                          and bool(plan.ok))

    def _run_part(self, message: hm.Batch, batch: OperatorBatch, part: tuple[int, ...],
                  early: Callable[[Any], None] | None) -> Any:
        left: list[Any] = []  # outputs that left early: then they must stand
        written: list[Any] = []  # the update's pending value: it may say what it wrote
        with CopyGate(self.copied, lock=self.mutex, while_waiting=self._beat_quietly,
                      every_s=self.proc.spec.heartbeat_s / 2) as gate:  # beats while held
            try:
                outputs = drive(self.operator.model, batch, self.operator.state, gate,
                                _noting(early, left) if early is not None else None,
                                written.append)
            except Exception as exc:
                if gate.opened or left:  # half written, or outputs out that the state lacks:
                    raise  # die; the backup holds the last whole state, replies wait for it
                raise _NothingWritten(exc) from exc  # a bad row, not a dead operator
            order = self._number(message, part, written)
        if order is not None:
            self._to_state_thread("order", order)
        return outputs

    def _after_batch(self, message: hm.Batch, plan: RowBisection[Exception],
                     answered: list[Any], sent: bool) -> None:
        """Outputs (unless they left early), then, under checkpoint-replay, the checkpoint."""
        bid = message.bid
        if plan.ok and self.mode == "remus":
            self._await_receipt(self.last_seq)
        if not sent:
            self._send_outputs(bid, _joined(answered), rows=plan.ok if plan.errors else None,
                               refused=[hp.Refusal(*refusal(r, e))
                                        for r, e in sorted(plan.errors.items())])
        if plan.ok and self.mode == "checkpoint-replay":  # after the outputs, on the same
            self._maybe_checkpoint(message.seqs[-1])  # socket: when the frontend hears of
            # a checkpoint, it has every output the checkpoint covers, and may drop their
            # batches. The state is after the whole batch: its refused rows wrote nothing.

    def _number(self, message: hm.Batch, part: tuple[int, ...], written: list[Any]
                ) -> CopyOrder | None:
        """After the write, under the mutex: give the shipper the part's rows, and the
        ledger what the write changed."""
        seq = message.seqs[part[-1]]
        self.last_seq = seq
        if self.mode in ("checkpoint-replay", "bare"):
            return None
        self.ledger.wrote(*_declared(written))
        # the whole batch's frontier (its rows' highest numbers): for a part, a bound that
        # may wait for more than the part needs, never for less
        lineages = (message.needs,)
        order = self.shipper.batch_finished(lineages, seq)
        if order is not None:
            self.copied.clear()
        return order

    def _maybe_checkpoint(self, seq: int) -> None:
        """Checkpoint-replay (Lineage Stash's way, the baseline): every N batches the whole
        state goes to storage, atomically, and the frontend may drop its log up to it."""
        self.batches += 1
        if self.batches % self.proc.spec.checkpoint_every:
            return
        save_checkpoint(self.proc.spec.checkpoint_path, FlatState.capture(seq,
                                                                          self.operator.state))
        if self.slow_s:  # injected: stored, not yet announced (what a kill here leaves);
            self._sleep_beating(self.slow_s)  # a delay, not a hang: heartbeats go on
        self.proc.tell(hm.Checkpointed(seq))  # the frontend deletes older ones

    def _beat_quietly(self) -> None:
        """A beat while the copy gate holds a batch; a socket error here (the frontend
        gone, a shutdown) must not read as the batch's rows being bad."""
        with contextlib.suppress(zmq.ZMQError):
            self.proc.beat_if_due()

    def _sleep_beating(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, self.proc.spec.heartbeat_s / 2))
            self.proc.beat_if_due()

    def _await_receipt(self, seq: int) -> None:
        """Remus: hold the outputs until the backup has the state they belong to. Control
        messages are still heard meanwhile (a new backup must be able to attach, or this
        would wait forever); batches wait their turn in ``deferred``."""
        while self.proc.running:
            with self.receipt:
                if self.received_upto >= seq:
                    return
            # half an interval: a beat is due at most that late (the data path suspects a
            # primary holding a batch after two intervals of silence)
            ready = dict(self.receipt_poller.poll(
                int(self.proc.spec.heartbeat_s * 500) + 1))
            with contextlib.suppress(zmq.Again):  # drain every wake-up
                while self.receipt_in in ready:
                    self.receipt_in.recv(zmq.NOBLOCK)
            if self.proc.front in ready:
                order = self.proc.receive()
                if isinstance(order, hm.Batch | hm.Stop):
                    self.deferred.append(order)
                elif order is not None:
                    self.handle(order)
            self.proc.beat_if_due()

    def _send_outputs(self, bid: int, outputs: Any, rows: list[int] | None = None,
                      refused: list[hp.Refusal] | None = None) -> None:
        array = None if outputs is None else outputs.detach().numpy() \
            if hasattr(outputs, "detach") else np.asarray(outputs)
        self.proc.tell(hm.Out(bid, array, None if rows is None else tuple(rows),
                              tuple(refused or ())))

    def seed(self, address: str, key: str, limit_s: float = hp.SEED_LIMIT_S) -> bool:
        """Attach a backup and wait (heartbeats going on) until it applied the base, or
        until the frontend says that spare is lost (``Unseed``: waiting out the limit then
        held every reply of the graph for 2 s). Batches wait their turn in ``deferred``."""
        self.applied_upto.clear()
        self.seeding = True
        self._to_state_thread("attach", (address, key.encode()))
        deadline = time.monotonic() + limit_s
        try:
            while (left := deadline - time.monotonic()) > 0:
                if self.applied_upto.is_set():
                    return True
                wait_ms = int(1000 * min(left, self.proc.spec.heartbeat_s / 2)) + 1
                ready = dict(self.receipt_poller.poll(wait_ms))
                with contextlib.suppress(zmq.Again):  # drain every wake-up
                    while self.receipt_in in ready:
                        self.receipt_in.recv(zmq.NOBLOCK)
                if self.proc.front in ready and self._seeding_order(self.proc.receive()):
                    return self.applied_upto.is_set()
                self.proc.beat_if_due()
            return self.applied_upto.is_set()
        finally:
            self.seeding = False

    def _seeding_order(self, order: hm.Order | None) -> bool:
        """An order heard while seeding; True: stop waiting (the spare is lost)."""
        if isinstance(order, hm.Unseed):
            return True
        if isinstance(order, hm.Batch | hm.Stop):
            self.deferred.append(order)
        elif order is not None:
            self.handle(order)
        return False

    def roll_back(self) -> None:
        """Fig. 6: this primary's backup died and a failover lists this operator. Roll back to
        the copy the dead backup last applied (the promoted point, H5)."""
        with self.mutex:
            seq = self.shipper.retained_seq
            self.copies[seq].install(self.operator.state)
            self.shipper = PrimaryShipper(self.proc.spec.op, seq, _window(self.mode))
            self.ledger.restart(seq)
            self.copies = {seq: self.copies[seq]}
            self.last_seq = seq
        self.proc.tell(hm.Promoted(seq))

    def _to_state_thread(self, kind: str, value: Any) -> None:
        self.orders.put((kind, value))
        self.pipe_out.send(b"")


class _StateThread:
    """The primary's state manager: takes copies, sends them, hears receipts and applies."""

    def __init__(self, primary: Primary, pipe: zmq.Socket[bytes]) -> None:
        self.p, self.pipe = primary, pipe
        self.backup: zmq.Socket[bytes] | None = None
        self.poller = zmq.Poller()
        self.poller.register(pipe, zmq.POLLIN)

    def run(self) -> None:
        while self.p.proc.running:
            for sock, _ in self.poller.poll(100):
                if sock is self.pipe:
                    sock.recv()
                    self._drain_orders()
                elif self.backup is not None and sock is self.backup:
                    self._hear(sock.recv_multipart(copy=False))

    def _drain_orders(self) -> None:
        with contextlib.suppress(queue.Empty):
            while True:
                kind, value = self.p.orders.get_nowait()
                if kind == "order":
                    self._copy(value)
                else:
                    self._attach(*value)

    def _copy(self, order: CopyOrder) -> None:
        """Copy the state now: it is at rest (the update waits on ``copied``), and so is
        the ledger (only an update writes to it)."""
        with self.p.mutex:
            shipment = self.p.ledger.take(order.seq)
        flat = _capture(shipment, self.p.operator.state)
        with self.p.mutex:
            self.p.copies[order.seq] = flat
            follow = self._settle(self.p.shipper.copy_finished(order.seq))
            self.p.copied.set()
        self._send_order(follow)

    def _settle(self, order: CopyOrder | None) -> CopyOrder | None:
        """Under the mutex (no update can run, the state is at rest): take each new copy
        the shipper asks for, in the same hold as the order, so that no batch numbered
        after the order slips into a copy labelled with it. Returns the copy to send."""
        while order is not None and not order.existing:
            shipment = self.p.ledger.take(order.seq)
            self.p.copies[order.seq] = _capture(shipment, self.p.operator.state)
            order = self.p.shipper.copy_finished(order.seq)
        return order

    def _send_order(self, order: CopyOrder | None) -> None:
        if order is not None:
            self._send(self.p.copies[order.seq], order.lineages)

    def _send(self, flat: FlatState | FlatDelta, lineages: tuple[Lineage, ...],
              base: bool = False) -> None:
        if self.backup is None:
            return  # no backup yet: it is sent again when one attaches (lost_backup)
        if self.p.slow_s:
            time.sleep(self.p.slow_s)
        frames: list[Any] = [flat.frame()] if isinstance(flat, FlatState) else flat.frames()
        header, frames = hm.State(flat.seq, list(flat.layout), lineages, tuple(frames), base,
                                  flat.base if isinstance(flat, FlatDelta) else None).to_wire()
        with contextlib.suppress(zmq.Again):  # a base is copied: the retained copy it is
            self.backup.send_multipart(wire.encode(header, frames), copy=base,  # takes
                                       flags=zmq.NOBLOCK)  # deltas in place later

    def _attach(self, address: str, key: bytes) -> None:
        """A (new) backup: send it the retained copy as its base, then everything after."""
        if self.backup is not None:
            self.poller.unregister(self.backup)
            self.backup.close(linger=0)
        self.backup = _dealer(self.p.proc, address, key)
        self.poller.register(self.backup, zmq.POLLIN)
        with self.p.mutex:
            base = self.p.copies[self.p.shipper.retained_seq]
            order = self._settle(self.p.shipper.lost_backup())
        assert isinstance(base, FlatState)  # the retained copy is kept full (_fold)
        self._send(base, (), base=True)
        self._send_order(order)

    def _hear(self, frames: list[Any]) -> None:
        receipt = _state_link(frames, "its backup")
        if not isinstance(receipt, hm.Received | hm.Applied):
            return
        if isinstance(receipt, hm.Applied):
            self.p.applied_upto.set()
            if self.p.seeding:
                with contextlib.suppress(zmq.Again):
                    self.p.receipt_out.send(b"", zmq.NOBLOCK)
            with self.p.mutex:
                self.p.shipper.applied(receipt.seq)
                self.p.copies = _fold(self.p.copies, self.p.shipper.retained_seq)
        # a state applied at once was received too: the backup says so only once
        self._received(receipt.seq, receipt.gap)

    def _received(self, seq: int, gap: bool) -> None:
        with self.p.mutex:
            if gap:  # it could not place a delta: it needs a full state
                self.p.ledger.need_full()
            order = self._settle(self.p.shipper.received(seq))
        with self.p.receipt:
            self.p.received_upto = max(self.p.received_upto, seq)
        if self.p.mode == "remus":
            with contextlib.suppress(zmq.Again):  # one pending wake-up is enough
                self.p.receipt_out.send(b"", zmq.NOBLOCK)
        self._send_order(order)


class Backup:
    """Buffers states, applies them by Alg. 2, and reports what is durable."""

    def __init__(self, proc: _Process, operator: _Operator) -> None:
        self.proc, self.operator = proc, operator
        self.applier: BackupApplier[FlatState | FlatDelta] = BackupApplier(
            proc.spec.op, self._watched())
        self.seed: dict[str, int] = {}
        self.public, secret = zmq.curve_keypair()
        self.allowed: set[bytes] = set()
        self.link = proc.ctx.socket(zmq.ROUTER)
        self.link.setsockopt(zmq.LINGER, 0)
        self.auth: ThreadAuthenticator | None = None
        self.primary_id: bytes | None = None
        if proc.spec.ipc_dir:
            # Same host as the primary: a Unix socket in the graph's 0700 folder. The kernel
            # lets only this user connect, and the state is not encrypted: CURVE on every
            # state byte cost 5-6 ms per batch of the online MLP's 1.4 MB (measured).
            self.address = f"ipc://{proc.spec.ipc_dir}/{os.getpid()}.sock"
            self.link.bind(self.address)
            return
        if proc.keys is not None:  # across hosts: CURVE, and only the primary's key
            self.auth = ThreadAuthenticator(proc.ctx)
            self.auth.start()
            self.auth.configure_curve_callback("*", credentials_provider=self)
            self.link.curve_secretkey, self.link.curve_publickey = secret, self.public
            self.link.curve_server = True
        port = self.link.bind_to_random_port(f"tcp://{proc.spec.bind_host}")
        self.address = f"tcp://{proc.spec.bind_host}:{port}"

    def _watched(self) -> tuple[str, ...]:
        """Alg. 2's previous stateful operators, and this operator itself: a state is
        applied only once the frontend holds its requests' outputs too (``Heard``), so a
        primary lost between the two leaves no durable request unanswered."""
        return (*self.proc.spec.pfm, self.proc.spec.op)

    def callback(self, _domain: str, key: bytes) -> bool:  # the ZAP check for the primary
        return key in self.allowed

    def handle(self, order: hm.Order) -> None:
        if isinstance(order, hm.Allow):  # the primary's key, and how far upstream is durable
            self.allowed = {order.key.encode()}
            self.seed = dict(order.durable)
            for op, seq in self.seed.items():  # a base that came first (a promoted member
                self._apply(self.applier.notify(op, seq))  # seeding it) learns them now
            self.proc.tell(hm.Allowed())  # the frontend tells the primary to connect now
        elif isinstance(order, hm.DigestAsk):  # states are installed on this thread: whole
            self.proc.tell(_digest(self.applier.applied_seq, self.operator.state))
        elif isinstance(order, hm.Notify):
            op, seq = order.op, order.seq
            # kept for the applier the base state will start: a notice that comes between
            # ALLOW and the base must not be lost with the applier it reached
            self.seed[op] = max(self.seed.get(op, 0), seq)
            self._apply(self.applier.notify(op, seq))

    def hear(self, frames: list[Any]) -> None:
        self.primary_id = frames[0].bytes
        state = _state_link(frames[1:], "its primary")
        if not isinstance(state, hm.State):
            return
        seq, delta = state.seq, state.delta_of is not None
        if state.base and not delta:  # APPLIED says RECEIVED too
            FlatState.received(seq, state.layout, state.frames[0]).install(self.operator.state)
            self.applier = BackupApplier(self.proc.spec.op, self._watched(), seq, self.seed)
            self._reply(hm.Applied(seq))
            self.proc.tell(hm.Durable(seq))
            return
        record = StateRecord(self.proc.spec.op, seq, state.lineages, *_received(state))
        # a delta that does not fit (its base is not the newest state here) is dropped, and
        # the primary told: its next copy is the full state
        gap = delta and not self.applier.fits(record)
        ready = self.applier.receive(record)
        # Not applied at once: say it came now (one message fewer per state when it is).
        # The primary's next copy waits for this receipt once its window of states in
        # flight is full. Waiting for the APPLIED instead saves the message (~0.1 ms of
        # CPU on each side) but costs more: hams 1.19x bare against 0.99x with it, 64-row
        # requests at 3,000 rows/s, 4 interleaved repetitions (hams-profile/README.md in
        # benchmarks/results).
        if not ready or ready[-1].seq != seq:
            self._reply(hm.Received(seq, gap))
        self._apply(ready)

    def _apply(self, ready: list[StateRecord[FlatState | FlatDelta]]) -> None:
        for record in ready:
            record.tensors.install(self.operator.state)
            self._reply(hm.Applied(record.seq))
            self.proc.tell(hm.Durable(record.seq))

    def _reply(self, receipt: hm.Received | hm.Applied) -> None:
        if self.primary_id is not None:
            with contextlib.suppress(zmq.ZMQError):
                self.link.send_multipart([self.primary_id, *wire.encode(*receipt.to_wire())],
                                         flags=zmq.NOBLOCK)

    def promote(self, header: hm.Promote) -> Primary:
        """Become the primary at the state last applied; buffered states die with the old
        primary (they were never durable). With ``attach`` (the spare's address), send the
        spare that state first and answer once it is applied: from then on a second member
        holds it, and losing this one is not losing the state."""
        seq = self.applier.applied_seq
        self.link.close(linger=0)
        if self.auth is not None:
            self.auth.stop()
        primary = Primary(self.proc, self.operator, start_seq=seq)
        seeded = bool(header.attach) and primary.seed(str(header.attach), header.key)
        self.proc.tell(hm.Promoted(seq, seeded))
        return primary


def _window(mode: str) -> int:
    """States in flight to the backup at once (``PrimaryShipper``): two in hams, so that a
    batch's state does not wait for the receipt of the one before it; Remus holds each
    batch's outputs for its receipt anyway."""
    return 2 if mode == "hams" else 1


def _table_rows(state: Any) -> int:
    """The first dimension of the state's row tables (the largest): a declared delta of
    half of it or more goes as the full state."""
    return max((int(t.shape[0]) for t in state.values() if t.dim()), default=0)


def _declared(written: list[Any]) -> tuple[list[int] | None, tuple[str, ...]]:
    """What the update wrote, when its pending value declares it (``changed_rows``: the
    stream operators' ``SlotWrites``); rows ``None``: undeclared (the run form, or a
    pending value that says nothing), so the next copy is the full state."""
    declare = getattr(written[0], "changed_rows", None) if len(written) == 1 else None
    if not callable(declare):
        return None, ()
    rows, names = declare()
    return list(rows), tuple(names)


def _capture(shipment: Shipment, state: Any) -> FlatState | FlatDelta:
    if shipment.rows is None or shipment.base is None:
        return FlatState.capture(shipment.seq, state)
    return FlatDelta.capture(shipment.seq, shipment.base, state, shipment.rows,
                             shipment.tensors)


def _fold(copies: dict[int, FlatState | FlatDelta], keep: int
          ) -> dict[int, FlatState | FlatDelta]:
    """The backup applied the copy after ``keep``: the retained copy becomes that state, in
    full (each delta up to it folded in, in chain order), and older copies go."""
    full = copies[min(copies)]
    assert isinstance(full, FlatState)  # the retained copy is always full
    for seq in sorted(s for s in copies if full.seq < s <= keep):
        step = copies[seq]
        if isinstance(step, FlatDelta):
            step.apply_to(full)  # in place: the retained bytes left as a base were copied
        else:
            full = step
    return {full.seq: full, **{s: c for s, c in copies.items() if s > keep}}


def _received(state: hm.State) -> tuple[FlatState | FlatDelta, int | None]:
    """A state from the primary, full or a delta, and the delta's base (None: full)."""
    if state.delta_of is None:
        return FlatState.received(state.seq, state.layout, state.frames[0]), None
    delta = FlatDelta.received(state.seq, state.delta_of, state.layout, *state.frames)
    return delta, delta.base


def _state_link(frames: list[Any], peer: str) -> hm.StateLink | None:
    """One message on the primary-backup link; one that does not parse is logged, dropped."""
    try:
        return hm.parse_state_link(*wire.decode(frames))
    except ProtocolError as exc:
        log.warning("dropping a malformed message from %s: %s", peer, exc)
        return None


class _NothingWritten(Exception):
    """The operator raised before its write: the state is as it was."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _culprits(error: Exception, part: tuple[int, ...]) -> tuple[int, ...]:
    """The batch rows an error names (``rows``: indices into the part it was raised on, as
    ``StreamTableFull`` gives); none when it names none, or names rows the part lacks."""
    rows = getattr(error, "rows", None)
    if not isinstance(rows, tuple | list) or not all(
            isinstance(r, int) and 0 <= r < len(part) for r in rows):
        return ()
    return tuple(part[r] for r in rows)


def _noting(early: Callable[[Any], None], left: list[Any]) -> Callable[[Any], None]:
    def send(outputs: Any) -> None:
        left.append(outputs)
        early(outputs)
    return send


def _joined(answered: list[Any]) -> Any:
    """The outputs of the parts that ran, as one array in row order (None: none ran)."""
    if not answered:
        return None
    if len(answered) == 1:
        return answered[0]
    return np.concatenate([a.detach().numpy() if hasattr(a, "detach") else np.asarray(a)
                           for a in answered])


def _digest(seq: int, state: Any, shipped: dict[str, int] | None = None) -> hm.Digest:
    """The replay check's view of this process's state: its digest, and the request it is
    after."""
    from parityserve.models.stateful import state_digest

    return hm.Digest(seq, state_digest(state), shipped)


def save_checkpoint(path: str, flat: FlatState) -> None:
    """Write the state, then rename: a reader sees no checkpoint or the whole one."""
    meta = orjson.dumps({"seq": flat.seq, "layout": flat.layout})
    final = checkpoint_file(path, flat.seq)
    tmp = f"{final}.tmp"
    with open(tmp, "wb") as out:
        np.savez(out, meta=np.frombuffer(meta, dtype=np.uint8), buffer=flat.buffer)
    os.replace(tmp, final)


def restore_checkpoint(path: str, seq: int, state: Any) -> int:
    """Install checkpoint ``seq`` into ``state`` and return ``seq`` (0: start fresh)."""
    if seq == 0:
        return 0
    try:
        data = np.load(checkpoint_file(path, seq), allow_pickle=False)
    except OSError as exc:  # the only copy of the state: nothing else could stand in
        raise ModelLoadError(f"checkpoint {seq} cannot be read: {exc}") from exc
    with data:
        meta = orjson.loads(data["meta"].tobytes())
        flat = FlatState.received(int(meta["seq"]), meta["layout"], data["buffer"].copy())
    if flat.seq != seq:
        raise ModelLoadError(f"checkpoint file for {seq} holds the state after {flat.seq}")
    flat.install(state)
    return flat.seq


def _pipe(ctx: zmq.Context[Any]) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
    """A wake-up line from the main thread to the state thread."""
    name = f"inproc://state-{id(ctx)}-{time.monotonic_ns()}"
    inside = ctx.socket(zmq.PAIR)
    inside.bind(name)
    outside = ctx.socket(zmq.PAIR)
    outside.connect(name)
    return outside, inside


def _dealer(proc: _Process, address: str, key: bytes) -> zmq.Socket[bytes]:
    sock = proc.ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if proc.keys is not None and not address.startswith("ipc://"):
        sock.curve_serverkey = key
        sock.curve_publickey, sock.curve_secretkey = proc.keys.public, proc.keys.secret
    sock.connect(address)
    return sock


def serve(spec: OperatorSpec, connect: str, keys: ClientKeys | None) -> int:
    """Load, say hello, and serve until told to stop (or killed: the point of HAMS)."""
    import torch

    torch.set_num_threads(1)
    operator = _Operator(spec)
    proc = _Process(spec, connect, keys)
    restored = restore_checkpoint(spec.checkpoint_path, spec.restore_seq, operator.state) \
        if spec.role == "primary" and spec.checkpoint_path else 0
    # Everything loaded so far (torch, the model) lives as long as the process: keep it out
    # of the garbage collector's full passes. One over it took 70-80 ms of CPU here, and
    # under load over 200 ms of wall time without a heartbeat: a healthy primary was then
    # declared lost (once in 120 s of the stocks graph's load beside two CPU hogs).
    gc.freeze()
    role: Primary | Backup = Primary(proc, operator, restored) if spec.role == "primary" \
        else Backup(proc, operator)
    proc.tell(hm.Hello(spec.role, os.getpid(), restored,
                       role.address if isinstance(role, Backup) else None,
                       role.public.decode() if isinstance(role, Backup) else ""))
    # its own account of any silence the frontend might suspect it for (``hams_stall``)
    StallWatch(spec.worker_id, lambda: proc.last_beat, spec.heartbeat_s,
               STALL_REPORT_BEATS * spec.heartbeat_s).start()
    try:
        _loop(proc, role)
    finally:
        proc.running = False
    return 0


def _loop(proc: _Process, role: Primary | Backup) -> None:
    poller = zmq.Poller()
    poller.register(proc.front, zmq.POLLIN)
    if isinstance(role, Backup):
        poller.register(role.link, zmq.POLLIN)
    while proc.running:
        if isinstance(role, Primary) and role.deferred:
            waited = role.deferred.popleft()
            if isinstance(waited, hm.Stop):
                return
            role.handle(waited)
            continue
        for sock, _ in poller.poll(int(proc.spec.heartbeat_s * 1000)):
            if sock is proc.front:
                order = proc.receive()
                if isinstance(order, hm.Stop):
                    return
                if isinstance(order, hm.Promote) and isinstance(role, Backup):
                    poller.unregister(role.link)
                    role = role.promote(order)
                    continue
                if order is not None:
                    role.handle(order)
            elif isinstance(role, Backup):
                role.hear(sock.recv_multipart(copy=False))
        proc.beat_if_due()


def main(argv: list[str] | None = None, *, die_with_parent: bool = True) -> int:
    """Run an operator. ``die_with_parent`` False: forked by the zygote, whose death must not
    end this member; it dies with the frontend through its lifeline instead
    (``runtime/fleet/zygote_server.watch_lifeline``)."""
    parser = argparse.ArgumentParser(prog="parityserve-operator", description=__doc__)
    parser.add_argument("--connect", required=True, help="frontend address, tcp://HOST:PORT")
    parser.add_argument("--spec", required=True, help="OperatorSpec as JSON")
    args = parser.parse_args(argv)
    take_niceness()  # started by a Ray actor: its frontend's niceness, not Ray's 15
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if die_with_parent and sys.platform.startswith("linux"):  # no orphaned operators
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    spec = OperatorSpec.from_json(args.spec)
    keys = keys_from_env()
    try:
        return serve(spec, args.connect, keys)
    except ModelLoadError as exc:
        print(f"parityserve operator {spec.worker_id}: {exc}", file=sys.stderr, flush=True)
        sock = _Process(spec, args.connect, keys)
        sock.tell(hm.Failed(str(exc)))
        sock.front.close(linger=2000)
        # Send it before exiting (for at most the linger): without term() the exit raced
        # zmq's I/O thread, won by the slow teardown of a spawned interpreter and lost by a
        # forked member's os._exit (the graph then said "exited with 3", not the reason).
        sock.ctx.term()
        return 3


if __name__ == "__main__":
    sys.exit(main())
