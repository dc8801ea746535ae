"""A discrete-event simulator of one model's serving path, on the runtime's own decision code.

``runtime/dispatch.py`` and ``runtime/coding.py`` wrap pure decisions in I/O: the deadline
queue (``core/deadline_queue.py``), adaptive batching (``core/batching.py``), coding groups
and their decoders (``core/redundancy.py``, ``core/coding``) and the fault model
(``core/faults.py``). This module drives the *same* objects from a simulated clock instead
of an event loop and sockets, so a projection to hundreds of replicas exercises the very
code that serves queries: batch sizes come from ``decide_batch`` and per-replica
``AIMDController``s, ParM groups close, encode and decode through ``ParmGroup`` (on small
stand-in arrays), Berrut groups through ``BerrutGroup``/``SystematicGroup``, and every data
replica draws its fault delays, background bursts included, from its own ``FaultPlan``.

What is *not* the runtime's code is the plumbing this module mirrors by hand: the order in
which idle replicas pull work (``ModelPath.pump``), what each redundancy mode queues
(``runtime/coding.py``), and when a task is still needed. Service times come from a
``ServiceProfile`` (per batch size, an empirical distribution measured on a real worker);
a fixed ``rpc_overhead_s`` per task (the transport that holds a replica) and
``frontend_overhead_s`` per query (latency outside any queue: client, kernel, HTTP) stand for
the costs the profile does not see. With ``host_cores`` set, the frontend's CPU (a FIFO
server), the workers' compute and the load generator's CPU share that many cores.

Pure: no I/O and no wall clock; time is simulated and randomness comes from the caller's
``numpy.random.Generator``. A run is a function of (config, profile, arrivals, seed).
Not modelled: worker crashes and hangs, heartbeats and restarts, the response cache, and
Byzantine outputs (decoders see exact stand-in outputs).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from parityserve.core.batching import AIMDController, decide_batch
from parityserve.core.coding.berrut import BerrutCode, SystematicBerrut, minimum_workers
from parityserve.core.coding.parity import LinearCode
from parityserve.core.deadline_queue import DeadlineQueue, Entry
from parityserve.core.faults import FaultPlan, FaultSpec
from parityserve.core.redundancy import (
    BerrutGroup,
    Decoded,
    ParmGroup,
    SystematicGroup,
    split_even,
    take_task,
)
from parityserve.errors import CodingError, ConfigError, QueueFull

__all__ = [
    "MODES",
    "ServiceProfile",
    "SimConfig",
    "SimResult",
    "Simulator",
    "latency_percentiles",
    "simulate",
]

MODES = ("none", "equal-resources", "replication", "reactive", "parm", "berrut",
         "systematic-berrut")
DATA_POOL = "data"
FloatArray = npt.NDArray[np.float64]


# ---- service-time profiles ------------------------------------------------------------------
@dataclass(frozen=True)
class ServiceProfile:
    """Per batch size, measured service times of one model on one worker (milliseconds).

    ``sample`` draws a time for any batch size: a measured size draws from its samples; a
    size between two measured ones interpolates the two at the same quantile; a size past
    the largest extrapolates linearly in rows from the two largest sizes' medians.
    """

    model: str
    samples_ms: Mapping[int, Sequence[float]]
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.samples_ms:
            raise ConfigError("a service profile needs samples for at least one batch size")
        clean: dict[int, tuple[float, ...]] = {}
        for size, values in self.samples_ms.items():
            b = int(size)
            vals = tuple(sorted(float(v) for v in values))
            if b < 1 or not vals or not all(math.isfinite(v) and v >= 0 for v in vals):
                raise ConfigError(f"profile batch size {size}: need >= 1 finite samples >= 0")
            clean[b] = vals
        object.__setattr__(self, "samples_ms", dict(sorted(clean.items())))
        object.__setattr__(self, "_sizes", sorted(clean))
        object.__setattr__(self, "_arrays", {b: np.asarray(v) for b, v in clean.items()})

    @classmethod
    def constant(cls, ms: float, per_row_ms: float = 0.0, max_batch: int = 1) -> ServiceProfile:
        """A deterministic profile: ``ms + per_row_ms * (rows - 1)``."""
        sizes = sorted({1, max(1, max_batch)})
        return cls("constant", {b: (ms + per_row_ms * (b - 1),) for b in sizes})

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any], key: str = "samples_ms") -> ServiceProfile:
        """From ``to_mapping``'s form; ``key`` picks another sample set of the same file
        (a profile JSON may hold wall-clock ``samples_ms`` and CPU-time ``cpu_samples_ms``)."""
        samples = d.get(key)
        if not isinstance(samples, Mapping):
            raise ConfigError(f"a service profile needs a {key!r} mapping")
        return cls(str(d.get("model", "unknown")), {int(k): tuple(v) for k, v in samples.items()},
                   dict(d.get("meta", {})))

    def to_mapping(self) -> dict[str, Any]:
        return {"model": self.model, "meta": dict(self.meta),
                "samples_ms": {str(b): list(v) for b, v in self.samples_ms.items()}}

    @property
    def sizes(self) -> list[int]:
        sizes: list[int] = object.__getattribute__(self, "_sizes")
        return sizes

    def quantile_ms(self, rows: int, u: float) -> float:
        """The ``u`` quantile of the service time of a batch of ``rows`` (milliseconds)."""
        sizes = self.sizes
        rows = max(1, rows)
        if rows <= sizes[0]:
            return self._q(sizes[0], u)
        if rows >= sizes[-1]:
            top = self._q(sizes[-1], u)
            if rows == sizes[-1] or len(sizes) < 2:
                return top
            a, b = sizes[-2], sizes[-1]
            slope = max(0.0, (self._q(b, 0.5) - self._q(a, 0.5)) / (b - a))
            return top + slope * (rows - b)
        i = int(np.searchsorted(sizes, rows))
        lo, hi = sizes[i - 1], sizes[i]
        if hi == rows:
            return self._q(hi, u)
        w = (rows - lo) / (hi - lo)
        return (1 - w) * self._q(lo, u) + w * self._q(hi, u)

    def sample_s(self, rows: int, rng: np.random.Generator) -> float:
        return self.quantile_ms(rows, float(rng.random())) / 1000.0

    def median_ms(self, rows: int) -> float:
        return self.quantile_ms(rows, 0.5)

    def _q(self, size: int, u: float) -> float:
        arrays: dict[int, FloatArray] = object.__getattribute__(self, "_arrays")
        values = arrays[size]
        # An empirical draw: index by quantile (u in [0, 1)), so every sample is as likely.
        return float(values[min(len(values) - 1, int(u * len(values)))])


# ---- configuration --------------------------------------------------------------------------
@dataclass(frozen=True)
class SimConfig:
    """One deployment's serving path, as ``config.Deployment`` + application SLO describe it.

    ``faults`` maps a data-replica index (as a string) or ``"all"`` to its fault spec, like
    ``Deployment.faults``; parity replicas run fault-free, as the runtime launches them.
    """

    mode: str = "none"
    replicas: int = 1
    max_batch_size: int = 64
    max_delay_s: float = 0.0
    additive_step: int = 1
    backoff: float = 0.9
    slo_s: float = 10.0  # the application's SLO: AIMD's target and every query's deadline
    extra: int | None = None  # equal-resources
    d: int = 2  # replication
    reactive_timeout_s: float | None = None
    k: int = 2  # parm
    r: int = 1
    parity_replicas_per_model: int | None = None
    parity_timeout_s: float | None = None  # ParmGroup grace
    group_wait_s: float = 0.005
    K: int = 2  # berrut modes
    S: int = 1
    E: int = 0
    workers: int | None = None  # berrut: replicas per group (None: the minimum)
    faults: Mapping[str, FaultSpec] = field(default_factory=dict)
    rpc_overhead_s: float = 0.0  # per task: frontend -> worker -> frontend
    frontend_overhead_s: float = 0.0  # per query: latency added outside any queue
    # The frontend's own CPU, a single FIFO server: every query costs it this much before
    # it reaches the deadline queue (HTTP, JSON, application), every finished task this
    # much before its replica counts as idle again (receive, decode, settle). 0: unlimited.
    frontend_query_cpu_s: float = 0.0
    frontend_task_cpu_s: float = 0.0
    # Co-located processes: > 0 makes every worker's compute (its profiled service time plus
    # ``worker_task_cpu_s``) and the frontend's CPU work share this many cores (processor
    # sharing), as on one machine; 0 gives each process a core of its own. Fault delays and
    # ``rpc_overhead_s`` are waits, not CPU, either way.
    host_cores: float = 0.0
    worker_task_cpu_s: float = 0.0
    # The load generator's CPU per query on the same cores (``host_cores`` > 0 only), as on a
    # machine that also runs the benchmark's client: it competes with the serving processes
    # for the cores but is no step of the query's own path.
    client_query_cpu_s: float = 0.0
    max_queue: int = 1_000_000
    # An explicit background timeline, in addition to ``faults``: instance slot (data replicas
    # 0.., then parity replicas in pool order) -> (start_s, end_s, delay_s) windows; a batch
    # that starts inside a window takes ``delay_s`` longer (``bench tail``'s random pairs).
    delay_windows: Mapping[int, Sequence[tuple[float, float, float]]] = field(
        default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"unknown mode {self.mode!r}; use one of {', '.join(MODES)}")
        if self.replicas < 1:
            raise ConfigError(f"replicas must be >= 1, got {self.replicas}")
        if self.mode == "reactive" and self.reactive_timeout_s is None:
            raise ConfigError("reactive mode needs reactive_timeout_s")
        need = {"replication": self.d, "berrut": self.coded_tasks(),
                "systematic-berrut": self.coded_tasks()}.get(self.mode, 1)
        if self.replicas < need:
            raise ConfigError(f"mode {self.mode} needs at least {need} replicas, "
                              f"got {self.replicas}")
        for key in self.faults:
            if key != "all" and not (key.isascii() and key.isdigit()):
                raise ConfigError(f"fault key {key!r} must be a replica index or 'all'")

    def coded_tasks(self) -> int:
        """``config.RedundancyConfig.coded_tasks``."""
        if self.mode == "systematic-berrut":
            return self.K + self.S
        return self.workers or minimum_workers(self.K, self.S, self.E)

    def data_replicas(self) -> int:
        if self.mode != "equal-resources":
            return self.replicas
        return self.replicas + (self.extra if self.extra is not None else -(-self.replicas // 2))

    def parity_replicas(self) -> int:
        if self.mode != "parm":
            return 0
        return self.parity_replicas_per_model or max(1, -(-self.replicas // self.k))

    def instances(self) -> int:
        """Every model instance the deployment runs (data plus parity replicas)."""
        return self.data_replicas() + self.r * self.parity_replicas()

    def faults_for(self, index: int) -> FaultSpec | None:
        return self.faults.get(str(index), self.faults.get("all"))


# ---- the simulated serving path -------------------------------------------------------------
@dataclass(eq=False, slots=True)
class _Query:
    qid: int
    arrival: float
    deadline: float
    answered_at: float = math.nan
    how: str = ""  # direct | <decoding method> | expired | rejected

    @property
    def done(self) -> bool:
        return bool(self.how)


@dataclass(eq=False)
class _Group:
    core: Any
    mode: str
    entries: dict[int, list[Entry[_Query]]] = field(default_factory=dict)
    assigned: set[int] = field(default_factory=set)
    tasks: list[_Task] = field(default_factory=list)
    finished: bool = False

    def needs(self, task: _Task) -> bool:
        """``runtime.coding.GroupRun.needs``."""
        if self.finished:
            return False
        pending = any(not e.item.done for es in self.entries.values() for e in es)
        if task.kind == "data":
            return any(not e.item.done for e in task.entries) or (pending and self.mode == "parm")
        return pending


@dataclass(eq=False)
class _Task:
    payload: npt.NDArray[Any]
    entries: list[Entry[_Query]]
    pool: str = DATA_POOL
    kind: str = "data"  # data | parity | coded
    group: _Group | None = None
    slot: int = -1
    done: bool = False
    running: int = 0

    @property
    def rows(self) -> int:
        return len(self.payload)

    def needed(self) -> bool:
        """``runtime.dispatch.Task.needed``."""
        if self.done:
            return False
        if self.group is not None:
            return self.group.needs(self)
        return any(not e.item.done for e in self.entries)


@dataclass(eq=False)
class _Replica:
    rid: int
    index: int
    pool: str
    aimd: AIMDController
    plan: FaultPlan | None
    task: _Task | None = None
    windows: tuple[tuple[float, float, float], ...] = ()
    sent_at: float = 0.0
    busy_s: float = 0.0
    served: int = 0

    @property
    def idle(self) -> bool:
        return self.task is None


@dataclass(frozen=True)
class SimResult:
    """Per query (in arrival order): arrival, latency and how it was answered."""

    arrival_s: FloatArray
    latency_s: FloatArray
    how: list[str]
    counters: dict[str, int]
    utilisation: dict[str, float]
    warmup: int = 0
    sim_end_s: float = 0.0

    def measured(self) -> FloatArray:
        return self.latency_s[self.warmup:]

    def summary(self) -> dict[str, Any]:
        lat = self.measured()
        hows = self.how[self.warmup:]
        counts: dict[str, int] = {}
        for h in hows:
            counts[h] = counts.get(h, 0) + 1
        return {"n": int(lat.size), **latency_percentiles(lat),
                "mean_ms": float(lat.mean() * 1e3) if lat.size else math.nan,
                "max_ms": float(lat.max() * 1e3) if lat.size else math.nan,
                "answered": counts, "counters": dict(self.counters),
                "utilisation": dict(self.utilisation)}


def latency_percentiles(latencies_s: FloatArray) -> dict[str, float]:
    """p50 / p90 / p99 / p99.9 in ms, ``method="higher"`` as ``bench.stats.percentiles``."""
    lat = np.asarray(latencies_s, dtype=float)
    lat = lat[np.isfinite(lat)]
    keys = {"p50": 50.0, "p90": 90.0, "p99": 99.0, "p999": 99.9}
    if lat.size == 0:
        return {f"{k}_ms": math.nan for k in keys}
    values = np.percentile(lat, list(keys.values()), method="higher") * 1e3
    return {f"{k}_ms": float(v) for k, v in zip(keys, values, strict=True)}


class _Timer:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False


class Simulator:
    """The serving path of one model on a simulated clock."""

    def __init__(self, config: SimConfig, profile: ServiceProfile,
                 rng: np.random.Generator) -> None:
        self.config = config
        self.profile = profile
        self.now = 0.0
        service_rng, fault_rng = rng.spawn(2)
        self._service_rng = service_rng
        self._events: list[tuple[float, int, Callable[[], None], _Timer | None]] = []
        self._seq = itertools.count()
        self.queue: DeadlineQueue[_Query] = DeadlineQueue(config.max_queue)
        self.pending: dict[str, deque[_Task]] = {}
        self.counters: dict[str, int] = {
            "batches": 0, "rows": 0, "tasks_data": 0, "tasks_parity": 0, "tasks_coded": 0,
            "copies": 0, "reissues": 0, "groups": 0, "decodes": 0, "decode_failures": 0,
            "expired": 0, "rejected": 0}
        self._wake: _Timer | None = None
        self._wake_at = 0.0
        self._frontend_free = 0.0  # when the frontend's CPU is next free
        self.frontend_busy_s = 0.0
        self._cpu = _SharedCPU(self, config.host_cores) if config.host_cores > 0 else None
        self._frontend_fifo: deque[tuple[float, Callable[[], None]]] = deque()
        self._open: _Group | None = None
        self._closer: _Timer | None = None
        self.replicas = self._make_replicas(fault_rng)
        self.batches_per_dispatch = config.K if config.mode in ("berrut",
                                                                "systematic-berrut") else 1
        # Codes are immutable (frozen nodes): one instance serves every group, as a new one
        # per group (the runtime's way) would compute the same nodes again.
        self._berrut: Any = None
        if config.mode == "berrut":
            self._berrut = BerrutCode(config.K, config.S, config.E, config.workers)
        elif config.mode == "systematic-berrut":
            self._berrut = SystematicBerrut(config.K, config.S)
        if config.mode == "parm":
            self._code = (LinearCode.addition(config.k) if config.r == 1
                          else LinearCode.default(config.k, config.r))

    def _make_replicas(self, fault_rng: np.random.Generator) -> list[_Replica]:
        cfg = self.config
        out: list[_Replica] = []
        streams = iter(fault_rng.spawn(cfg.data_replicas()))
        for index in range(cfg.data_replicas()):
            spec = cfg.faults_for(index)
            stream = next(streams)
            # The burst timeline starts well before t = 0, so that the run begins in its
            # stationary state (some replicas already in a burst), as a long-running worker
            # is, and short runs of many replicas do not start with every replica burst-free.
            start = 0.0 if spec is None or spec.burst is None else -10 * (
                spec.burst.every_ms + spec.burst.duration_ms) / 1000
            plan = None if spec is None or spec.is_noop else FaultPlan(
                spec, stream if spec.seed is None else np.random.default_rng(spec.seed), start)
            out.append(_Replica(len(out), index, DATA_POOL, self._aimd(), plan))
        for j in range(cfg.r if cfg.mode == "parm" else 0):
            for index in range(cfg.parity_replicas()):
                out.append(_Replica(len(out), index, f"parity{j}", self._aimd(), None))
        for replica in out:
            replica.windows = tuple(sorted(cfg.delay_windows.get(replica.rid, ())))
        return out

    def _aimd(self) -> AIMDController:
        c = self.config
        return AIMDController(c.max_batch_size, c.slo_s, additive_step=c.additive_step,
                              backoff=c.backoff)

    # ---- the event loop ---------------------------------------------------------------------
    def _at(self, when: float, fn: Callable[[], None], timer: _Timer | None = None) -> None:
        heapq.heappush(self._events, (when, next(self._seq), fn, timer))

    def run(self, arrivals: Iterable[float], *, warmup: int = 0) -> SimResult:
        times = np.asarray(list(arrivals), dtype=float)
        if times.size and (np.any(np.diff(times) < 0) or times[0] < 0):
            raise ConfigError("arrival times must be non-negative and sorted")
        queries = [_Query(i, float(t), float(t) + self.config.slo_s) for i, t in enumerate(times)]
        feed = iter(queries)

        def arrive(q: _Query) -> None:
            if self._cpu is not None and self.config.client_query_cpu_s > 0:
                self._cpu.start(self.config.client_query_cpu_s, _nothing)
            if self.config.frontend_query_cpu_s > 0:
                self._on_frontend(self.config.frontend_query_cpu_s, lambda: self._submit(q))
            else:
                self._submit(q)
            nxt = next(feed, None)
            if nxt is not None:
                self._at(nxt.arrival, lambda: arrive(nxt))

        first = next(feed, None)
        if first is not None:
            self._at(first.arrival, lambda: arrive(first))
        while self._events:
            when, _, fn, timer = heapq.heappop(self._events)
            if timer is not None and timer.cancelled:
                continue
            self.now = when
            fn()
        return self._result(queries, times, warmup)

    def _result(self, queries: list[_Query], times: FloatArray, warmup: int) -> SimResult:
        slo, extra = self.config.slo_s, self.config.frontend_overhead_s
        lat = np.empty(len(queries))
        how: list[str] = []
        for i, q in enumerate(queries):
            if q.how not in ("", "expired", "rejected"):
                if q.answered_at - q.arrival + extra <= slo:
                    lat[i] = q.answered_at - q.arrival + extra
                    how.append(q.how)
                    continue
                how.append("late")  # the application answered its default at the deadline
            else:
                how.append(q.how or "unanswered")
            lat[i] = slo
        end = self.now
        util: dict[str, float] = {}
        for pool in sorted({r.pool for r in self.replicas}):
            reps = [r for r in self.replicas if r.pool == pool]
            util[pool] = sum(r.busy_s for r in reps) / (len(reps) * end) if end > 0 else 0.0
        util["frontend"] = self.frontend_busy_s / end if end > 0 else 0.0
        return SimResult(times, lat, how, dict(self.counters), util, min(warmup, len(queries)),
                         end)

    def _on_frontend(self, cost: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` once the frontend's CPU has spent ``cost`` on it, after earlier work."""
        self.frontend_busy_s += cost
        if self._cpu is not None:  # one process: FIFO, at whatever share of a core it gets
            self._frontend_fifo.append((cost, fn))
            if len(self._frontend_fifo) == 1:
                self._cpu.start(cost, self._frontend_next)
            return
        done = max(self.now, self._frontend_free) + cost
        self._frontend_free = done
        self._at(done, fn)

    def _frontend_next(self) -> None:
        _, fn = self._frontend_fifo.popleft()
        if self._frontend_fifo and self._cpu is not None:
            self._cpu.start(self._frontend_fifo[0][0], self._frontend_next)
        fn()

    # ---- queries (ModelPath.submit / _expire) -----------------------------------------------
    def _submit(self, q: _Query) -> None:
        try:
            self.queue.try_put(q, deadline=q.deadline, enqueued_at=self.now)
        except QueueFull:
            q.how, q.answered_at = "rejected", self.now
            self.counters["rejected"] += 1
            return
        self.pump()

    def _expire(self, expired: list[Entry[_Query]]) -> None:
        for entry in expired:
            if not entry.item.done:
                entry.item.how, entry.item.answered_at = "expired", self.now
                self.counters["expired"] += 1

    # ---- dispatch (ModelPath.pump / _dispatch_to / send_task) -------------------------------
    def pump(self) -> None:
        forming = True
        for replica in self.replicas:
            if not len(self.queue) and not any(self.pending.values()):
                break  # nothing left that any replica could take: the rest would all skip
            if not replica.idle:
                continue
            task = self._next_task(replica.pool, replica.rid)
            if task is not None:
                self._send(replica, task)
                continue
            if replica.pool != DATA_POOL or not forming or not len(self.queue):
                continue
            forming = self._dispatch_to(replica)

    def _dispatch_to(self, replica: _Replica) -> bool:
        now = self.now
        limit = replica.aimd.max_batch_size * self.batches_per_dispatch
        decision = decide_batch(len(self.queue), self.queue.oldest_enqueued_at(), now, limit,
                                self.config.max_delay_s)
        if not decision.dispatch:
            self._schedule_wake(decision.wake_at)
            return False
        entries, expired = self.queue.pop_batch(now, decision.size)
        self._expire(expired)
        live = [e for e in entries if not e.item.done]
        if live:
            self._dispatch(replica, live)
        elif len(self.queue):
            return self._dispatch_to(replica)
        return True

    def _schedule_wake(self, wake_at: float | None) -> None:
        if wake_at is None or (self._wake is not None and self._wake_at <= wake_at):
            return
        if self._wake is not None:
            self._wake.cancelled = True
        timer = _Timer()
        self._wake, self._wake_at = timer, wake_at

        def wake() -> None:
            self._wake = None
            self.pump()

        self._at(max(wake_at, self.now), wake, timer)

    def _next_task(self, pool: str, rid: int) -> _Task | None:
        """``Redundancy.next_task``: the first queued task still needed that ``rid`` may take."""
        queue = self.pending.get(pool)
        return take_task(queue, rid) if queue else None

    def _push(self, task: _Task) -> None:
        self.pending.setdefault(task.pool, deque()).append(task)

    def _send(self, replica: _Replica, task: _Task) -> None:
        now = self.now
        task.running += 1
        if task.group is not None:
            task.group.assigned.add(replica.rid)
        replica.task, replica.sent_at = task, now
        self.counters["batches"] += 1
        self.counters["rows"] += task.rows
        self.counters[f"tasks_{task.kind}"] += 1
        compute = self.profile.sample_s(task.rows, self._service_rng)
        wait = self.config.rpc_overhead_s
        if replica.plan is not None:
            wait += replica.plan.next_batch(now).delay_s
        for start, end, delay in replica.windows:
            if start <= now < end:
                wait += delay
                break

        def arrived() -> None:
            replica.busy_s += self.now - now
            if self.config.frontend_task_cpu_s > 0:
                self._on_frontend(self.config.frontend_task_cpu_s,
                                  lambda: self._on_result(replica, task))
            else:
                self._on_result(replica, task)

        if self._cpu is not None:  # compute on the shared cores, then the waits
            work = compute + self.config.worker_task_cpu_s
            self._cpu.start(work, lambda: self._at(self.now + wait, arrived))
        else:
            self._at(now + compute + wait, arrived)

    def _on_result(self, replica: _Replica, task: _Task) -> None:
        replica.task = None
        task.running -= 1
        replica.served += 1
        replica.aimd.observe(len(task.entries) or 1, self.now - replica.sent_at)
        self._on_output(replica, task)
        self.pump()

    def _new_task(self, entries: list[Entry[_Query]], rows: int | None = None, *,
                  pool: str = DATA_POOL, kind: str = "data") -> _Task:
        n = len(entries) if rows is None else rows
        return _Task(np.ones((max(1, n), 1), dtype=np.float32), entries, pool, kind)

    # ---- what each mode sends (runtime/coding.py) -------------------------------------------
    def _dispatch(self, replica: _Replica, entries: list[Entry[_Query]]) -> None:
        mode = self.config.mode
        if mode in ("berrut", "systematic-berrut"):
            self._dispatch_berrut(entries)
            return
        task = self._new_task(entries)
        self._send(replica, task)
        if mode == "replication":
            for _ in range(self.config.d - 1):
                self._push(task)
                self.counters["copies"] += 1
        elif mode == "reactive":
            assert self.config.reactive_timeout_s is not None
            self._at(self.now + self.config.reactive_timeout_s, lambda: self._reissue(task))
        elif mode == "parm":
            self._join(task)

    def _reissue(self, task: _Task) -> None:
        if task.needed():
            self._push(task)
            self.counters["reissues"] += 1
            self.pump()

    def _settle(self, entries: list[Entry[_Query]]) -> None:
        for entry in entries:
            if not entry.item.done:
                entry.item.how, entry.item.answered_at = "direct", self.now

    def _deliver_decoded(self, run: _Group, decoded: Decoded) -> None:
        self.counters["decodes"] += 1
        for slot in decoded.outputs:
            for entry in run.entries.get(slot, []):
                if not entry.item.done:
                    entry.item.how, entry.item.answered_at = decoded.method, self.now

    def _on_output(self, replica: _Replica, task: _Task) -> None:
        if task.kind == "data":
            task.done = True
            self._settle(task.entries)
        run = task.group
        if run is None or run.finished:
            return
        outputs = np.ones((task.rows, 1), dtype=np.float32)
        if run.mode == "parm":
            if task.kind == "parity":
                run.core.arrive_parity(task.slot, outputs)
            else:
                run.core.arrive(task.slot, outputs)
            self._try_decode(run)
            return
        core = run.core
        systematic = run.mode == "systematic-berrut"
        if task.kind == "coded":
            if systematic:
                core.arrive_coded(task.slot, outputs)
            else:
                core.arrive(task.slot, outputs)
        else:
            core.arrive(task.slot, outputs)
        if systematic and not core.missing():
            run.finished = True
            return
        if core.ready():
            try:
                decoded: Decoded = core.decode()
            except CodingError:
                self.counters["decode_failures"] += 1
                return
            self._deliver_decoded(run, decoded)
            run.finished = True

    # ---- ParM (runtime.coding.Parm) ---------------------------------------------------------
    def _join(self, task: _Task) -> None:
        run = self._open
        if run is None:
            grace = self.config.parity_timeout_s
            run = self._open = _Group(ParmGroup(self._code, "addition", grace), "parm")
            self.counters["groups"] += 1
            timer = self._closer = _Timer()
            self._at(self.now + self.config.group_wait_s, self._close_open, timer)
        task.group, task.slot = run, run.core.add(task.payload, self.now)
        run.entries[task.slot] = task.entries
        run.tasks.append(task)
        if run.core.full:
            self._close_open()

    def _close_open(self) -> None:
        run, self._open = self._open, None
        if self._closer is not None:
            self._closer.cancelled = True
            self._closer = None
        if run is None:
            return
        parities = run.core.close()
        for j, payload in enumerate(parities):
            task = _Task(np.asarray(payload), [], f"parity{j}", "parity", run, j)
            run.tasks.append(task)
            self._push(task)
        self.pump()

    def _try_decode(self, run: _Group) -> None:
        decision = run.core.decision(self.now)
        if isinstance(decision, float):
            self._at(max(decision, self.now), lambda: self._try_decode(run))
            return
        if not decision:
            if not run.core.missing() and run.core.closed:  # runtime.coding.Parm._try_decode
                run.finished = True
            return
        try:
            decoded = run.core.decode(decision)
        except CodingError:
            self.counters["decode_failures"] += 1
            return
        self._deliver_decoded(run, decoded)
        run.finished = not run.core.missing()

    # ---- Berrut (runtime.coding.Berrut) -----------------------------------------------------
    def _dispatch_berrut(self, entries: list[Entry[_Query]]) -> None:
        cfg = self.config
        systematic = cfg.mode == "systematic-berrut"
        chunks = split_even(entries, cfg.K)
        payloads = [np.ones((len(c), 1), dtype=np.float32) for c in chunks]
        core: Any = (SystematicGroup(self._berrut) if systematic
                     else BerrutGroup(self._berrut))
        run = _Group(core, cfg.mode)
        self.counters["groups"] += 1
        coded = core.encode(payloads)
        run.entries = dict(enumerate(chunks))
        if systematic:
            for slot, (chunk, payload) in enumerate(zip(chunks, payloads, strict=True)):
                self._add(run, _Task(payload, chunk), slot)
        for i, payload in enumerate(coded):
            self._add(run, _Task(np.asarray(payload), [], kind="coded"), i)
        self.pump()

    def _add(self, run: _Group, task: _Task, slot: int) -> None:
        task.group, task.slot = run, slot
        run.tasks.append(task)
        self._push(task)


