"""One scripted scenario, run through both drivers of ``core/scheduling``'s ``Scheduler``: the
asyncio runtime's ``ModelPath`` (over a fake link, a fake clock and a hand-run event heap)
and the simulator's own event heap. Each returns the actions the scheduler asked for, in
order, with the time and in plain terms (query numbers, replica ids), so the two compare.

The world is the same for both: queries arrive at set times and must be answered within the
SLO; every replica computes a batch in ``SERVICE_S`` plus its fault delay; replica crashes
happen at set times (the supervisor's ``take_back``, the replica gone, a pump).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from parityserve.config import BatchingConfig, Deployment, ParityConfig, RedundancyConfig
from parityserve.core.batching import AIMDController
from parityserve.core.cache import ClockCache
from parityserve.core.faults import FaultSpec
from parityserve.core.scheduling import (
    Action,
    Answer,
    Expire,
    Fail,
    Late,
    Located,
    Redundant,
    Send,
    WakeAt,
)
from parityserve.core.simulate import ServiceProfile, SimConfig, Simulator
from parityserve.runtime.modelpath.dispatch import ModelPath, Replica
from parityserve.runtime.modelpath.metrics import Metrics
from parityserve.runtime.workers import messages
from tests.unit.runtime.modelpath.dispatch_fakes import FakeClock, FakeLink

SERVICE_S = 0.005
Step = tuple[float, tuple[Any, ...]]


def describe(action: Action, qid: Callable[[Any], int]) -> tuple[Any, ...]:
    """An action in plain terms: which queries (by number), which replica, what kind."""
    if isinstance(action, Send):
        task = action.batch.task
        return ("send", action.batch.replica.rid, str(task.kind), task.pool, task.rows,
                [qid(e.item) for e in task.entries])
    if isinstance(action, Answer):
        return ("answer", [qid(e.item) for e in action.entries], action.method)
    if isinstance(action, Expire | Fail | Late):
        return (type(action).__name__.lower(), [qid(e.item) for e in action.entries])
    if isinstance(action, WakeAt):
        return ("wake", round(action.when, 9))
    if isinstance(action, Redundant):
        return ("redundant", action.kind)
    if isinstance(action, Located):
        return ("located", action.rid)
    return (type(action).__name__.lower(),)


# ---- the scenario ------------------------------------------------------------------------
def sim_config(mode: str) -> SimConfig:
    """Three data replicas (ParM: two, and a parity replica): replica 0 slow, replica 1 dead
    early on, and more queries than fit in the SLO, so some miss their deadline."""
    options: dict[str, Any] = {
        "reactive": {"reactive_timeout_s": 0.008},
        "parm": {"k": 2, "replicas": 2},
        "replication": {"d": 2},
        "berrut": {"K": 2, "S": 1},
        "systematic-berrut": {"K": 2, "S": 1},
    }.get(mode, {})
    return SimConfig(**{"mode": mode, "replicas": 3, "max_batch_size": 2, "slo_s": 0.02,
                        "faults": {"0": FaultSpec(delay_ms=20.0)}, "crashes": {1: 0.004},
                        **options})


# A burst of 24 queries in 12 ms, then two stragglers once the queue has drained.
ARRIVALS = [0.0005 * i for i in range(24)] + [0.040, 0.041]


def deployment(config: SimConfig) -> Deployment:
    """The runtime's deployment for a simulator config (the settings ``mode_settings`` and
    the simulator's ``Batching`` read)."""
    mode = config.mode
    redundancy: dict[str, Any] = {"mode": mode}
    if mode == "replication":
        redundancy["d"] = config.d
    if mode == "reactive":
        assert config.reactive_timeout_s is not None
        redundancy["timeout_ms"] = config.reactive_timeout_s * 1000
    if mode in ("berrut", "systematic-berrut"):
        redundancy.update(K=config.K, S=config.S, E=config.E,
                          group_wait_ms=config.berrut_group_wait_s * 1000)
    parity = ParityConfig(k=config.k, r=config.r, group_wait_ms=config.group_wait_s * 1000) \
        if mode == "parm" else None
    return Deployment(
        name="m", source="zoo:echo", replicas=config.replicas,
        batching=BatchingConfig(max_batch_size=config.max_batch_size,
                                max_delay_ms=config.max_delay_s * 1000),
        redundancy=RedundancyConfig(**redundancy), parity=parity)


# ---- the simulator's event heap -------------------------------------------------------------
class _TracedSimulator(Simulator):
    def __init__(self, config: SimConfig) -> None:
        super().__init__(config, ServiceProfile.constant(SERVICE_S * 1000),
                         np.random.default_rng(0))
        self.trace: list[Step] = []

    def _apply(self, actions: list[Action]) -> None:
        self.trace += [(round(self.now, 9), describe(a, lambda q: q.handle.qid))
                       for a in actions]
        super()._apply(actions)


