"""One model's serving path, driven on asyncio: the I/O around ``core/scheduling``.

The decisions (which idle replica pulls what, batch sizes, what each redundancy mode sends,
when a group decodes, what is dropped as too late) are the sans-I/O ``Scheduler``'s. This
module feeds it events (a query, a result, a failed send, a due wake-up) and carries out the
actions it returns: ``WorkerLink`` sends, futures resolved, one ``loop.call_later`` timer for
the wake-up it asks for, metrics. It also owns what only the runtime has: the response cache,
the checks a worker's outputs must pass before they count, and the wire format.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from parityserve.config import Deployment, TensorSpec
from parityserve.core.admission import ServiceEstimate
from parityserve.core.cache import ClockCache, cache_key, input_digest
from parityserve.core.deadline_queue import DeadlineQueue, Entry
from parityserve.core.inputs import Leaves
from parityserve.core.reconstruction import ExpectedAccuracy
from parityserve.core.scheduling import (
    DATA_POOL,
    Abort,
    Action,
    Answer,
    Batching,
    CodingFailed,
    Expire,
    Fail,
    InflightBatch,
    Late,
    Located,
    ModeSettings,
    ParitySettings,
    Query,
    Redundant,
    ReplicaState,
    Scheduler,
    Send,
    Task,
    WakeAt,
    parity_pools,
)
from parityserve.core.scheduling import Replica as ReplicaCore
from parityserve.core.scheduling.modes import Redundancy
from parityserve.datatypes import datatype_to_dtype
from parityserve.errors import InvalidInput, Overloaded, PredictError, WorkerError
from parityserve.runtime.modelpath.metrics import Metrics
from parityserve.runtime.modelpath.tensors import coerce_item
from parityserve.runtime.workers import messages, wire
from parityserve.runtime.workers.rpc import Link

__all__ = ["DATA_POOL", "InflightBatch", "ModelPath", "Query", "Replica", "ReplicaStats", "Task"]

log = logging.getLogger(__name__)

# The queue's own capacity when ``server.max_queue`` is unset: a backstop only, since
# admission (core/admission.py) sheds long before it on the model's measured service rate.
_BACKSTOP_QUEUE = 1 << 20


class QueryExpired(WorkerError):
    """A queued query's deadline passed, or it could no longer finish in time: it was not
    computed. The V2 route answers it 504; an application answers it with its default."""


@dataclass(eq=False)
class Replica(ReplicaCore):
    """The frontend's view of one worker process: what scheduling knows of it, plus the
    process bookkeeping of the supervisor."""

    last_seen: float = 0.0
    process: Any = None  # WorkerProcess, or None for a worker that joined by itself
    pid: int | None = None
    started_at: float = 0.0
    faults: dict[str, Any] = field(default_factory=dict)
    threads: int | None = None  # intra-op threads the worker last reported (its heartbeat)


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
    threads: int | None = None


def deployed_parity_pools(deployment: Deployment) -> list[str]:
    """The parity pools ``deployment`` runs (ParM only)."""
    parity = deployment.parity if deployment.redundancy.mode == "parm" else None
    return parity_pools(parity.r) if parity is not None else []


def batching_of(deployment: Deployment) -> Batching:
    b = deployment.batching
    return Batching(b.max_batch_size, b.max_delay_ms / 1000, b.busy_delay_ms / 1000)


def mode_of(deployment: Deployment) -> ModeSettings:
    """The scheduler's settings for ``deployment``'s redundancy mode."""
    cfg, parity = deployment.redundancy, deployment.parity
    return ModeSettings(
        mode=cfg.mode, copies=cfg.d,
        reissue_after_s=cfg.timeout_ms / 1000 if cfg.timeout_ms is not None else None,
        parity=None if parity is None else ParitySettings(
            k=parity.k, r=parity.r, coefficients=parity.coefficients, encoder=parity.encoder,
            grace_s=parity.timeout_ms / 1000 if parity.timeout_ms is not None else None,
            group_wait_s=parity.group_wait_ms / 1000),
        K=cfg.K, S=cfg.S, E=cfg.E, workers=cfg.workers, decoder=cfg.decoder,
        group_wait_s=cfg.group_wait_ms / 1000)


class ModelPath:
    """Queue, replicas and in-flight batches of one deployed model version: the asyncio driver
    of its ``Scheduler`` (``self.machine``)."""

    def __init__(self, deployment: Deployment, *, link: Link, metrics: Metrics,
                 cache: ClockCache[tuple[str, int, bytes], Any], clock: Callable[[], float],
                 slo_s: float, max_queue: int | None,
                 expected: ExpectedAccuracy | None = None,
                 saturated: Callable[[], bool] | None = None) -> None:
        self.name = deployment.name
        self.expected = expected  # measured accuracy of rebuilt answers (core/reconstruction)
        self.version = deployment.version
        self.link = link
        self.metrics = metrics
        self.cache = cache
        self.clock = clock
        self.machine = Scheduler(batching_of(deployment), mode_of(deployment), slo_s=slo_s,
                                 max_queue=max_queue or _BACKSTOP_QUEUE,
                                 assemble=self.assemble, parallelism=deployment.parallelism)
        self._deployment = deployment
        self.pending: dict[tuple[str, int, bytes], Query] = {}
        self.input_spec: TensorSpec | None = deployment.input
        self.output_spec: TensorSpec | None = deployment.output
        self.platform = "unknown"
        self._wake: asyncio.TimerHandle | None = None
        self._wake_at = 0.0  # when ``_wake`` fires, on ``clock`` (TimerHandle.when() is loop time)
        self._pump_due = False  # a pump is scheduled for the end of this loop pass
        # Is the event loop saturated (runtime/modelpath/loop_pressure.py)? Read before each pass's
        # pump, for the scheduler's busy hold; None: never (a batch leaves as soon as it can).
        self._saturated = saturated
        # Read once: the hot path should not build a statistics record per query.
        self._caching = cache.statistics().capacity_bytes > 0
        # Futures answered by decoding, and how; a late real prediction still goes to the cache.
        self.rebuilt: weakref.WeakKeyDictionary[asyncio.Future[Any], str] = (
            weakref.WeakKeyDictionary())
        # The parallelism controller's load probe (runtime/fleet/parallelism.py), when one watches:
        # told of every query that reaches the scheduler (cache hits load no replica).
        self.probe: Callable[[float, asyncio.Future[Any]], None] | None = None

    # ---- the scheduler's state, as the rest of the runtime reads it --------------------------
    @property
    def deployment(self) -> Deployment:
        return self._deployment

    @deployment.setter
    def deployment(self, deployment: Deployment) -> None:
        self._deployment = deployment
        self.machine.batching = batching_of(deployment)

    @property
    def replicas(self) -> dict[str, Replica]:
        # The machine keeps what scheduling knows of a replica (ReplicaCore). Every replica of
        # this driver's machine is put in through this dict, as the runtime's Replica, so the
        # same dict is the supervisor's view with the process bookkeeping.
        return cast("dict[str, Replica]", self.machine.replicas)

    @property
    def inflight(self) -> dict[int, InflightBatch]:
        return self.machine.inflight

    @property
    def queue(self) -> DeadlineQueue[Query]:
        return self.machine.queue

    @property
    def redundancy(self) -> Redundancy:
        return self.machine.mode

    @property
    def service(self) -> ServiceEstimate:
        return self.machine.service

    @service.setter
    def service(self, estimate: ServiceEstimate) -> None:
        self.machine.service = estimate

    @property
    def shed(self) -> int:
        return self.machine.shed

    @shed.setter
    def shed(self, count: int) -> None:
        self.machine.shed = count

    @property
    def slo_s(self) -> float:
        return self.machine.slo_s

    @slo_s.setter
    def slo_s(self, slo_s: float) -> None:
        self.machine.slo_s = slo_s

    # ---- queries -------------------------------------------------------------------------
    def coerce(self, item: Any, leaves: Leaves | None = None) -> Any:
        """Check one input against the model's signature (raises InvalidInput); ``leaves``
        is the JSON scan already made of it, if any."""
        deployment = self.deployment
        return coerce_item(item, self.input_spec, where=f"model {self.name!r}",
                           allow_nonfinite=deployment.allow_nonfinite, leaves=leaves,
                           json_arrays=deployment.json_inputs == "arrays")

    @property
    def input_form(self) -> tuple[TensorSpec | None, bool, str]:
        """Everything ``coerce`` depends on besides the item: models whose forms are equal
        get the same coerced input, so one coercion per request serves them all."""
        deployment = self.deployment
        return self.input_spec, deployment.allow_nonfinite, deployment.json_inputs

    def submit(self, item: Any, deadline: float, *, admitted: bool = False,
               cache: bool = True) -> tuple[asyncio.Future[Any], bool]:
        """Queue one input; returns (future, from_cache). ``cache=False``: neither looked up
        nor stored (a graph's operator rows, which are another operator's outputs).

        Raises Overloaded when admission sheds it (unless the caller ``admitted`` it already,
        with the rest of its request), QueueFull at an explicit ``max_queue``.
        """
        key = self._key(item) if cache else None
        if key is not None:
            found = self._lookup(key, deadline)
            if found is not None:
                return found
        if not admitted:
            self.admit(1, deadline)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        query = Query(item, key, future)
        now = self.clock()
        self.machine.enqueue(query, deadline, now)
        if self.probe is not None:
            self.probe(now, future)
        if key is not None:
            self._track_pending(key, query)
        if not self._pump_due:
            # One pump per event-loop pass, after the callbacks already runnable: the queries
            # of requests that arrived together leave as one batch instead of the first going
            # alone to an idle replica and the rest waiting for its round trip.
            self._pump_due = True
            asyncio.get_running_loop().call_soon(self._pump_queued)
        return future, False

    def _pump_queued(self) -> None:
        self._pump_due = False
        if self._saturated is not None:
            self.machine.saturated = self._saturated()
        self._apply(self.machine.pump_at(self.clock()))

    def admit(self, count: int, deadline: float) -> None:
        """Raise Overloaded unless ``count`` more queries can still be served by ``deadline``."""
        decision = self.machine.admit(count, deadline, self.clock())
        if not decision.admitted:
            raise Overloaded(f"model {self.name!r} is overloaded: {decision.reason}; "
                             f"retry in {decision.retry_after_s:g}s", model=self.name,
                             depth=len(self.queue), retry_after_s=decision.retry_after_s)

    def queue_bound(self) -> int:
        """The derived queue bound now (``server.max_queue`` caps it further)."""
        return self.machine.queue_bound()

    def admission_state(self) -> dict[str, Any]:
        """What admission sees now (for /admin/state): bound, depth, service, shed."""
        service = self.service
        return {"bound": self.queue_bound(), "depth": len(self.queue),
                "max_queue": self.queue.statistics().capacity,
                "measured": service.measured,
                "service_ms_per_query": service.per_query_s * 1000,
                "batch_ms": service.batch_s * 1000, "shed": self.shed}

    def serving_replicas(self) -> int:
        return self.machine.serving_replicas()

    def ongoing(self) -> int:
        """Queries queued or running: Ray Serve's "ongoing requests" for the queue-length
        policy."""
        return len(self.queue) + sum(len(b.entries) for b in self.inflight.values())

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
        pending.wanted_until = max(pending.wanted_until or deadline, deadline)
        future: asyncio.Future[Any] = pending.handle
        return future, True

    def _track_pending(self, key: tuple[str, int, bytes], query: Query) -> None:
        self.pending[key] = query

        def settle(done: asyncio.Future[Any]) -> None:
            if self.pending.get(key) is query:
                del self.pending[key]
            if not done.cancelled() and done.exception() is None and done not in self.rebuilt:
                value = done.result()
                self.cache.put(key, (value,), _nbytes(value))

        query.handle.add_done_callback(settle)

    # ---- events into the scheduler ---------------------------------------------------------
    def pump(self) -> None:
        """Hand work to idle replicas (call after a replica joined or became ready)."""
        self._apply(self.machine.pump_at(self.clock()))

    def set_parallelism(self, deployment: Deployment) -> None:
        """Apply the deployment's (new) parallelism limit live: no process restarts; a
        raised limit sends at once, a lowered one lets running batches finish."""
        self.deployment = deployment
        self._apply(self.machine.set_parallelism(deployment.parallelism, self.clock()))

    def set_redundancy(self, deployment: Deployment) -> None:
        """Serve new batches under the deployment's (new) mode; old groups finish as they were.
        Tasks the old mode still had queued move over to the new one's queues."""
        self.deployment = deployment
        self._apply(self.machine.set_mode(mode_of(deployment), self.clock()))

    def assemble(self, entries: list[Entry[Query]]) -> Any:
        return _assemble([e.item.item for e in entries])

    def expire_stale(self, now: float) -> None:
        """Drop queued work whose deadline passed even while no replica is pulling."""
        self._apply(self.machine.expire_stale(now))

    def requeue(self, entries: list[Entry[Query]]) -> None:
        """Put a lost batch back at the front of its deadline order (it keeps its deadline)."""
        self.machine.requeue(entries)

    def take_back(self, replica: ReplicaCore) -> int:
        """Requeue the work a failed replica held; returns how many queries went back."""
        if replica.batch is not None:
            self.metrics.set_inflight(self.name, replica.rid, 0)
        return self.machine.take_back(replica)

    def _on_wake(self) -> None:
        self._wake = None
        # The timer may fire a little early (the loop's clock resolution): it is due anyway.
        self._apply(self.machine.tick(max(self.clock(), self._wake_at)))

    # ---- results -------------------------------------------------------------------------
    def on_result(self, replica: ReplicaCore, header: dict[str, Any],
                  buffers: list[Any]) -> None:
        """A RESULT as the wire carries it (raises ProtocolError); see ``accept_result``."""
        result = messages.parse({**header, "t": wire.RESULT}, buffers)
        assert isinstance(result, messages.Result)
        self.accept_result(replica, result)

    def accept_result(self, replica: ReplicaCore, result: messages.Result, *,
                      made_up: bool = False) -> tuple[str, str] | None:
        """Take a replica's result for a batch sent to *that* replica; anything else (a batch it
        was never sent, or one already answered) changes nothing. Returns (reason, detail)
        when the result was refused or unusable, for the caller to count and log."""
        batch = self.machine.inflight.get(result.bid)
        if batch is None or batch.replica is not replica:
            return "unknown_batch", f"result for batch {result.bid}, not in flight on this replica"
        self.metrics.set_inflight(self.name, replica.rid, 0)
        if result.ms is not None:  # a worker of another version may not say
            replica.worker_s += result.ms / 1000
        now = self.clock()
        if not result.ok:
            # The model raised on the batch, unless the frontend made this result up for a
            # malformed one (``refuse_batch``): only the former is split to find bad rows.
            self._apply(self.machine.task_error(
                batch, f"model {self.name!r} failed: {result.error}", now,
                raised=not made_up, bad_input=result.bad_input))
            return None
        refused = self._check_outputs(result.outputs, batch.task.rows)
        if refused is not None:
            self._apply(self.machine.task_error(
                batch, f"model {self.name!r} returned unusable outputs: {refused[1]}", now,
                computed=True))
            return refused
        self._apply(self.machine.task_output(batch, result.outputs, now))
        return None

    def refuse_batch(self, replica: ReplicaCore, why: str) -> bool:
        """A malformed result from ``replica``: fail the batch it holds (its queries get the
        error, so the default), rather than leave the replica busy forever. A worker runs one
        batch at a time, so any result it sends is about that batch, whatever bid it names."""
        batch = replica.batch
        if batch is None:
            return False
        self.accept_result(replica, messages.Result(batch.bid, False, error=why), made_up=True)
        return True

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

    def expected_accuracy(self, method: str) -> float | None:
        """How often an answer rebuilt by ``method`` is right, as measured; None: unknown."""
        return self.expected.of(method) if self.expected is not None else None

    def reconstruction(self, future: Any) -> str | None:
        """How a query was answered by decoding (``parm-subtraction``, ``berrut``...), or None."""
        return self.rebuilt.get(future) if isinstance(future, asyncio.Future) else None

    # ---- actions out of the scheduler ------------------------------------------------------
    def _apply(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Send):
                self._send(action.batch)
            elif isinstance(action, Answer):
                self._answer(action.entries, action.outputs, action.method)
            elif isinstance(action, WakeAt):
                self._schedule_wake(action.when)
            elif isinstance(action, Expire):
                _fail_all(action.entries, QueryExpired(f"model {self.name!r}: {action.reason}"))
            elif isinstance(action, Fail):
                _fail_all(action.entries, _failure(action))
            else:
                self._apply_rare(action)

    def _apply_rare(self, action: Action) -> None:
        if isinstance(action, Late):
            self._cache_late(action.entries, action.outputs)
        elif isinstance(action, Redundant):
            self.metrics.redundant_task(self.name, action.kind)
        elif isinstance(action, Located):
            replica = self.replicas[action.rid]
            self.metrics.byzantine(self.name, f"{replica.pool}/{replica.index}")
        elif isinstance(action, CodingFailed):
            log.warning("model %s: %s", self.name, action.message)

    def _send(self, batch: InflightBatch) -> None:
        """Send a batch to its replica; a replica that cannot be reached gives it back."""
        task, rid = batch.task, batch.replica.rid
        desc, frames = wire.pack_payload(task.payload)
        try:
            self.link.send(rid, {"t": wire.PREDICT, "bid": batch.bid, "in": desc}, frames)
        except WorkerError:
            self._apply(self.machine.send_failed(batch, self.clock()))
            return
        rows = task.rows
        self.metrics.batch(self.name, rows)
        self.metrics.set_inflight(self.name, rid, rows)
        for entry in task.entries:
            self.metrics.queue_time(self.name, batch.sent_at - entry.enqueued_at)

    def _answer(self, entries: Sequence[Entry[Query]], outputs: Sequence[Any],
                method: str | None) -> None:
        now = self.clock()
        for entry, output in zip(entries, outputs, strict=False):
            future = entry.item.handle
            if not future.done():
                if method is not None:
                    self.rebuilt[future] = method
                future.set_result(_own(output))
                self.metrics.model_latency(self.name, now - entry.enqueued_at)
        if method is not None and entries:
            self.metrics.reconstructed(self.name, method, len(entries))

    def _cache_late(self, entries: Sequence[Entry[Query]], outputs: Sequence[Any]) -> None:
        """A prediction arriving after its query was rebuilt goes to the cache, not the client."""
        for entry, output in zip(entries, outputs, strict=False):
            if entry.item.key is not None:
                value = _own(output)
                self.cache.put(entry.item.key, (value,), _nbytes(value))

    def _schedule_wake(self, wake_at: float) -> None:
        """The one loop timer: the scheduler only ever asks for an earlier one."""
        if self._wake is not None:
            self._wake.cancel()
        delay = max(0.0, wake_at - self.clock())
        self._wake = asyncio.get_running_loop().call_later(delay, self._on_wake)
        self._wake_at = wake_at

    # ---- state ---------------------------------------------------------------------------
    def ready_replicas(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.state == ReplicaState.READY]

    def has_capacity(self) -> bool:
        """True while some model replica is serving or about to (so waiting makes sense)."""
        return any(r.state in (ReplicaState.READY, ReplicaState.STARTING) and r.pool == DATA_POOL
                   for r in self.replicas.values())

    def replica_stats(self) -> list[ReplicaStats]:
        return [ReplicaStats(r.rid, r.index, r.state, getattr(r, "pid", None),
                             len(r.batch.entries) if r.batch else 0, r.served,
                             r.aimd.max_batch_size, r.pool, r.located, r.round_trip_s,
                             r.worker_s, getattr(r, "threads", None))
                for r in self.replicas.values()]

    def fail_all(self, reason: str) -> None:
        """Answer every queued and in-flight query with an error (shutdown)."""
        error = WorkerError(reason)
        for action in self.machine.shutdown():
            if isinstance(action, Abort):
                _fail_all(action.entries, error)
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None