def _nothing() -> None:
    """What a finished client CPU job does: it only took its share of the cores."""


class _SharedCPU:
    """Processor sharing: n runnable jobs on c cores each progress at min(1, c / n)."""

    def __init__(self, sim: Simulator, cores: float) -> None:
        self.sim = sim
        self.cores = cores
        self.jobs: dict[int, list[Any]] = {}  # id -> [remaining work s, on_done]
        self._ids = itertools.count()
        self._last = 0.0
        self._timer: _Timer | None = None

    def _rate(self) -> float:
        n = len(self.jobs)
        return 1.0 if n <= self.cores else self.cores / n

    def _advance(self) -> None:
        elapsed = self.sim.now - self._last
        if elapsed > 0 and self.jobs:
            done = elapsed * self._rate()
            for job in self.jobs.values():
                job[0] -= done
        self._last = self.sim.now

    def _reschedule(self) -> None:
        if self._timer is not None:
            self._timer.cancelled = True
            self._timer = None
        if not self.jobs:
            return
        jid = min(self.jobs, key=lambda j: (self.jobs[j][0], j))
        timer = self._timer = _Timer()
        left = max(0.0, self.jobs[jid][0]) / self._rate()
        self.sim._at(self.sim.now + left, lambda: self._finish(jid), timer)

    def start(self, work: float, on_done: Callable[[], None]) -> None:
        self._advance()
        self.jobs[next(self._ids)] = [max(0.0, work), on_done]
        self._reschedule()

    def _finish(self, jid: int) -> None:
        self._advance()
        on_done = self.jobs.pop(jid)[1]
        self._reschedule()
        on_done()


def simulate(config: SimConfig, profile: ServiceProfile, arrivals: Iterable[float],
             rng: np.random.Generator, *, warmup: int = 0) -> SimResult:
    """Run one simulation: ``arrivals`` are query arrival times in seconds, sorted."""
    return Simulator(config, profile, rng).run(arrivals, warmup=warmup)
