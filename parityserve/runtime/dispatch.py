"""One model's serving path: cache, deadline-ordered queue, adaptive batches, idle replicas.

Single-queue load balancing (Clipper, ParM): every query of a model waits in one queue ordered by
deadline, and whichever replica is idle pulls the next batch. Batch sizes come from each
replica's AIMD controller and the delayed-batching rule in ``core/batching.py``; this module is
only the I/O around those decisions.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from parityserve.config import Deployment, TensorSpec
from parityserve.core import admission
from parityserve.core.admission import ServiceEstimate
from parityserve.core.batching import AIMDController, decide_batch
from parityserve.core.cache import ClockCache, cache_key, input_digest
from parityserve.core.deadline_queue import DeadlineQueue, Entry
from parityserve.core.inputs import Leaves
from parityserve.core.redundancy import Decoded
from parityserve.errors import InvalidInput, Overloaded, PredictError, WorkerError
from parityserve.runtime import messages, wire
from parityserve.runtime.coding import GroupRun, make_redundancy
from parityserve.runtime.metrics import Metrics
from parityserve.runtime.rpc import Link
from parityserve.runtime.tensors import coerce_item
from parityserve.runtime.v2 import datatype_to_dtype

__all__ = ["DATA_POOL", "InflightBatch", "ModelPath", "Query", "Replica", "ReplicaStats", "Task"]

_batch_ids = itertools.count(1)
DATA_POOL = "data"
# The queue's own capacity when ``server.max_queue`` is unset: a backstop only, since
# admission (core/admission.py) sheds long before it on the model's measured service rate.
_BACKSTOP_QUEUE = 1 << 20


class QueryExpired(WorkerError):
    """A queued query's deadline passed, or it could no longer finish in time: it was not
    computed. The V2 route answers it 504; an application answers it with its default."""


@dataclass(eq=False, slots=True)
class Query:
    """One queued input and the future its answer resolves."""

    item: Any
    key: tuple[str, int, bytes] | None
    future: asyncio.Future[Any]


@dataclass(eq=False)
class Task:
    """One unit of work for a replica: a batch of queries, a copy of one, or a coded batch.

    ``entries`` are the queries its output answers directly (none for parity and Berrut-coded
    tasks, whose outputs only feed a decoder). ``group``/``slot`` place it in a coding group;
    a replicated or re-issued task is the same object sent to several replicas.
    """

    payload: Any
    entries: list[Entry[Query]]
    pool: str = DATA_POOL
    kind: str = "data"  # data | parity | coded
    group: Any = None  # runtime.coding.GroupRun, or None
    slot: int = -1
    done: bool = False  # its output arrived (from any copy): later copies are not needed
    running: int = 0  # replicas working on it now
    via: Any = None  # the runtime.coding.Redundancy that made it (modes can change live)

    def needed(self) -> bool:
        if self.done:
            return False
        if self.group is not None:
            return bool(self.group.needs(self))
        return any(not e.item.future.done() for e in self.entries)


@dataclass(eq=False)
class InflightBatch:
    bid: int
    replica: Replica
    entries: list[Entry[Query]]
    sent_at: float
    task: Task


@dataclass(eq=False)
class Replica:
    """The frontend's view of one worker process."""

    rid: str
    index: int
    aimd: AIMDController
    last_seen: float
    state: str = "starting"  # starting | ready | dead | retiring
    process: Any = None  # WorkerProcess, or None for a worker that joined by itself
    batch: InflightBatch | None = None
    served: int = 0
    pid: int | None = None
    started_at: float = 0.0
    faults: dict[str, Any] = field(default_factory=dict)
    pool: str = DATA_POOL  # "data" runs the model; "parity<j>" runs parity model j
    located: int = 0  # results of this replica the Byzantine error locator excluded
    # Summed over its answered batches: send to result as the frontend saw it, and the time
    # the worker says it spent (predict plus any injected delay). The difference is transport
    # and socket queueing: what the replica is held for beyond its own work.
    round_trip_s: float = 0.0
    worker_s: float = 0.0

    @property
    def idle(self) -> bool:
        return self.state == "ready" and self.batch is None