def _fail_all(entries: Sequence[Entry[Query]], error: Exception) -> None:
    for entry in entries:
        future = entry.item.handle
        if not future.done():
            future.set_exception(error)
            future.exception()  # mark retrieved: the waiter may already have answered by deadline


def _failure(action: Fail) -> Exception:
    """A failed query's error: its input's problem (400) when the model raised a ValueError
    or TypeError on it alone, else the model's (core/isolation.py found which rows)."""
    if action.bad_input:
        return InvalidInput(f"{action.error} (the model raised on this input alone)")
    return PredictError(action.error)


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


# What a prediction-cache entry holds beyond its value: the key (a 3-tuple and a 16-byte
# digest), the ring's dict slot and node, the slot object and the 1-tuple around the value;
# 250-290 bytes by tracemalloc on CPython 3.11 (tests/unit/runtime/modelpath/
# test_cache_accounting.py). Counted as 64 before, with an array's data but not its object,
# so a 4-float row counted 80 bytes and held 375: server.cache_bytes let ~5x itself live.
_ENTRY_BYTES = 288


def _nbytes(value: Any) -> int:
    """What caching ``value`` costs, bookkeeping included: ``server.cache_bytes`` bounds this."""
    if isinstance(value, np.ndarray | str | bytes):  # getsizeof has the data (an array:
        return _ENTRY_BYTES + sys.getsizeof(value)  # its own copy, ``_own``) or characters
    return _ENTRY_BYTES + sys.getsizeof(value) + len(repr(value))  # repr: what it nests
