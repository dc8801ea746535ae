"""Redundancy in the serving path: what each mode sends, and what it does with the answers.

``ModelPath`` (``dispatch.py``) forms batches from its deadline queue; a ``Redundancy``
decides what else goes out with each batch and how results settle queries:

* ``none`` / ``equal-resources``: the batch alone (equal-resources just has more replicas).
* ``replication(d)``: the same task is queued for d - 1 more replicas; the first answer wins.
* ``reactive(timeout)``: a task still unanswered after the timeout is queued once more.
* ``parm``: each batch joins a coding group right after it is sent; a full (or timed-out)
  group's parity batches go to the parity models' own replicas; a group decodes its missing
  batch as soon as it can (``core/redundancy.py`` decides when).
* ``berrut`` / ``systematic-berrut``: K batches are formed at once and coded into one task
  per replica of the group; outputs are decoded (or, systematic, taken as they are).

The decisions (when a group can decode, what to decode) are pure code in
``core/redundancy.py``; this module only sends tasks and settles futures.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from parityserve.config import Deployment
from parityserve.core.coding import BerrutCode, LinearCode, SystematicBerrut
from parityserve.core.deadline_queue import Entry
from parityserve.core.redundancy import (
    BerrutGroup,
    Decoded,
    ParmGroup,
    SystematicGroup,
    split_even,
    take_task,
)
from parityserve.errors import CodingError, PredictError

if TYPE_CHECKING:
    from parityserve.runtime.dispatch import InflightBatch, ModelPath, Query, Replica, Task

__all__ = ["GroupRun", "Redundancy", "make_redundancy", "parity_pool"]

log = logging.getLogger(__name__)


def parity_pool(j: int) -> str:
    return f"parity{j}"


class GroupRun:
    """A coding group in flight: the pure group plus which queries and replicas it covers."""

    def __init__(self, core: Any, mode: str) -> None:
        self.core = core
        self.mode = mode
        self.entries: dict[int, list[Entry[Query]]] = {}  # data slot -> its queries
        self.workers: dict[int, str] = {}  # coded slot -> replica that served it
        # Replicas that took a task of this group: one replica must not serve two of them,
        # or a single Byzantine (or slow) replica would count as two.
        self.assigned: set[str] = set()
        self.tasks: list[Task] = []
        self.error: str | None = None
        self.finished = False

    def needs(self, task: Task) -> bool:
        """A group keeps wanting tasks while any of its queries waits for an answer."""
        if self.finished:
            return False
        pending = any(not e.item.future.done() for es in self.entries.values() for e in es)
        if task.kind == "data":
            # An original is still useful after its own queries were rebuilt? No: drop it.
            return any(not e.item.future.done() for e in task.entries) or (
                pending and self.mode == "parm")
        return pending

    def unanswered(self) -> list[Entry[Query]]:
        return [e for es in self.entries.values() for e in es if not e.item.future.done()]


class Redundancy:
    """``none``: each formed batch is one task; subclasses add copies, parities, codes."""

    mode = "none"
    batches_per_dispatch = 1  # batches formed at once (K for the Berrut modes)

    def __init__(self, path: ModelPath) -> None:
        self.path = path
        self.pending: dict[str, deque[Task]] = {}

    # ---- what idle replicas pull -----------------------------------------------------------
    def next_task(self, pool: str, rid: str) -> Task | None:
        """The first queued task of ``pool`` still needed that replica ``rid`` may take."""
        queue = self.pending.get(pool)
        return take_task(queue, rid) if queue else None

    def push(self, task: Task, *, front: bool = False) -> None:
        # Into the queues idle replicas pull from now: after ``set_redundancy`` this mode's
        # own tasks (a re-issue, a retry, an old group's parity) go to the new mode's queues.
        target = self.queues
        if target is not self.pending and not _pool_deployed(self.path, task.pool):
            return  # a parity pool the new mode no longer has: its group decodes without it
        queue = target.setdefault(task.pool, deque())
        if front:
            queue.appendleft(task)
        else:
            queue.append(task)

    def has_pending(self, pool: str) -> bool:
        return bool(self.pending.get(pool))

    @property
    def queues(self) -> dict[str, deque[Task]]:
        """The queued tasks of the path's current mode (this one's until it is replaced)."""
        current = getattr(self.path, "redundancy", None)
        return self.pending if current is None else current.pending

    # ---- formed batches --------------------------------------------------------------------
    def dispatch(self, replica: Replica, entries: list[Entry[Query]], now: float) -> None:
        """Send a freshly formed batch (and whatever else the mode sends with it)."""
        self.path.send_task(replica, self.path.new_task(entries), now)

    # ---- results ---------------------------------------------------------------------------
    def on_output(self, batch: InflightBatch, outputs: list[Any]) -> None:
        task = batch.task
        first = not task.done
        task.done = True
        self.path.settle(task.entries, outputs, late=not first)

    def on_error(self, batch: InflightBatch, error: Exception) -> None:
        task = batch.task
        if task.running > 0 or (task.pool != "data" or task.kind != "data"):
            return  # another copy is still working on it
        for entry in task.entries:
            _fail(entry.item.future, error)

    def take_back(self, task: Task) -> int:
        """A replica holding ``task`` failed: requeue it; returns how many queries went back."""
        if task.group is None and task.kind == "data" and task.running == 0 and not task.done:
            self.path.requeue(task.entries)
            return len(task.entries)
        if task.needed() and task.running == 0:
            self.push(task, front=True)
            return len(task.entries)
        return 0


class Replication(Redundancy):
    mode = "replication"

    def __init__(self, path: ModelPath, copies: int) -> None:
        super().__init__(path)
        self.copies = copies

    def dispatch(self, replica: Replica, entries: list[Entry[Query]], now: float) -> None:
        task = self.path.new_task(entries)
        self.path.send_task(replica, task, now)
        for _ in range(self.copies - 1):
            self.push(task)
            self.path.metrics.redundant_task(self.path.name, "copy")

    def take_back(self, task: Task) -> int:
        if task.needed() and task.running == 0:
            self.push(task, front=True)
            return len(task.entries)
        return 0

    def on_error(self, batch: InflightBatch, error: Exception) -> None:
        task = batch.task
        if task.running == 0 and not any(t is task for t in self.queues.get("data", ())):
            for entry in task.entries:
                _fail(entry.item.future, error)


class Reactive(Replication):
    """Re-issue a task to another replica when it has not answered within the timeout."""

    mode = "reactive"

    def __init__(self, path: ModelPath, timeout_s: float) -> None:
        super().__init__(path, 1)
        self.timeout_s = timeout_s

    def dispatch(self, replica: Replica, entries: list[Entry[Query]], now: float) -> None:
        task = self.path.new_task(entries)
        self.path.send_task(replica, task, now)
        asyncio.get_running_loop().call_later(self.timeout_s, self._reissue, task)

    def _reissue(self, task: Task) -> None:
        if task.needed():
            self.push(task)
            self.path.metrics.redundant_task(self.path.name, "reissue")
            self.path.pump()


class Parm(Redundancy):
    """ParM: batches join coding groups after they are sent; parity tasks go to parity pools."""

    mode = "parm"

    def __init__(self, path: ModelPath, deployment: Deployment) -> None:
        super().__init__(path)
        parity = deployment.parity
        assert parity is not None
        if parity.coefficients is not None:
            self.code = LinearCode(parity.coefficients)
        elif parity.r == 1:
            self.code = LinearCode.addition(parity.k)
        else:
            self.code = LinearCode.default(parity.k, parity.r)
        self.encoder = parity.encoder
        self.grace_s = parity.timeout_ms / 1000 if parity.timeout_ms is not None else None
        self.group_wait_s = parity.group_wait_ms / 1000
        self.open: GroupRun | None = None
        self._closer: asyncio.TimerHandle | None = None

    def dispatch(self, replica: Replica, entries: list[Entry[Query]], now: float) -> None:
        task = self.path.new_task(entries)
        if not self.path.send_task(replica, task, now):
            return  # requeued: the batch was never sent, so it joins no group
        self._join(task, now)

    def _join(self, task: Task, now: float) -> None:
        if not isinstance(task.payload, np.ndarray):
            return  # lists of Python objects cannot be coded; they go unprotected
        run = self.open
        if run is None:
            run = self.open = GroupRun(ParmGroup(self.code, self.encoder, self.grace_s), "parm")
            loop = asyncio.get_running_loop()
            self._closer = loop.call_later(self.group_wait_s, self._close_open)
        task.group, task.slot = run, run.core.add(task.payload, now)
        run.entries[task.slot] = task.entries
        run.tasks.append(task)
        if run.core.full:
            self._close_open()

    def _close_open(self) -> None:
        run, self.open = self.open, None
        if self._closer is not None:
            self._closer.cancel()
            self._closer = None
        if run is None:
            return
        try:
            parities = run.core.close()
        except CodingError as exc:
            log.warning("model %s: could not encode a coding group: %s", self.path.name, exc)
            run.finished = True
            return
        for j, payload in enumerate(parities):
            task = self.path.new_task([], payload=payload, pool=parity_pool(j), kind="parity")
            task.group, task.slot = run, j
            run.tasks.append(task)
            self.push(task)
            self.path.metrics.redundant_task(self.path.name, "parity")
        self.path.pump()

    def on_output(self, batch: InflightBatch, outputs: list[Any]) -> None:
        task = batch.task
        run: GroupRun | None = task.group
        if task.kind == "data":
            super().on_output(batch, outputs)
        if run is None or run.finished:
            return
        stacked = _stack(outputs)
        if stacked is None:
            run.finished = True  # outputs that are not arrays cannot be decoded
            return
        if task.kind == "parity":
            run.core.arrive_parity(task.slot, stacked)
        else:
            run.core.arrive(task.slot, stacked)
        self._try_decode(run)

    def on_error(self, batch: InflightBatch, error: Exception) -> None:
        task = batch.task
        run: GroupRun | None = task.group
        if run is None:
            super().on_error(batch, error)
            return
        run.error = str(error)
        if run.core.decision(self.path.clock()) is None:  # else a decode is due or scheduled
            self._fail_if_stuck(run, error)

    def _try_decode(self, run: GroupRun) -> None:
        decision = run.core.decision(self.path.clock())
        if isinstance(decision, float):
            delay = max(0.0, decision - self.path.clock())
            asyncio.get_running_loop().call_later(delay, self._try_decode, run)
            return
        if not decision:
            # Finished only once closed: a batch that answers before the next one joins must
            # not end the group, or the later batch joins a finished group, its parity is
            # never sent and a crash of its replica loses its queries.
            if not run.core.missing() and run.core.closed:
                run.finished = True
            elif run.error is not None and run.core.closed:
                # A task failed earlier and the last one has now answered without making the
                # group decodable: nothing left can answer the missing batches.
                self._fail_if_stuck(run, PredictError(run.error))
            return
        try:
            decoded = run.core.decode(decision)
        except CodingError as exc:
            log.warning("model %s: decoding failed: %s", self.path.name, exc)
            return
        self.path.deliver_decoded(run, decoded)
        run.finished = not run.core.missing()

    def _fail_if_stuck(self, run: GroupRun, error: Exception) -> None:
        if all(t.done or (t.running == 0 and not self._queued(t)) for t in run.tasks):
            for entry in run.unanswered():
                _fail(entry.item.future, error)
            run.finished = True

    def _queued(self, task: Task) -> bool:
        return any(t is task for t in self.queues.get(task.pool, ()))


class Berrut(Redundancy):
    """ApproxIFER (and its systematic variant): K batches coded at once onto the replicas."""

    def __init__(self, path: ModelPath, deployment: Deployment) -> None:
        super().__init__(path)
        cfg = deployment.redundancy
        self.mode = cfg.mode
        self.systematic = cfg.mode == "systematic-berrut"
        self.K, self.S, self.E = cfg.K, cfg.S, cfg.E
        self.batches_per_dispatch = cfg.K
        self._make: Callable[[], Any] = (
            (lambda: SystematicGroup(SystematicBerrut(cfg.K, cfg.S))) if self.systematic
            else (lambda: BerrutGroup(BerrutCode(cfg.K, cfg.S, cfg.E, cfg.workers))))

    def dispatch(self, replica: Replica, entries: list[Entry[Query]], now: float) -> None:
        chunks = split_even(entries, self.K)
        payloads = [self.path.assemble(c) for c in chunks]
        if not all(isinstance(p, np.ndarray) for p in payloads):
            for chunk in chunks:  # lists of Python objects cannot be coded: send them plainly
                self.push(self.path.new_task(chunk))
            self.path.pump()
            return
        run = GroupRun(self._make(), self.mode)
        try:
            coded = run.core.encode(payloads)
        except CodingError as exc:
            log.warning("model %s: could not encode a Berrut group (%s); sending it uncoded",
                        self.path.name, exc)
            for chunk in chunks:
                self.push(self.path.new_task(chunk))
            self.path.pump()
            return
        run.entries = dict(enumerate(chunks))
        if self.systematic:
            for slot, (chunk, payload) in enumerate(zip(chunks, payloads, strict=True)):
                self._add(run, self.path.new_task(chunk, payload=payload), slot)
        for i, payload in enumerate(coded):
            self._add(run, self.path.new_task([], payload=payload, kind="coded"), i)
            self.path.metrics.redundant_task(self.path.name, "coded")
        self.path.pump()

    def _add(self, run: GroupRun, task: Task, slot: int) -> None:
        task.group, task.slot = run, slot
        run.tasks.append(task)
        self.push(task)

    def on_output(self, batch: InflightBatch, outputs: list[Any]) -> None:
        task = batch.task
        run: GroupRun | None = task.group
        if task.kind == "data":
            super().on_output(batch, outputs)
        if run is None or run.finished:
            return  # run is None: a batch that could not be coded, sent plainly
        stacked = _stack(outputs)
        if stacked is None:
            run.finished = True
            return
        core = run.core
        if task.kind == "coded":
            run.workers[task.slot] = batch.replica.rid
            if self.systematic:
                core.arrive_coded(task.slot, stacked)
            else:
                core.arrive(task.slot, stacked)
        else:
            core.arrive(task.slot, stacked)
        if self.systematic and not core.missing():
            run.finished = True
            return
        if core.ready():
            self._decode(run)
        if not run.finished and run.error is not None:
            self._fail_if_stuck(run, PredictError(run.error))

    def _decode(self, run: GroupRun) -> None:
        try:
            decoded: Decoded = run.core.decode()
        except CodingError as exc:
            log.warning("model %s: Berrut decoding failed: %s", self.path.name, exc)
            run.error = str(exc)
            return
        for slot in decoded.suspected:
            self.path.located(run.workers.get(slot))
        self.path.deliver_decoded(run, decoded)
        run.finished = True

    def on_error(self, batch: InflightBatch, error: Exception) -> None:
        run: GroupRun | None = batch.task.group
        if run is None:
            super().on_error(batch, error)  # a batch that could not be coded, sent plainly
            return
        run.error = str(error)
        self._fail_if_stuck(run, error)

    def _fail_if_stuck(self, run: GroupRun, error: Exception) -> None:
        """Fail the group's unanswered queries once no task of it runs or waits to run."""
        if all(t.done or t.running == 0 for t in run.tasks) and not any(
                t.needed() for q in self.queues.values() for t in q if t.group is run):
            for entry in run.unanswered():
                _fail(entry.item.future, error)
            run.finished = True