@dataclass(frozen=True)
class ReplicaStats:
    rid: str
    index: int
    state: str
    pid: int | None
    inflight: int
    served: int
    max_batch_size: int
    pool: str = DATA_POOL
    located: int = 0
    round_trip_s: float = 0.0  # summed over answered batches (see ``Replica``)
    worker_s: float = 0.0


class ModelPath:
    """Queue, replicas and in-flight batches of one deployed model version."""

    def __init__(self, deployment: Deployment, *, link: Link, metrics: Metrics,
                 cache: ClockCache[tuple[str, int, bytes], Any], clock: Callable[[], float],
                 slo_s: float, max_queue: int | None) -> None:
        self.deployment = deployment
        self.name = deployment.name
        self.version = deployment.version
        self.link = link
        self.metrics = metrics
        self.cache = cache
        self.clock = clock
        self.slo_s = slo_s
        self.queue: DeadlineQueue[Query] = DeadlineQueue(max_queue or _BACKSTOP_QUEUE)
        self.service = ServiceEstimate()  # measured from completed data batches
        self.shed = 0  # queries refused at admission or not dispatched (too late to finish)
        self.replicas: dict[str, Replica] = {}
        self.inflight: dict[int, InflightBatch] = {}
        self.pending: dict[tuple[str, int, bytes], asyncio.Future[Any]] = {}
        self.wanted_until: dict[tuple[str, int, bytes], float] = {}
        self.input_spec: TensorSpec | None = deployment.input
        self.output_spec: TensorSpec | None = deployment.output
        self.platform = "unknown"
        self._wake: asyncio.TimerHandle | None = None
        # Read once: the hot path should not build a statistics record per query.
        self._caching = cache.statistics().capacity_bytes > 0
        self._wake_at = 0.0  # when ``_wake`` fires, on ``clock`` (TimerHandle.when() is loop time)
        self.redundancy = make_redundancy(self, deployment)
        # Futures answered by decoding, and how; a late real prediction still goes to the cache.
        self.rebuilt: weakref.WeakKeyDictionary[asyncio.Future[Any], str] = (
            weakref.WeakKeyDictionary())

    # ---- queries -------------------------------------------------------------------------
    def coerce(self, item: Any, leaves: Leaves | None = None) -> Any:
        """Check one input against the model's signature (raises InvalidInput); ``leaves``
        is the JSON scan already made of it, if any."""
        return coerce_item(item, self.input_spec, where=f"model {self.name!r}",
                           allow_nonfinite=self.deployment.allow_nonfinite, leaves=leaves)

    def submit(self, item: Any, deadline: float, *, admitted: bool = False
               ) -> tuple[asyncio.Future[Any], bool]:
        """Queue one input; returns (future, from_cache).

        Raises Overloaded when admission sheds it (unless the caller ``admitted`` it already,
        with the rest of its request), QueueFull at an explicit ``max_queue``.
        """
        key = self._key(item)
        if key is not None:
            found = self._lookup(key, deadline)
            if found is not None:
                return found
        if not admitted:
            self.admit(1, deadline)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.queue.try_put(Query(item, key, future), deadline=deadline, enqueued_at=self.clock())
        if key is not None:
            self._track_pending(key, future)
        self.pump()
        return future, False

    def admit(self, count: int, deadline: float) -> None:
        """Raise Overloaded unless ``count`` more queries can still be served by ``deadline``."""
        depth = len(self.queue)
        decision = admission.admit(
            self.service, depth=depth, count=count, now=self.clock(), deadline=deadline,
            slo_s=self.slo_s, replicas=self.serving_replicas(),
            max_batch_size=self.deployment.batching.max_batch_size)
        if not decision.admitted:
            self.shed += count
            raise Overloaded(f"model {self.name!r} is overloaded: {decision.reason}; "
                             f"retry in {decision.retry_after_s:g}s",
                             model=self.name, depth=depth, retry_after_s=decision.retry_after_s)

    def queue_bound(self) -> int:
        """The derived queue bound now (``server.max_queue`` caps it further)."""
        return admission.queue_bound(self.service, self.slo_s, self.serving_replicas(),
                                     self.deployment.batching.max_batch_size)

    def admission_state(self) -> dict[str, Any]:
        """What admission sees now (for /admin/state): bound, depth, service, shed."""
        return {"bound": self.queue_bound(), "depth": len(self.queue),
                "max_queue": self.queue.statistics().capacity,
                "measured": self.service.measured,
                "service_ms_per_query": self.service.per_query_s * 1000,
                "batch_ms": self.service.batch_s * 1000, "shed": self.shed}

    def serving_replicas(self) -> int:
        return sum(1 for r in self.replicas.values()
                   if r.state == "ready" and r.pool == DATA_POOL)

    def _key(self, item: Any) -> tuple[str, int, bytes] | None:
        if not self._caching:
            return None
        return cache_key(self.name, self.version, input_digest(item))

    def _lookup(self, key: tuple[str, int, bytes],
                deadline: float) -> tuple[asyncio.Future[Any], bool] | None:
        cached = self.cache.get(key)
        if cached is not None:
            self.metrics.cache(self.name, True)
            done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            done.set_result(cached[0])
            return done, True
        pending = self.pending.get(key)
        # The same input is already queued or computing: share its answer, don't compute again.
        self.metrics.cache(self.name, pending is not None)
        if pending is None:
            return None
        # The sharer may wait longer than the query that queued the work: keep it wanted.
        self.wanted_until[key] = max(self.wanted_until.get(key, deadline), deadline)
        return pending, True

    def _track_pending(self, key: tuple[str, int, bytes], future: asyncio.Future[Any]) -> None:
        self.pending[key] = future

        def settle(done: asyncio.Future[Any]) -> None:
            self.pending.pop(key, None)
            self.wanted_until.pop(key, None)
            if not done.cancelled() and done.exception() is None and done not in self.rebuilt:
                value = done.result()
                self.cache.put(key, (value,), _nbytes(value))

        future.add_done_callback(settle)

    # ---- dispatch ------------------------------------------------------------------------
    def pump(self) -> None:
        """Hand work to idle replicas: queued tasks (copies, parities, coded batches) first,
        then new batches from the deadline queue."""
        forming = True
        for replica in list(self.replicas.values()):
            if not replica.idle:
                continue
            task = self.redundancy.next_task(replica.pool, replica.rid)
            if task is not None:
                self.send_task(replica, task, self.clock())
                continue
            if replica.pool != DATA_POOL or not forming or not self.queue:
                continue
            forming = self._dispatch_to(replica)

    def _dispatch_to(self, replica: Replica) -> bool:
        now = self.clock()
        limit = replica.aimd.max_batch_size * self.redundancy.batches_per_dispatch
        decision = decide_batch(len(self.queue), self.queue.oldest_enqueued_at(), now, limit,
                                self.deployment.batching.max_delay_ms / 1000)
        if not decision.dispatch:
            self._schedule_wake(decision.wake_at)
            return False
        entries, expired = self.queue.pop_batch(now, decision.size)
        self._expire(expired)
        entries = self._drop_doomed(entries, now)
        live = [e for e in entries if not e.item.future.done()]
        if live:
            self.redundancy.dispatch(replica, live, now)
        elif self.queue:  # all it popped expired (some perhaps requeued for a later sharer)
            return self._dispatch_to(replica)
        return True

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
            self._expire(doomed, "cannot finish before its deadline")
        return keep

    def new_task(self, entries: list[Entry[Query]], *, payload: Any = None,
                 pool: str = DATA_POOL, kind: str = "data") -> Task:
        task = Task(self.assemble(entries) if payload is None else payload, entries, pool, kind)
        task.via = self.redundancy
        return task

    def set_redundancy(self, deployment: Deployment) -> None:
        """Serve new batches under the deployment's (new) mode; old groups finish as they were.
        Tasks the old mode still had queued move over to the new one's queues."""
        old, self.deployment = self.redundancy, deployment
        self.redundancy = make_redundancy(self, deployment)
        for tasks in old.pending.values():
            for task in tasks:
                if task.pool == DATA_POOL or task.pool in _pools(deployment):
                    self.redundancy.push(task)
                elif task.needed() and not task.entries:
                    continue  # a parity task whose pool is gone: its group decodes without it
        self.pump()

    def assemble(self, entries: list[Entry[Query]]) -> Any:
        return _assemble([e.item.item for e in entries])

    def send_task(self, replica: Replica, task: Task, now: float) -> bool:
        """Send ``task`` to an idle replica; False (and the task back) if the worker is gone."""
        batch = InflightBatch(next(_batch_ids), replica, task.entries, now, task)
        desc, frames = wire.pack_payload(task.payload)
        try:
            self.link.send(replica.rid, {"t": wire.PREDICT, "bid": batch.bid, "in": desc}, frames)
        except WorkerError:
            replica.state = "dead"  # the supervisor notices the dead worker and restarts it
            task.via.take_back(task)
            return False
        task.running += 1
        if task.group is not None:
            task.group.assigned.add(replica.rid)
        replica.batch = batch
        self.inflight[batch.bid] = batch
        rows = _rows(task.payload)
        self.metrics.batch(self.name, rows)
        self.metrics.set_inflight(self.name, replica.rid, rows)
        for entry in task.entries:
            self.metrics.queue_time(self.name, now - entry.enqueued_at)
        return True

    def _schedule_wake(self, wake_at: float | None) -> None:
        if wake_at is None or (self._wake is not None and self._wake_at <= wake_at):
            return
        if self._wake is not None:
            self._wake.cancel()
        loop = asyncio.get_running_loop()
        delay = max(0.0, wake_at - self.clock())
        self._wake, self._wake_at = loop.call_later(delay, self._on_wake), wake_at

    def _on_wake(self) -> None:
        self._wake = None
        self.pump()

    def _expire(self, expired: list[Entry[Query]],
                reason: str = "deadline passed while queued") -> None:
        """Queued work whose deadline passed is dropped, not computed; its waiter has answered.

        Work that a later query shares (same input, later deadline) goes back in the queue
        under that deadline instead.
        """
        for entry in expired:
            query = entry.item
            later = self.wanted_until.pop(query.key, None) if query.key is not None else None
            if later is not None and later > entry.deadline and not query.future.done():
                self.queue.try_put(query, deadline=later, enqueued_at=entry.enqueued_at)
                continue
            _fail(query.future, QueryExpired(f"model {self.name!r}: {reason}"))

    def expire_stale(self, now: float) -> None:
        """Drop queued work whose deadline passed even while no replica is pulling."""
        self._expire(self.queue.drop_expired(now))

    def requeue(self, entries: list[Entry[Query]]) -> None:
        """Put a lost batch back at the front of its deadline order (it keeps its deadline)."""
        for entry in entries:
            if not entry.item.future.done():
                self.queue.requeue(entry)

    # ---- results -------------------------------------------------------------------------
    def on_result(self, replica: Replica, header: dict[str, Any], buffers: list[Any]) -> None:
        """A RESULT as the wire carries it (raises ProtocolError); see ``accept_result``."""
        result = messages.parse({**header, "t": wire.RESULT}, buffers)
        assert isinstance(result, messages.Result)
        self.accept_result(replica, result)

    def accept_result(self, replica: Replica,
                      result: messages.Result) -> tuple[str, str] | None:
        """Take a replica's result for a batch sent to *that* replica; anything else (a batch it
        was never sent, or one already answered) changes nothing. Returns (reason, detail)
        when the result was refused or unusable, for the caller to count and log."""
        batch = self.inflight.get(result.bid)
        if batch is None or batch.replica is not replica:
            return "unknown_batch", f"result for batch {result.bid}, not in flight on this replica"
        del self.inflight[result.bid]
        replica.batch = None
        self.metrics.set_inflight(self.name, replica.rid, 0)
        batch.task.running -= 1
        replica.served += 1
        round_trip = self.clock() - batch.sent_at
        replica.round_trip_s += round_trip
        if result.ms is not None:  # a worker of another version may not say
            replica.worker_s += result.ms / 1000
        # AIMD learns from the rows the replica computed (a coded task answers no query itself).
        replica.aimd.observe(_rows(batch.task.payload), round_trip)
        if batch.task.kind == "data" and result.ok:  # the model's own service rate
            self.service = self.service.observe(round_trip, _rows(batch.task.payload))
        refused = self._deliver(batch, result)
        self.pump()
        return refused

    def refuse_batch(self, replica: Replica, why: str) -> bool:
        """A malformed result from ``replica``: fail the batch it holds (its queries get the
        error, so the default), rather than leave the replica busy forever. A worker runs one
        batch at a time, so any result it sends is about that batch, whatever bid it names."""
        batch = replica.batch
        if batch is None:
            return False
        self.accept_result(replica, messages.Result(batch.bid, False, error=why))
        return True

    def _deliver(self, batch: InflightBatch, result: messages.Result) -> tuple[str, str] | None:
        if not result.ok:
            error = PredictError(f"model {self.name!r} failed: {result.error}")
            batch.task.via.on_error(batch, error)
            return None
        refused = self._check_outputs(result.outputs, _rows(batch.task.payload))
        if refused is not None:
            error = PredictError(f"model {self.name!r} returned unusable outputs: {refused[1]}")
            batch.task.via.on_error(batch, error)
            return refused
        batch.task.via.on_output(batch, result.outputs)
        return None

    def _check_outputs(self, outputs: Any, rows: int) -> tuple[str, str] | None:
        """(reason, detail) when a batch's outputs cannot be served, else None."""
        if isinstance(outputs, np.ndarray) and outputs.ndim == 0 or not isinstance(
                outputs, np.ndarray | list):
            return "wrong_shape", f"outputs are a {type(outputs).__name__}, not one row per input"
        if len(outputs) != rows:
            return "wrong_shape", f"{len(outputs)} outputs for {rows} inputs"
        spec = self.output_spec
        if isinstance(outputs, np.ndarray) and spec is not None and not _dtype_fits(
                outputs.dtype, spec.datatype):
            return "wrong_dtype", f"{outputs.dtype} outputs, the model declares {spec.datatype}"
        if not self.deployment.allow_nonfinite and not _finite(outputs):
            return "nonfinite", "NaN or infinity in the outputs"
        return None

    def settle(self, entries: list[Entry[Query]], outputs: list[Any], *, late: bool) -> None:
        """Answer queries with their own predictions. A prediction arriving after its query
        was answered (rebuilt, or by a faster copy) goes to the cache, not to the client."""
        for entry, output in zip(entries, outputs, strict=False):
            query = entry.item
            if not query.future.done():
                query.future.set_result(_own(output))
            elif query.key is not None and query.future in self.rebuilt:
                value = _own(output)
                self.cache.put(query.key, (value,), _nbytes(value))

    def deliver_decoded(self, run: GroupRun, decoded: Decoded) -> None:
        """Answer the queries of rebuilt batches, flagged with the decoding method."""
        count = 0
        for slot, rows in decoded.outputs.items():
            for entry, row in zip(run.entries.get(slot, []), rows, strict=False):
                future = entry.item.future
                if not future.done():
                    self.rebuilt[future] = decoded.method
                    future.set_result(_own(row))
                    count += 1
        if count:
            self.metrics.reconstructed(self.name, decoded.method, count)

    def reconstruction(self, future: Any) -> str | None:
        """How a query was answered by decoding (``parm-subtraction``, ``berrut``...), or None."""
        return self.rebuilt.get(future) if isinstance(future, asyncio.Future) else None

    def located(self, rid: str | None) -> None:
        replica = self.replicas.get(rid or "")
        if replica is not None:
            replica.located += 1
            self.metrics.byzantine(self.name, f"{replica.pool}/{replica.index}")

    def take_back(self, replica: Replica) -> int:
        """Requeue the work a failed replica held; returns how many queries went back."""
        batch = replica.batch
        replica.batch = None
        if batch is None:
            return 0
        self.inflight.pop(batch.bid, None)
        self.metrics.set_inflight(self.name, replica.rid, 0)
        batch.task.running -= 1
        return int(batch.task.via.take_back(batch.task))

    # ---- state ---------------------------------------------------------------------------
    def ready_replicas(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.state == "ready"]

    def has_capacity(self) -> bool:
        """True while some model replica is serving or about to (so waiting makes sense)."""
        return any(r.state in ("ready", "starting") and r.pool == DATA_POOL
                   for r in self.replicas.values())

    def replica_stats(self) -> list[ReplicaStats]:
        return [ReplicaStats(r.rid, r.index, r.state, r.pid,
                             len(r.batch.entries) if r.batch else 0, r.served,
                             r.aimd.max_batch_size, r.pool, r.located, r.round_trip_s,
                             r.worker_s)
                for r in self.replicas.values()]

    def fail_all(self, reason: str) -> None:
        """Answer every queued and in-flight query with an error (shutdown)."""
        error = WorkerError(reason)
        for batch in self.inflight.values():
            for entry in batch.entries:
                _fail(entry.item.future, error)
            if batch.task.group is not None:
                for entry in batch.task.group.unanswered():
                    _fail(entry.item.future, error)
        for tasks in self.redundancy.pending.values():
            for task in tasks:
                for entry in task.entries:
                    _fail(entry.item.future, error)
        for entry in self.queue.drop_expired(float("inf")):
            _fail(entry.item.future, error)  # not a deadline: the server is going away
        if self._wake is not None:
            self._wake.cancel()


