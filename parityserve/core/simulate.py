"""A discrete-event simulator of one model's serving path: an event heap driving the runtime's
own scheduler.

``core/scheduling`` holds one model's serving path as a sans-I/O state machine
(``Scheduler``): the deadline queue, adaptive batching (``core/batching.py``), admission's
"drop what cannot finish in time", the redundancy modes and their coding groups
(``core/redundancy.py``, ``core/coding``). The asyncio runtime (``runtime/modelpath/dispatch.py``)
drives it with sockets and a loop timer; this module drives the *same* object from a
simulated clock, so a projection to hundreds of replicas exercises the very decisions that
serve queries. Nothing of the scheduling is written here: which idle replica pulls what, what
each mode queues and when a task is still needed are all the scheduler's.

What this module adds is the world around it: service times from a ``ServiceProfile`` (per
batch size, an empirical distribution measured on a real worker) on small stand-in arrays,
every data replica's fault delays, background bursts included, from its own ``FaultPlan``,
replica crashes at set times (``SimConfig.crashes``), a fixed ``rpc_overhead_s`` per task
(the transport that holds a replica) and ``frontend_overhead_s`` per query (latency outside
any queue: client, kernel, HTTP) for the costs the profile does not see. With
``host_cores`` set, the frontend's CPU (a FIFO server), the workers' compute and the load
generator's CPU share that many cores.

Pure: no I/O and no wall clock; time is simulated and randomness comes from the caller's
``numpy.random.Generator``. A run is a function of (config, profile, arrivals, seed).
Not modelled: heartbeats and restarts, admission at submit (the queue's ``max_queue`` still
rejects), the response cache, and Byzantine outputs (decoders see exact stand-in outputs).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np
import numpy.typing as npt

from parityserve.core.batching import AIMDController
from parityserve.core.coding.berrut import minimum_workers
from parityserve.core.deadline_queue import Entry
from parityserve.core.emulation import ServiceProfile as EmulatedProfile
from parityserve.core.faults import (
    DelayDistribution,
    FaultPlan,
    FaultSpec,
    check_delay_shape,
    draw_delay,
)
from parityserve.core.scheduling import (
    DATA_POOL,
    MODES,
    Abort,
    Action,
    Answer,
    Batching,
    CodingFailed,
    Expire,
    Fail,
    InflightBatch,
    ModeSettings,
    ParitySettings,
    Query,
    Redundant,
    Replica,
    ReplicaState,
    Scheduler,
    Send,
    WakeAt,
    check_parallelism,
    parity_pools,
)
from parityserve.errors import ConfigError, QueueFull

__all__ = [
    "MODES",
    "ServiceProfile",
    "SimConfig",
    "SimResult",
    "Simulator",
    "latency_percentiles",
    "mode_settings",
    "simulate",
]

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
    def from_emulation(cls, emulated: EmulatedProfile, max_batch: int = 1,
                       points: int = 2000) -> ServiceProfile:
        """The service times an emulated-accelerator worker draws (``core.emulation``), as
        ``points`` equally likely quantiles per batch size 1..``max_batch``: the simulator
        then draws from the same distribution as the testbed's workers, without a sample's
        noise (the quantiles sit at the middle of ``points`` equal slices)."""
        if points < 1 or max_batch < 1:
            raise ConfigError("from_emulation needs points >= 1 and max_batch >= 1")
        mids = [(i + 0.5) / points for i in range(points)]
        sigma = emulated.sigma  # core.emulation.draw_service_s's lognormal, mean kept
        z = [NormalDist().inv_cdf(u) for u in mids]
        factors = [math.exp(-sigma * sigma / 2 + sigma * v) for v in z]
        samples = {b: tuple(emulated.mean_ms(b) * f for f in factors)
                   for b in range(1, max_batch + 1)}
        return cls(emulated.name, samples, {"emulation": emulated.label})

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
    berrut_group_wait_s: float = 0.0  # berrut modes: a partial group's wait for more queries
    parallelism: int | None = None  # service parallelism c (Deployment.parallelism)
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
    # How a window's delay is drawn: constant adds delay_s to every batch; exponential and
    # pareto draw each batch's own wait with mean delay_s, as the runtime's fault plans do
    # (faults.draw_delay), so a replayed testbed run keeps its slowdown's shape.
    window_distribution: DelayDistribution = "constant"
    window_tail_index: float = 2.0  # pareto only: P(wait > d) = (1 + d/s)^-a
    # Instance slot -> the time it crashes: what it holds goes back to the queue, and it
    # is not restarted.
    crashes: Mapping[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"unknown mode {self.mode!r}; use one of {', '.join(MODES)}")
        if self.replicas < 1:
            raise ConfigError(f"replicas must be >= 1, got {self.replicas}")
        try:
            check_parallelism(self.parallelism, self.mode)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if not self.berrut_group_wait_s >= 0:
            raise ConfigError(f"berrut_group_wait_s must be >= 0, got {self.berrut_group_wait_s}")
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
        check_delay_shape(self.window_distribution, self.window_tail_index, prefix="window")

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
class _Record:
    """One simulated query's fate (a ``Query``'s handle)."""

    qid: int
    arrival: float
    deadline: float
    answered_at: float = math.nan
    how: str = ""  # direct | <decoding method> | expired | failed | rejected


@dataclass(eq=False)
class _Instance:
    """What the simulator adds to a replica: its faults, delay windows and busy time."""

    replica: Replica
    plan: FaultPlan | None
    windows: tuple[tuple[float, float, float], ...] = ()
    busy_s: float = 0.0
    crash_at: float | None = None


@dataclass(frozen=True)
class SimResult:
    """Per query (in arrival order): latency and how it was answered."""

    latency_s: FloatArray
    how: list[str]
    counters: dict[str, int]
    utilisation: dict[str, float]
    warmup: int = 0

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


def mode_settings(config: SimConfig) -> ModeSettings:
    """The scheduler's settings for ``config``'s redundancy mode."""
    parity = ParitySettings(k=config.k, r=config.r, grace_s=config.parity_timeout_s,
                            group_wait_s=config.group_wait_s) if config.mode == "parm" else None
    return ModeSettings(mode=config.mode, copies=config.d,
                        reissue_after_s=config.reactive_timeout_s, parity=parity, K=config.K,
                        S=config.S, E=config.E, workers=config.workers,
                        group_wait_s=config.berrut_group_wait_s)


def _stand_in(entries: list[Entry[Query]]) -> npt.NDArray[np.float32]:
    """A batch's payload: one small row per query, enough for groups to encode and decode."""
    return np.ones((max(1, len(entries)), 1), dtype=np.float32)