def make_redundancy(path: ModelPath, deployment: Deployment) -> Redundancy:
    cfg = deployment.redundancy
    if cfg.mode == "replication":
        return Replication(path, cfg.d)
    if cfg.mode == "reactive":
        assert cfg.timeout_ms is not None
        return Reactive(path, cfg.timeout_ms / 1000)
    if cfg.mode == "parm":
        return Parm(path, deployment)
    if cfg.mode in ("berrut", "systematic-berrut"):
        return Berrut(path, deployment)
    return Redundancy(path)  # none, equal-resources


def _pool_deployed(path: ModelPath, pool: str) -> bool:
    """Whether replicas of ``pool`` serve under the path's current deployment."""
    if pool == "data":
        return True
    deployment = path.deployment
    parity = deployment.parity if deployment.redundancy.mode == "parm" else None
    return parity is not None and pool in {parity_pool(j) for j in range(parity.r)}


def _stack(outputs: list[Any]) -> np.ndarray | None:
    try:
        stacked = np.stack([np.asarray(o) for o in outputs])
    except (ValueError, TypeError):
        return None
    return stacked if np.issubdtype(stacked.dtype, np.number) else None


def _fail(future: asyncio.Future[Any], error: Exception) -> None:
    if not future.done():
        future.set_exception(error if isinstance(error, Exception) else PredictError(str(error)))
        future.exception()