def through_simulator(config: SimConfig) -> list[Step]:
    sim = _TracedSimulator(config)
    sim.run(ARRIVALS)
    return sim.trace


# ---- the runtime's driver, in a hand-run world ------------------------------------------
class _TracedPath(ModelPath):
    """``ModelPath`` whose loop timer is an event of the test's heap."""

    world: _World

    def _apply(self, actions: list[Action]) -> None:
        self.world.trace += [(round(self.clock(), 9), describe(a, lambda q: int(q.item[0])))
                             for a in actions]
        super()._apply(actions)

    def _schedule_wake(self, wake_at: float) -> None:
        self.world.wake(wake_at)


class _World:
    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.clock = FakeClock(0.0)
        self.link = FakeLink()
        self.events: list[tuple[float, int, Callable[[], None], list[bool]]] = []
        self.seq = itertools.count()
        self.trace: list[Step] = []
        self._wake: list[bool] | None = None
        self.path = _TracedPath(deployment(config), link=self.link, metrics=Metrics(),
                                cache=ClockCache(0), clock=self.clock, slo_s=config.slo_s,
                                max_queue=config.max_queue)
        self.path.world = self
        self.replicas = self._replicas()
        self.sent = 0

    def _replicas(self) -> list[Replica]:
        cfg = self.config
        pools = [("data", cfg.data_replicas())]
        if cfg.mode == "parm":
            pools.append(("parity0", cfg.parity_replicas()))
        out: list[Replica] = []
        for pool, count in pools:
            for index in range(count):
                aimd = AIMDController(cfg.max_batch_size, cfg.slo_s,
                                      additive_step=cfg.additive_step, backoff=cfg.backoff)
                replica = Replica(str(len(out)), index, aimd, 0.0, state="ready", pool=pool)
                self.path.replicas[replica.rid] = replica
                out.append(replica)
        return out

    def at(self, when: float, fn: Callable[[], None], live: list[bool] | None = None) -> None:
        heapq.heappush(self.events, (when, next(self.seq), fn, live or [True]))

    def wake(self, when: float) -> None:
        """The runtime's one loop timer: a later request replaces it."""
        if self._wake is not None:
            self._wake[0] = False
        self._wake = live = [True]

        def fire() -> None:
            self._wake = None
            self.path._wake_at = when
            self.path._on_wake()

        self.at(max(when, self.clock()), fire, live)

    def delay(self, rid: str) -> float:
        spec = self.config.faults_for(int(rid))
        replica = self.path.replicas[rid]
        return spec.delay_ms / 1000 if spec is not None and replica.pool == "data" else 0.0

    def run(self) -> list[Step]:
        for slot, when in self.config.crashes.items():
            self.at(when, lambda r=self.replicas[slot]: self.crash(r))
        self.arrive(0)
        while self.events:
            when, _, fn, live = heapq.heappop(self.events)
            if live[0]:
                self.clock.now = when
                fn()
                self.watch_sends()
        return self.trace

    def arrive(self, qid: int) -> None:
        """Arrivals chain as the simulator's do: each schedules the next when it happens."""
        if qid < len(ARRIVALS):
            self.at(ARRIVALS[qid], lambda: self.submit(qid))

    def submit(self, qid: int) -> None:
        item = np.array([float(qid)], dtype=np.float32)
        deadline = ARRIVALS[qid] + self.config.slo_s
        self.path.submit(item, deadline, admitted=True)  # no admission: as the simulator
        # Each arrival is an event-loop pass of its own: its pump runs before the next event.
        self.path.pump()
        self.arrive(qid + 1)

    def crash(self, replica: Replica) -> None:
        self.path.take_back(replica)
        replica.state = "dead"
        self.path.pump()

    def watch_sends(self) -> None:
        """Every new message on the link is computed: its result comes back in time."""
        for rid, header, _ in self.link.sent[self.sent:]:
            replica = self.path.replicas[rid]
            batch = replica.batch
            assert batch is not None and batch.bid == header["bid"]
            done = self.clock() + SERVICE_S + (self.config.rpc_overhead_s + self.delay(rid))
            self.at(done, lambda r=replica, b=batch: self.result(r, b))
        self.sent = len(self.link.sent)

    def result(self, replica: Replica, batch: Any) -> None:
        if replica.batch is not batch:
            return  # its replica died meanwhile
        outputs = np.ones((batch.task.rows, 1), dtype=np.float32)
        self.path.accept_result(replica, messages.Result(batch.bid, True, outputs=outputs))


def through_runtime(config: SimConfig) -> list[Step]:
    async def body() -> list[Step]:
        return _World(config).run()

    return asyncio.run(body())


def kinds(trace: Sequence[Step]) -> set[str]:
    return {step[1][0] for step in trace}