class Simulator:
    """The serving path of one model on a simulated clock: an event heap driving the runtime's
    own ``Scheduler``."""

    def __init__(self, config: SimConfig, profile: ServiceProfile,
                 rng: np.random.Generator, *,
                 by_concurrency: Mapping[int, ServiceProfile] | None = None) -> None:
        self.config = config
        self.profile = profile
        # Interference (SERF): a data task started while k data tasks run, itself included,
        # draws its time from by_concurrency[k] (the largest profiled k beyond it), so service
        # is fixed by the concurrency at the start, as core/queueing's model assumes.
        self.by_concurrency = dict(sorted((by_concurrency or {}).items()))
        self.now = 0.0
        service_rng, fault_rng = rng.spawn(2)
        self._service_rng = service_rng
        # Spawned after the first two, so runs without drawn windows keep their streams.
        self._window_rng = rng.spawn(1)[0]
        self._events: list[tuple[float, int, Callable[[], None], _Timer | None]] = []
        self._seq = itertools.count()
        self.machine = Scheduler(Batching(config.max_batch_size, config.max_delay_s),
                                 mode_settings(config), slo_s=config.slo_s,
                                 max_queue=config.max_queue, assemble=_stand_in,
                                 parallelism=config.parallelism)
        self.counters: dict[str, int] = {
            "batches": 0, "rows": 0, "tasks_data": 0, "tasks_parity": 0, "tasks_coded": 0,
            "copies": 0, "reissues": 0, "groups": 0, "decodes": 0, "decode_failures": 0,
            "expired": 0, "rejected": 0}
        self._wake: _Timer | None = None
        self._frontend_free = 0.0  # when the frontend's CPU is next free
        self.frontend_busy_s = 0.0
        self._cpu = _SharedCPU(self, config.host_cores) if config.host_cores > 0 else None
        self._frontend_fifo: deque[tuple[float, Callable[[], None]]] = deque()
        self.instances = self._make_instances(fault_rng)

    def _make_instances(self, fault_rng: np.random.Generator) -> dict[str, _Instance]:
        cfg = self.config
        out: dict[str, _Instance] = {}
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
            self._add_instance(out, index, DATA_POOL, plan)
        for pool in parity_pools(cfg.r if cfg.mode == "parm" else 0):
            for index in range(cfg.parity_replicas()):
                self._add_instance(out, index, pool, None)
        return out

    def _add_instance(self, out: dict[str, _Instance], index: int, pool: str,
                      plan: FaultPlan | None) -> None:
        slot = len(out)
        c = self.config
        aimd = AIMDController(c.max_batch_size, c.slo_s, additive_step=c.additive_step,
                              backoff=c.backoff)
        replica = Replica(str(slot), index, aimd, state=ReplicaState.READY, pool=pool)
        self.machine.replicas[replica.rid] = replica
        out[replica.rid] = _Instance(replica, plan, tuple(sorted(c.delay_windows.get(slot, ()))),
                                     crash_at=c.crashes.get(slot))

    # ---- the event loop ---------------------------------------------------------------------
    def _at(self, when: float, fn: Callable[[], None], timer: _Timer | None = None) -> None:
        heapq.heappush(self._events, (when, next(self._seq), fn, timer))

    def run(self, arrivals: Iterable[float], *, warmup: int = 0) -> SimResult:
        times = np.asarray(list(arrivals), dtype=float)
        if times.size and (np.any(np.diff(times) < 0) or times[0] < 0):
            raise ConfigError("arrival times must be non-negative and sorted")
        queries = [_Record(i, float(t), float(t) + self.config.slo_s)
                   for i, t in enumerate(times)]
        feed = iter(queries)

        def arrive(q: _Record) -> None:
            if self._cpu is not None and self.config.client_query_cpu_s > 0:
                self._cpu.start(self.config.client_query_cpu_s, _nothing)
            if self.config.frontend_query_cpu_s > 0:
                self._on_frontend(self.config.frontend_query_cpu_s, lambda: self._submit(q))
            else:
                self._submit(q)
            nxt = next(feed, None)
            if nxt is not None:
                self._at(nxt.arrival, lambda: arrive(nxt))

        for instance in self.instances.values():
            if instance.crash_at is not None:
                self._at(instance.crash_at, functools.partial(self._crash, instance))
        first = next(feed, None)
        if first is not None:
            self._at(first.arrival, lambda: arrive(first))
        while self._events:
            when, _, fn, timer = heapq.heappop(self._events)
            if timer is not None and timer.cancelled:
                continue
            self.now = when
            fn()
        return self._result(queries, warmup)

    def _result(self, queries: list[_Record], warmup: int) -> SimResult:
        slo, extra = self.config.slo_s, self.config.frontend_overhead_s
        lat = np.empty(len(queries))
        how: list[str] = []
        for i, q in enumerate(queries):
            if q.how not in ("", "expired", "rejected", "failed"):
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
        instances = list(self.instances.values())
        for pool in sorted({i.replica.pool for i in instances}):
            busy = [i.busy_s for i in instances if i.replica.pool == pool]
            util[pool] = sum(busy) / (len(busy) * end) if end > 0 else 0.0
        util["frontend"] = self.frontend_busy_s / end if end > 0 else 0.0
        counters = dict(self.counters, groups=self.machine.groups,
                        decodes=self.machine.decodes)
        return SimResult(lat, how, counters, util, min(warmup, len(queries)))

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

    # ---- events into the scheduler ----------------------------------------------------------
    def _submit(self, q: _Record) -> None:
        try:
            actions = self.machine.submit(Query(None, None, q), q.deadline, self.now)
        except QueueFull:
            q.how, q.answered_at = "rejected", self.now
            self.counters["rejected"] += 1
            return
        self._apply(actions)

    def _crash(self, instance: _Instance) -> None:
        """The replica dies: what it held goes back, as the runtime's supervisor does it
        (``take_back``, then the replica is gone, then a pump). It is not restarted."""
        replica = instance.replica
        self.machine.take_back(replica)
        replica.state = ReplicaState.DEAD
        self._apply(self.machine.pump_at(self.now))

    def _on_result(self, batch: InflightBatch) -> None:
        if batch.replica.batch is not batch:
            return  # its replica died meanwhile: the work was taken back
        outputs = np.ones((batch.task.rows, 1), dtype=np.float32)  # stand-in outputs
        self._apply(self.machine.task_output(batch, outputs, self.now))

    # ---- actions out of the scheduler -------------------------------------------------------
    def _apply(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Send):
                self._send(action.batch)
            elif isinstance(action, Answer):
                self._answered(action.entries, action.method or "direct")
            elif isinstance(action, WakeAt):
                self._wake_at(action.when)
            elif isinstance(action, Expire):
                self.counters["expired"] += len(action.entries)
                self._answered(action.entries, "expired")
            elif isinstance(action, Fail | Abort):
                self._answered(action.entries, "failed")
            elif isinstance(action, Redundant):
                name = {"copy": "copies", "reissue": "reissues"}.get(action.kind)
                if name is not None:
                    self.counters[name] += 1
            elif isinstance(action, CodingFailed):
                self.counters["decode_failures"] += 1

    def _answered(self, entries: Sequence[Entry[Query]], how: str) -> None:
        for entry in entries:
            record: _Record = entry.item.handle
            record.how, record.answered_at = how, self.now

    def _wake_at(self, when: float) -> None:
        """One pending wake-up, as the runtime's one loop timer."""
        if self._wake is not None:
            self._wake.cancelled = True
        timer = self._wake = _Timer()

        def fire() -> None:
            self._wake = None
            self._apply(self.machine.tick(self.now))

        self._at(max(when, self.now), fire, timer)

    def _send(self, batch: InflightBatch) -> None:
        """Simulate the replica computing ``batch``: its result arrives after the profiled
        service time, the fault delays and the transport."""
        now, task = self.now, batch.task
        instance = self.instances[batch.replica.rid]
        rows = task.rows
        self.counters["batches"] += 1
        self.counters["rows"] += rows
        self.counters[f"tasks_{task.kind}"] += 1
        compute = self._profile_now(task.pool).sample_s(rows, self._service_rng)
        wait = self.config.rpc_overhead_s
        if instance.plan is not None:
            wait += instance.plan.next_batch(now).delay_s
        for start, end, delay in instance.windows:
            if start <= now < end:
                wait += draw_delay(self._window_rng, delay, self.config.window_distribution,
                                   self.config.window_tail_index)
                break

        def arrived() -> None:
            instance.busy_s += self.now - now
            if self.config.frontend_task_cpu_s > 0:
                self._on_frontend(self.config.frontend_task_cpu_s,
                                  lambda: self._on_result(batch))
            else:
                self._on_result(batch)

        if self._cpu is not None:  # compute on the shared cores, then the waits
            work = compute + self.config.worker_task_cpu_s
            self._cpu.start(work, lambda: self._at(self.now + wait, arrived))
        else:
            self._at(now + compute + wait, arrived)


    def _profile_now(self, pool: str) -> ServiceProfile:
        if not self.by_concurrency or pool != DATA_POOL:
            return self.profile
        running = sum(r.batch is not None for r in self.machine.replicas.values()
                      if r.pool == DATA_POOL)
        fits = [k for k in self.by_concurrency if k <= max(1, running)]
        return self.by_concurrency[fits[-1] if fits else next(iter(self.by_concurrency))]


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
             rng: np.random.Generator, *, warmup: int = 0,
             by_concurrency: Mapping[int, ServiceProfile] | None = None) -> SimResult:
    """Run one simulation: ``arrivals`` are query arrival times in seconds, sorted.
    ``by_concurrency``: service times per number of data tasks running (see Simulator)."""
    return Simulator(config, profile, rng, by_concurrency=by_concurrency).run(
        arrivals, warmup=warmup)
