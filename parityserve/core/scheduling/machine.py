"""One model's serving path as a sans-I/O state machine.

``Scheduler`` owns the deadline queue, the per-pool task queues (through its redundancy
mode), each replica's AIMD state and the coding groups. Its drivers feed it events and carry
out the actions it returns (``actions.py``):

* events in: ``submit`` a query; ``pump`` (a replica joined, became ready or idle);
  ``task_output`` / ``task_error`` for a batch's result; ``take_back`` a replica that left or
  failed; ``send_failed``; ``tick`` when a wake-up it asked for is due; ``expire_stale``;
  ``set_mode``; ``set_parallelism``; ``shutdown``;
* actions out: ``Send``, ``Answer``, ``Late``, ``Expire``, ``Fail``, ``Abort``, ``WakeAt``,
  ``Redundant``, ``Located``, ``CodingFailed``.

No asyncio, no sockets, no clock: every event carries ``now``. The asyncio runtime
(``runtime/modelpath/dispatch.py``) and the discrete-event simulator (``core/simulate.py``) drive
this same object, so a scheduling rule is written once. Single-queue load balancing (Clipper,
ParM): queries of a model wait in one queue ordered by deadline, and whichever replica is
idle pulls the next task or batch; batch sizes come from each replica's AIMD controller and
the delayed-batching rule in ``core/batching.py``; admission and the "drop what cannot finish
in time" rule from ``core/admission.py``.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from parityserve.core import admission
from parityserve.core.admission import Admission, ServiceEstimate
from parityserve.core.batching import decide_batch
from parityserve.core.deadline_queue import DeadlineQueue, Entry
from parityserve.core.redundancy import Decoded
from parityserve.core.scheduling.actions import (
    Abort,
    Action,
    Answer,
    Expire,
    Fail,
    Late,
    Located,
    Send,
    WakeAt,
)
from parityserve.core.scheduling.modes import Redundancy, make_mode
from parityserve.core.scheduling.pools import DATA_POOL
from parityserve.core.scheduling.records import (
    Failure,
    GroupRun,
    InflightBatch,
    Query,
    Replica,
    ReplicaState,
    Task,
    TaskKind,
)
from parityserve.core.scheduling.settings import Batching, ModeSettings, check_parallelism

__all__ = ["EXPIRED", "UNFINISHABLE", "Scheduler"]

EXPIRED = "deadline passed while queued"
UNFINISHABLE = "cannot finish before its deadline"

# The busy hold (``Scheduler.busy_hold_s``): at most this share of the model's SLO, and only
# while the smoothed gap between queries (the newest gap weighs this much) is shorter than
# the hold.
_BUSY_HOLD_SLO_SHARE = 0.1
_GAP_SMOOTHING = 0.125
Assemble = Callable[[list[Entry[Query]]], object]


@dataclass(eq=False, slots=True)
class _Timer:
    fn: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class Scheduler:
    """Queue, replicas, redundancy mode and in-flight batches of one model version."""

    def __init__(self, batching: Batching, mode: ModeSettings, *, slo_s: float,
                 max_queue: int, assemble: Assemble, parallelism: int | None = None) -> None:
        check_parallelism(parallelism, mode.mode)
        self.batching = batching
        self.slo_s = slo_s  # admission's horizon: the tightest SLO of the model's applications
        self.assemble = assemble  # queries' inputs -> one payload (stacked, or a list)
        self.queue: DeadlineQueue[Query] = DeadlineQueue(max_queue)
        self.service = ServiceEstimate()  # its replicas' pooled (core/admission.py)
        self.shed = 0  # queries refused at admission or not dispatched (too late to finish)
        self.replicas: dict[str, Replica] = {}
        self.inflight: dict[int, InflightBatch] = {}
        self.groups = 0  # coding groups formed
        self.decodes = 0  # groups decoded (rebuilt outputs delivered)
        self.now = 0.0
        self._bids = itertools.count(1)
        self._out: list[Action] = []
        self._timers: list[tuple[float, int, _Timer]] = []
        self._timer_seq = itertools.count()
        self._announced: float | None = None  # the wake-up the driver holds, if any
        self._batch_wake: _Timer | None = None
        self._batch_wake_at = 0.0
        self.mode: Redundancy = make_mode(self, mode)
        self._mode_name = mode.mode
        # Service parallelism c (issue 18): at most this many data replicas hold a batch at
        # once; the rest stay ready ("warm") but do not pull. None: every idle replica pulls.
        self.parallelism = parallelism
        # Whether the driver's event loop has no idle time now (runtime/modelpath/loop_pressure.py);
        # the simulator has no loop to saturate and leaves it False. See ``busy_hold_s``.
        self.saturated = False
        self._last_arrival: float | None = None
        self._arrival_gap_s = math.inf  # smoothed gap between queries; the first gap sets it

    # ---- events ----------------------------------------------------------------------------
    def submit(self, query: Query, deadline: float, now: float) -> list[Action]:
        """Queue one query (raises QueueFull at the queue's capacity, changing nothing) and
        hand work to idle replicas."""
        self.enqueue(query, deadline, now)
        return self.pump_at(now)

    def enqueue(self, query: Query, deadline: float, now: float) -> None:
        """Queue one query without dispatching: the driver pumps later (``pump_at``), so the
        queries that arrive together can leave as one batch. Raises QueueFull as ``submit``."""
        self.queue.try_put(query, deadline=deadline, enqueued_at=now)
        if self._last_arrival is not None:
            gap = now - self._last_arrival
            previous = self._arrival_gap_s
            self._arrival_gap_s = gap if previous == math.inf else (
                previous + _GAP_SMOOTHING * (gap - previous))
        self._last_arrival = now

    def admit(self, count: int, deadline: float, now: float) -> Admission:
        """May ``count`` more queries with ``deadline`` still be served? Counts a refusal."""
        serving = self.serving_replicas()
        decision = admission.admit(
            self.service, depth=len(self.queue), count=count, now=now,
            deadline=deadline, slo_s=self.slo_s, replicas=serving,
            max_batch_size=self.batching.max_batch_size, complete=self.all_measured(serving))
        if not decision.admitted:
            self.shed += count
        return decision

    def pump_at(self, now: float) -> list[Action]:
        """Hand work to idle replicas (after a replica joined, became ready or idle)."""
        self.now = now
        self.pump()
        return self._flush()

    def task_output(self, batch: InflightBatch, outputs: Any, now: float) -> list[Action]:
        """``batch``'s replica returned usable outputs, one per row of its payload."""
        self._finish(batch, now, computed=True)
        batch.task.via.on_output(batch, outputs)
        return self.pump_at(now)

    def task_error(self, batch: InflightBatch, error: str, now: float, *,
                   computed: bool = False, raised: bool = False,
                   bad_input: bool = False) -> list[Action]:
        """``batch`` failed (``computed``: the worker ran it, but its outputs are unusable;
        ``raised``: the model raised on it, so the batch is split to find the rows it raised
        on; ``bad_input``: the model blamed its input; see ``records.Failure``)."""
        self._finish(batch, now, computed=computed)
        batch.task.via.on_error(batch, Failure(error, raised, bad_input))
        return self.pump_at(now)

    def take_back(self, replica: Replica) -> int:
        """A replica failed or left: requeue the work it held; returns how many queries went
        back. Emits nothing by itself: the driver pumps once the replica is gone."""
        batch = replica.batch
        replica.batch = None
        if batch is None:
            return 0
        self.inflight.pop(batch.bid, None)
        batch.task.running -= 1
        return batch.task.via.take_back(batch.task)

    def send_failed(self, batch: InflightBatch, now: float) -> list[Action]:
        """The replica of a ``Send`` could not be reached: it is dead, its work goes back."""
        batch.replica.state = ReplicaState.DEAD  # the supervisor restarts the worker
        self.take_back(batch.replica)
        return self.pump_at(now)

    def tick(self, now: float) -> list[Action]:
        """The wake-up asked for is due: run every timer due by ``now``."""
        self.now = now
        self._announced = None  # the driver's wake-up has fired
        timers = self._timers
        while timers and timers[0][0] <= now:
            timer = heapq.heappop(timers)[2]
            if not timer.cancelled:
                timer.fn()
        return self._flush()

    def expire_stale(self, now: float) -> list[Action]:
        """Drop queued work whose deadline passed, even while no replica is pulling."""
        self.now = now
        self._expire(self.queue.drop_expired(now))
        return self._flush()

    def set_mode(self, settings: ModeSettings, now: float) -> list[Action]:
        """Serve new batches under another mode; groups in flight finish as they were.
        Tasks the old mode still had queued move over to the new one's queues."""
        self.now = now
        check_parallelism(self.parallelism, settings.mode)  # before anything changes
        old, self.mode = self.mode, make_mode(self, settings)
        self._mode_name = settings.mode
        for tasks in old.pending.values():
            for task in tasks:
                if task.pool in self.mode.pools:
                    self.mode.push(task)
                # else: a parity task whose pool is gone: its group decodes without it
        return self.pump_at(now)

    def set_parallelism(self, parallelism: int | None, now: float) -> list[Action]:
        """Let at most ``parallelism`` data replicas hold a batch at once (None: no limit).

        Nothing restarts and nothing running is taken back: lowering the limit lets running
        batches finish and only stops new pulls until fewer than the limit run; raising it
        pumps at once, so the returned actions hold the new ``Send``s. Which replicas pull is
        unchanged: the first idle ones in replica order. The limit counts data-pool replicas
        only (ParM's parity pools are its redundancy, not the model's service parallelism),
        and it is refused (ValueError, nothing changed) for a value below 1 and for modes
        that run a batch's copies or coded tasks side by side (``PARALLELISM_MODES``).
        """
        check_parallelism(parallelism, self._mode_name)
        self.parallelism = parallelism
        return self.pump_at(now)

    def shutdown(self) -> list[Action]:
        """Abort every queued and in-flight query (the server is going away)."""
        entries: list[Entry[Query]] = []
        for batch in self.inflight.values():
            entries += batch.entries
            if batch.task.group is not None:
                entries += batch.task.group.unanswered()
        for tasks in self.mode.pending.values():
            for task in tasks:
                entries += task.entries
        entries += self.queue.drop_expired(float("inf"))  # not a deadline: shutting down
        self._timers.clear()
        self._batch_wake = self._announced = None
        live = _unanswered(entries)
        if live:
            self._out.append(Abort(live, "shutdown"))
        return self._flush()

    # ---- state -----------------------------------------------------------------------------
    def serving_replicas(self) -> int:
        """Data replicas that may serve at once: ready ones, capped by the parallelism limit
        (admission sizes the queue by this, so warm replicas held back add no capacity)."""
        ready = sum(1 for r in self.replicas.values()
                    if r.state == ReplicaState.READY and r.pool == DATA_POOL)
        return ready if self.parallelism is None else min(ready, self.parallelism)

    def data_running(self) -> int:
        """Data replicas holding a batch now (what the parallelism limit counts)."""
        return sum(1 for r in self.replicas.values()
                   if r.pool == DATA_POOL and r.batch is not None)

    def queue_bound(self) -> int:
        serving = self.serving_replicas()
        return admission.queue_bound(self.service, self.slo_s, serving,
                                     self.batching.max_batch_size,
                                     complete=self.all_measured(serving))

    def all_measured(self, serving: int | None = None) -> bool:
        """Whether every serving replica has a service measurement (``core/admission.py``:
        until then a replica's rate is unknown, and the measured ones do not speak alone).
        ``serving``: ``serving_replicas()`` when the caller has it (admission runs per
        request)."""
        measured = sum(1 for r in self.replicas.values()
                       if r.pool == DATA_POOL and r.state == ReplicaState.READY
                       and r.service.measured)
        return measured >= (self.serving_replicas() if serving is None else serving)

    # ---- dispatch (also what modes call, see ``modes.Host``) ---------------------------------
    def pump(self) -> None:
        """Idle replicas pull: queued tasks (copies, parities, coded batches) first, then new
        batches from the deadline queue."""
        forming = True
        pending = self.mode.pending
        # Data pulls left under the parallelism limit (None: unlimited). Counted once per
        # pump: in the modes the limit allows, a pull sends only to the pulling replica.
        room = None if self.parallelism is None else self.parallelism - self.data_running()
        for replica in self.replicas.values():
            if not self.queue and not any(pending.values()):
                break  # nothing any replica could take: the rest would all skip
            if not replica.idle:
                continue
            data = replica.pool == DATA_POOL
            if data and room is not None and room <= 0:
                continue  # warm but held back; parity replicas further on may still pull
            task = self.mode.next_task(replica.pool, replica.rid)
            if task is not None:
                self.send(replica, task)
            elif data and forming and self.queue:
                forming = self._dispatch_to(replica)
            if data and room is not None and replica.batch is not None:
                room -= 1

    def _dispatch_to(self, replica: Replica) -> bool:
        now = self.now
        limit = replica.aimd.max_batch_size * self.mode.batches_per_dispatch
        wait = max(self.batching.max_delay_s, self.mode.form_wait_s, self.busy_hold_s())
        decision = decide_batch(len(self.queue), self.queue.oldest_enqueued_at(), now, limit,
                                wait)
        if not decision.dispatch:
            self._wake_for_batch(decision.wake_at)
            return False
        entries, expired = self.queue.pop_batch(now, decision.size)
        self._expire(expired)
        live = [e for e in self._drop_doomed(entries, now) if not e.item.answered]
        if live:
            self.mode.dispatch(replica, live)
        elif self.queue:  # all it popped expired (some perhaps requeued for a later sharer)
            return self._dispatch_to(replica)
        return True

    def busy_hold_s(self) -> float:
        """How long a partial batch may wait for more queries now: ``busy_delay_s`` while the
        driver's loop is saturated and queries arrive faster than that, else 0.

        Why: every batch costs a worker round trip (messages, wake-ups, the worker's own
        per-batch work) on the cores the frontend needs. A saturated frontend has requests
        waiting to be read anyway (in sockets, or in grpc's queue, which hands the loop one
        RPC per pass so that no two gRPC queries ever share a pass), so holding a batch back
        for them costs little latency and saves round trips; an idle one answers a lone query
        at once. A model that is rarely asked does not wait on a busy frontend, and the hold
        never exceeds a tenth of the model's SLO.
        """
        hold = self.batching.busy_delay_s
        if not hold or not self.saturated:
            return 0.0
        hold = min(hold, self.slo_s * _BUSY_HOLD_SLO_SHARE)
        return hold if self._arrival_gap_s < hold else 0.0

    def _drop_doomed(self, entries: list[Entry[Query]], now: float) -> list[Entry[Query]]:
        """Answer at once the queries one batch can no longer finish in time (see
        core/admission.py): computing them would only be thrown away."""
        if not self.service.measured:
            return entries
        keep: list[Entry[Query]] = []
        doomed: list[Entry[Query]] = []
        for entry in entries:
            fits = admission.can_finish(self.service, now, entry.deadline)
            (keep if fits else doomed).append(entry)
        if not keep and not self.queue:
            return entries  # nothing else waits: a probe, which refreshes the estimate
        if doomed:
            self.shed += len(doomed)
            self._expire(doomed, UNFINISHABLE)
        return keep

    def new_task(self, entries: list[Entry[Query]], *, payload: object = None,
                 pool: str = DATA_POOL, kind: TaskKind = TaskKind.DATA) -> Task:
        return Task(self.assemble(entries) if payload is None else payload, entries, self.mode,
                    pool, kind)

    def send(self, replica: Replica, task: Task) -> None:
        """Give ``task`` to an idle replica (the driver reports a failed send)."""
        batch = InflightBatch(next(self._bids), replica, task.entries, self.now, task)
        task.running += 1
        if task.group is not None:
            task.group.assigned.add(replica.rid)
        replica.batch = batch
        self.inflight[batch.bid] = batch
        self._out.append(Send(batch))

    def requeue(self, entries: list[Entry[Query]]) -> None:
        """Put a lost batch back at the front of its deadline order (it keeps its deadline)."""
        for entry in entries:
            if not entry.item.answered:
                self.queue.requeue(entry)

    def group_opened(self) -> None:
        self.groups += 1

    def emit(self, action: Action) -> None:
        self._out.append(action)

    def at(self, when: float, fn: Callable[[], None]) -> _Timer:
        """Run ``fn`` once the clock reaches ``when`` (a driver's ``tick``)."""
        timer = _Timer(fn)
        heapq.heappush(self._timers, (when, next(self._timer_seq), timer))
        return timer

    def _wake_for_batch(self, wake_at: float | None) -> None:
        """Pump again when a held partial batch is due (one such wake-up at a time)."""
        held = self._batch_wake
        if wake_at is None or (held is not None and self._batch_wake_at <= wake_at):
            return
        if held is not None:
            held.cancel()
        self._batch_wake = self.at(wake_at, self._batch_due)
        self._batch_wake_at = wake_at

    def _batch_due(self) -> None:
        self._batch_wake = None
        self.pump()

    # ---- answers ---------------------------------------------------------------------------
    def settle(self, entries: list[Entry[Query]], outputs: Any) -> None:
        """Answer queries with their own predictions. A prediction arriving after its query
        was answered (rebuilt, or by a faster copy) is not an answer; if the query was
        rebuilt, it is still the model's own output (``Late``)."""
        for entry in entries:
            if entry.item.answered:
                break
        else:  # the common case: all of them still wait, answered with the whole batch
            for entry in entries:
                entry.item.answered = True
            self._out.append(Answer(entries, outputs))
            return
        fresh: tuple[list[Entry[Query]], list[Any]] = ([], [])
        late: tuple[list[Entry[Query]], list[Any]] = ([], [])
        for entry, output in zip(entries, outputs, strict=False):
            query = entry.item
            target = fresh if not query.answered else late if query.method else None
            if target is not None:
                target[0].append(entry)
                target[1].append(output)
            query.answered = True
        if fresh[0]:
            self._out.append(Answer(*fresh))
        if late[0]:
            self._out.append(Late(*late))

    def deliver_decoded(self, run: GroupRun, decoded: Decoded) -> None:
        """Answer the queries of rebuilt batches, flagged with the decoding method."""
        self.decodes += 1
        entries: list[Entry[Query]] = []
        rows: list[Any] = []
        for slot, outputs in decoded.outputs.items():
            for entry, row in zip(run.entries.get(slot, []), outputs, strict=False):
                query = entry.item
                if not query.answered:
                    query.answered, query.method = True, decoded.method
                    entries.append(entry)
                    rows.append(row)
        if entries:
            self._out.append(Answer(entries, rows, decoded.method))

    def fail(self, entries: list[Entry[Query]], error: str, *, bad_input: bool = False) -> None:
        live = _unanswered(entries)
        if live:
            self._out.append(Fail(live, error, bad_input))

    def located(self, rid: str | None) -> None:
        replica = self.replicas.get(rid or "")
        if replica is not None:
            replica.located += 1
            self._out.append(Located(replica.rid))

    def _expire(self, expired: Sequence[Entry[Query]], reason: str = EXPIRED) -> None:
        """Queued work whose deadline passed is dropped, not computed; its waiter has
        answered. Work that a later query shares (same input, later deadline) goes back in
        the queue under that deadline instead."""
        if not expired:
            return
        gone: list[Entry[Query]] = []
        for entry in expired:
            query = entry.item
            later, query.wanted_until = query.wanted_until, 0.0
            if query.answered:
                continue
            if later > entry.deadline:
                self.queue.try_put(query, deadline=later, enqueued_at=entry.enqueued_at)
            else:
                query.answered = True
                gone.append(entry)
        if gone:
            self._out.append(Expire(gone, reason))

    # ---- results ---------------------------------------------------------------------------
    def _finish(self, batch: InflightBatch, now: float, *, computed: bool) -> None:
        """Bookkeeping of any result: the replica is free, AIMD and the service estimate
        learn from the round trip."""
        self.now = now
        replica, task = batch.replica, batch.task
        del self.inflight[batch.bid]
        replica.batch = None
        task.running -= 1
        replica.served += 1
        round_trip = now - batch.sent_at
        replica.round_trip_s += round_trip
        rows = task.rows
        # AIMD learns from the rows the replica computed (a coded task answers no query).
        replica.aimd.observe(rows, round_trip)
        if task.kind == TaskKind.DATA and computed:  # the model's own service rate
            replica.service = replica.service.observe(round_trip, rows)
            self.service = admission.pooled(
                r.service for r in self.replicas.values()
                if r.pool == DATA_POOL and r.state != ReplicaState.DEAD)

    def _flush(self) -> list[Action]:
        self._announce()
        out, self._out = self._out, []
        return out

    def _announce(self) -> None:
        """Ask the driver for a wake-up when the earliest live timer is earlier than the one
        it holds."""
        timers = self._timers
        while timers and timers[0][2].cancelled:
            heapq.heappop(timers)
        if timers and (self._announced is None or timers[0][0] < self._announced):
            self._announced = timers[0][0]
            self._out.append(WakeAt(self._announced))


def _unanswered(entries: Sequence[Entry[Query]]) -> list[Entry[Query]]:
    live = [e for e in entries if not e.item.answered]
    for entry in live:
        entry.item.answered = True
    return live