def _rows(payload: Any) -> int:
    return len(payload) if hasattr(payload, "__len__") else 1


# Which array kinds a declared V2 datatype accepts (float64 from an "FP32" model is fine;
# strings, or floats from an integer model, are not).
_KINDS = {"f": "f", "i": "iu", "u": "iu", "b": "b", "c": "c"}


def _dtype_fits(dtype: np.dtype[Any], datatype: str) -> bool:
    if datatype == "BYTES":
        return dtype.kind in "USO"
    try:
        expected = datatype_to_dtype(datatype).kind
    except InvalidInput:
        return True  # a signature this frontend does not know is not checked
    return dtype.kind in _KINDS.get(expected, expected)


def _finite(value: Any) -> bool:
    """No NaN or infinity anywhere in the outputs (arrays, or numbers nested in lists/maps).
    Iterative: a peer chooses the nesting depth."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, np.ndarray):
            if item.dtype.kind in "fc" and not np.isfinite(item).all():
                return False
        elif isinstance(item, float):
            if not math.isfinite(item):
                return False
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return True


def _pools(deployment: Deployment) -> set[str]:
    parity = deployment.parity if deployment.redundancy.mode == "parm" else None
    return {f"parity{j}" for j in range(parity.r)} if parity is not None else set()


def _assemble(items: list[Any]) -> Any:
    """Stack equal-shaped arrays into one batch array; anything else travels as a list."""
    first = items[0]
    if isinstance(first, np.ndarray) and all(
            isinstance(x, np.ndarray) and x.shape == first.shape and x.dtype == first.dtype
            for x in items):
        return np.stack(items)
    return items


def _own(output: Any) -> Any:
    """Copy a row out of the received frame so the cache does not pin whole batches."""
    return output.copy() if isinstance(output, np.ndarray) else output


def _nbytes(value: Any) -> int:
    base = 64  # bookkeeping overhead per entry
    if isinstance(value, np.ndarray):
        return base + value.nbytes
    return base + len(repr(value))


def _fail(future: asyncio.Future[Any], error: Exception) -> None:
    if not future.done():
        future.set_exception(error)
        future.exception()  # mark retrieved: the waiter may already have answered by deadline


