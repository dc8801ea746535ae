"""Redundancy modes: what each formed batch sends, and what the answers settle.

The scheduler (``machine.py``) forms batches from its deadline queue; a mode decides what
else goes out with each batch and how results settle queries:

* ``none`` / ``equal-resources``: the batch alone (equal-resources just has more replicas).
* ``replication(d)``: the same task is queued for d - 1 more replicas; the first answer wins.
* ``reactive(timeout)``: a task still unanswered after the timeout is queued once more.
* ``parm``: each batch joins a coding group right after it is sent; a full (or timed-out)
  group's parity batches go to the parity models' own pools; a group decodes its missing
  batch as soon as it can (``core/redundancy.py`` decides when).
* ``berrut`` / ``systematic-berrut``: K batches are formed at once and coded into one task
  per replica of the group; outputs are decoded (or, systematic, taken as they are).

Modes talk to the scheduler through ``Host``; time is the scheduler's ``now``, and waiting is
a scheduler timer. No I/O here: sends, answers and failures are actions the scheduler emits.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from parityserve.core.coding import BerrutCode, LinearCode, SystematicBerrut
from parityserve.core.deadline_queue import Entry
from parityserve.core.isolation import halves, split_after_failure
from parityserve.core.redundancy import (
    BerrutGroup,
    Decoded,
    ParmGroup,
    SystematicGroup,
    split_even,
    take_task,
)
from parityserve.core.scheduling.actions import Action, CodingFailed, Redundant
from parityserve.core.scheduling.pools import DATA_POOL, parity_pool, parity_pools
from parityserve.core.scheduling.records import (
    Failure,
    GroupRun,
    InflightBatch,
    Query,
    Replica,
    Task,
    TaskKind,
)
from parityserve.core.scheduling.settings import ModeSettings, ParitySettings
from parityserve.errors import CodingError

__all__ = ["Berrut", "Host", "Parm", "Reactive", "Redundancy", "Replication", "Timer",
           "make_mode"]


class Timer(Protocol):
    def cancel(self) -> None: ...


class Host(Protocol):
    """What a mode needs from its scheduler."""

    @property
    def now(self) -> float: ...

    @property
    def mode(self) -> Redundancy: ...

    def new_task(self, entries: list[Entry[Query]], *, payload: object = None,
                 pool: str = DATA_POOL, kind: TaskKind = TaskKind.DATA) -> Task: ...

    def assemble(self, entries: list[Entry[Query]]) -> object: ...

    def send(self, replica: Replica, task: Task) -> None: ...

    def pump(self) -> None: ...

    def emit(self, action: Action) -> None: ...

    def at(self, when: float, fn: Callable[[], None]) -> Timer: ...

    def settle(self, entries: list[Entry[Query]], outputs: Any) -> None: ...

    def deliver_decoded(self, run: GroupRun, decoded: Decoded) -> None: ...

    def fail(self, entries: list[Entry[Query]], error: str, *,
             bad_input: bool = False) -> None: ...

    def requeue(self, entries: list[Entry[Query]]) -> None: ...

    def located(self, rid: str | None) -> None: ...

    def group_opened(self) -> None: ...


class Redundancy:
    """``none``: each formed batch is one task; subclasses add copies, parities, codes."""

    mode = "none"
    batches_per_dispatch = 1  # batches formed at once (K for the Berrut modes)
    pools: frozenset[str] = frozenset({DATA_POOL})  # the pools whose replicas it feeds
    # How long a partial dispatch may wait for more queries (from its oldest), on top of the
    # model's delayed batching: the Berrut modes' group wait. 0: the batching rule alone.
    form_wait_s = 0.0

    def __init__(self, host: Host) -> None:
        self.host = host
        self.pending: dict[str, deque[Task]] = {}

    # ---- what idle replicas pull -----------------------------------------------------------
    def next_task(self, pool: str, rid: str) -> Task | None:
        """The first queued task of ``pool`` still needed that replica ``rid`` may take."""
        queue = self.pending.get(pool)
        return take_task(queue, rid) if queue else None

    def push(self, task: Task, *, front: bool = False) -> None:
        # Into the queues idle replicas pull from now: after a mode switch this mode's own
        # tasks (a re-issue, a retry, an old group's parity) go to the new mode's queues.
        current = self.host.mode
        if current is not self and task.pool not in current.pools:
            return  # a parity pool the new mode no longer has: its group decodes without it
        queue = current.pending.setdefault(task.pool, deque())
        if front:
            queue.appendleft(task)
        else:
            queue.append(task)

    def has_pending(self, pool: str) -> bool:
        return bool(self.pending.get(pool))

    def queued(self, task: Task) -> bool:
        return any(t is task for t in self.host.mode.pending.get(task.pool, ()))

    # ---- formed batches --------------------------------------------------------------------
    def dispatch(self, replica: Replica, entries: list[Entry[Query]]) -> None:
        """Send a freshly formed batch (and whatever else the mode sends with it)."""
        self.host.send(replica, self.host.new_task(entries))

    # ---- results ---------------------------------------------------------------------------
    def on_output(self, batch: InflightBatch, outputs: Any) -> None:
        task = batch.task
        task.done = True
        self.host.settle(task.entries, outputs)

    def on_error(self, batch: InflightBatch, failure: Failure) -> None:
        task = batch.task
        if task.running > 0 or (task.pool != DATA_POOL or task.kind != TaskKind.DATA):
            return  # another copy is still working on it
        self.isolate(task, failure)

    def isolate(self, task: Task, failure: Failure) -> None:
        """A data task failed and nothing else runs it: split it in two when the model raised
        on it, so that only the rows it raises on fail (core/isolation.py); else (or once a
        part is one row) fail its unanswered rows with the error."""
        live = [e for e in task.entries if not e.item.answered]
        level = split_after_failure(len(live), failure.raised, task.split)
        if level is None:
            self.host.fail(live, failure.error, bad_input=failure.bad_input and len(live) == 1)
            return
        task.done = True  # its halves own its rows now: no copy or re-issue runs it again
        for part in reversed(halves(live)):  # the first half ends up first in the queue
            half = self.host.new_task(part)
            half.split = level
            self.push(half, front=True)
        self.host.emit(Redundant("split"))

    def take_back(self, task: Task) -> int:
        """A replica holding ``task`` failed: requeue it; returns how many queries went back."""
        if (task.group is None and task.kind == TaskKind.DATA and task.running == 0
                and not task.done):
            self.host.requeue(task.entries)
            return len(task.entries)
        if task.needed() and task.running == 0:
            self.push(task, front=True)
            return len(task.entries)
        return 0


class Replication(Redundancy):
    mode = "replication"

    def __init__(self, host: Host, copies: int) -> None:
        super().__init__(host)
        self.copies = copies

    def dispatch(self, replica: Replica, entries: list[Entry[Query]]) -> None:
        task = self.host.new_task(entries)
        self.host.send(replica, task)
        for _ in range(self.copies - 1):
            self.push(task)
            self.host.emit(Redundant("copy"))

    def take_back(self, task: Task) -> int:
        if task.needed() and task.running == 0:
            self.push(task, front=True)
            return len(task.entries)
        return 0

    def on_error(self, batch: InflightBatch, failure: Failure) -> None:
        task = batch.task
        if task.running == 0 and not self.queued(task):
            self.isolate(task, failure)


class Reactive(Replication):
    """Re-issue a task to another replica when it has not answered within the timeout."""

    mode = "reactive"

    def __init__(self, host: Host, timeout_s: float) -> None:
        super().__init__(host, 1)
        self.timeout_s = timeout_s

    def dispatch(self, replica: Replica, entries: list[Entry[Query]]) -> None:
        task = self.host.new_task(entries)
        self.host.send(replica, task)
        self.host.at(self.host.now + self.timeout_s, lambda: self._reissue(task))

    def _reissue(self, task: Task) -> None:
        if task.needed():
            self.push(task)
            self.host.emit(Redundant("reissue"))
            self.host.pump()


def _parm_code(parity: ParitySettings) -> LinearCode:
    if parity.coefficients is not None:
        return LinearCode(parity.coefficients)
    if parity.r == 1:
        return LinearCode.addition(parity.k)
    return LinearCode.default(parity.k, parity.r)


def _parm_core(run: GroupRun) -> ParmGroup:
    assert isinstance(run.core, ParmGroup)
    return run.core


def _berrut_core(run: GroupRun) -> BerrutGroup | SystematicGroup:
    assert not isinstance(run.core, ParmGroup)
    return run.core


class Parm(Redundancy):
    """ParM: batches join coding groups after they are sent; parity tasks go to parity pools."""

    mode = "parm"

    def __init__(self, host: Host, parity: ParitySettings) -> None:
        super().__init__(host)
        self.code = _parm_code(parity)
        self.encoder = parity.encoder
        self.grace_s = parity.grace_s
        self.group_wait_s = parity.group_wait_s
        self.pools = frozenset({DATA_POOL, *parity_pools(parity.r)})
        self.open: GroupRun | None = None
        self._closer: Timer | None = None

    def dispatch(self, replica: Replica, entries: list[Entry[Query]]) -> None:
        task = self.host.new_task(entries)
        self.host.send(replica, task)
        self._join(task)

    def _join(self, task: Task) -> None:
        if not isinstance(task.payload, np.ndarray):
            return  # lists of Python objects cannot be coded; they go unprotected
        run = self.open
        if run is None:
            run = self.open = GroupRun(ParmGroup(self.code, self.encoder, self.grace_s), "parm")
            self.host.group_opened()
            self._closer = self.host.at(self.host.now + self.group_wait_s, self._close_open)
        core = _parm_core(run)
        task.group, task.slot = run, core.add(task.payload, self.host.now)
        run.entries[task.slot] = task.entries
        run.add_task(task)
        if core.full:
            self._close_open()

    def _close_open(self) -> None:
        run, self.open = self.open, None
        if self._closer is not None:
            self._closer.cancel()
            self._closer = None
        if run is None:
            return
        try:
            parities = _parm_core(run).close()
        except CodingError as exc:
            self.host.emit(CodingFailed(f"could not encode a coding group: {exc}"))
            run.finished = True
            return
        for j, payload in enumerate(parities):
            task = self.host.new_task([], payload=payload, pool=parity_pool(j),
                                      kind=TaskKind.PARITY)
            task.group, task.slot = run, j
            run.add_task(task)
            self.push(task)
            self.host.emit(Redundant("parity"))
        self.host.pump()

    def on_output(self, batch: InflightBatch, outputs: Any) -> None:
        task = batch.task
        run = task.group
        if task.kind == TaskKind.DATA:
            super().on_output(batch, outputs)
        if run is None or (stacked := _group_output(run, outputs)) is None:
            return
        if task.kind == TaskKind.PARITY:
            _parm_core(run).arrive_parity(task.slot, stacked)
        else:
            _parm_core(run).arrive(task.slot, stacked)
        self._try_decode(run)

    def on_error(self, batch: InflightBatch, failure: Failure) -> None:
        run = batch.task.group
        if run is None:
            super().on_error(batch, failure)
            return
        if _isolate_from_group(self, run, batch.task, failure):
            return
        run.error = failure.error
        if _parm_core(run).decision(self.host.now) is None:  # else a decode is due or timed
            self._fail_if_stuck(run, failure.error)

    def _try_decode(self, run: GroupRun) -> None:
        core = _parm_core(run)
        decision = core.decision(self.host.now)
        if isinstance(decision, float):
            self.host.at(decision, lambda: self._try_decode(run))
            return
        if not decision:
            # Finished only once closed: a batch that answers before the next one joins must
            # not end the group, or the later batch joins a finished group, its parity is
            # never sent and a crash of its replica loses its queries.
            if not core.missing() and core.closed:
                run.finished = True
            elif run.error is not None and core.closed:
                # A task failed earlier and the last one has now answered without making the
                # group decodable: nothing left can answer the missing batches.
                self._fail_if_stuck(run, run.error)
            return
        try:
            decoded = core.decode(decision)
        except CodingError as exc:
            self.host.emit(CodingFailed(f"decoding failed: {exc}"))
            return
        self.host.deliver_decoded(run, decoded)
        run.finished = not core.missing()

    def _fail_if_stuck(self, run: GroupRun, error: str) -> None:
        if all(t.done or (t.running == 0 and not self.queued(t)) for t in run.tasks):
            self.host.fail(run.unanswered(), error)
            run.finished = True


class Berrut(Redundancy):
    """ApproxIFER (and its systematic variant): K batches coded at once onto the replicas."""

    def __init__(self, host: Host, settings: ModeSettings) -> None:
        super().__init__(host)
        self.mode = settings.mode
        self.systematic = settings.mode == "systematic-berrut"
        self.K, self.S, self.E = settings.K, settings.S, settings.E
        self.batches_per_dispatch = settings.K
        # Every group costs K + S (or N + 1) tasks however few queries it holds; under light
        # load a group formed the moment a replica is idle holds about one query, so the
        # coded work per query is N + 1 times the plain work. Waiting a little (ParM's
        # group_wait, here before coding rather than after sending) fills groups.
        self.form_wait_s = settings.group_wait_s
        # Codes are immutable (frozen nodes): one serves every group of this mode.
        make: Callable[[], BerrutGroup | SystematicGroup]
        if self.systematic:
            systematic = SystematicBerrut(settings.K, settings.S, settings.decoder)
            make = lambda: SystematicGroup(systematic)  # noqa: E731
        else:
            code = BerrutCode(settings.K, settings.S, settings.E, settings.workers)
            make = lambda: BerrutGroup(code)  # noqa: E731
        self._make = make

    def dispatch(self, replica: Replica, entries: list[Entry[Query]]) -> None:
        chunks = split_even(entries, self.K)
        payloads = [self.host.assemble(c) for c in chunks]
        arrays = [p for p in payloads if isinstance(p, np.ndarray)]
        if len(arrays) < len(payloads):
            self._send_plainly(chunks)  # lists of Python objects cannot be coded
            return
        core = self._make()
        try:
            coded = core.encode(arrays)
        except CodingError as exc:
            self.host.emit(CodingFailed(f"could not encode a Berrut group ({exc}); "
                                        "sending it uncoded"))
            self._send_plainly(chunks)
            return
        run = GroupRun(core, self.mode, dict(enumerate(chunks)))
        self.host.group_opened()
        if self.systematic:
            for slot, (chunk, payload) in enumerate(zip(chunks, arrays, strict=True)):
                self._add(run, self.host.new_task(chunk, payload=payload), slot)
        for i, payload in enumerate(coded):
            self._add(run, self.host.new_task([], payload=payload, kind=TaskKind.CODED), i)
            self.host.emit(Redundant("coded"))
        self.host.pump()

    def _send_plainly(self, chunks: list[list[Entry[Query]]]) -> None:
        for chunk in chunks:
            self.push(self.host.new_task(chunk))
        self.host.pump()

    def _add(self, run: GroupRun, task: Task, slot: int) -> None:
        task.group, task.slot = run, slot
        run.add_task(task)
        self.push(task)

    def on_output(self, batch: InflightBatch, outputs: Any) -> None:
        task = batch.task
        run = task.group  # None: a batch that could not be coded, sent plainly
        if task.kind == TaskKind.DATA:
            super().on_output(batch, outputs)
        if run is None or (stacked := _group_output(run, outputs)) is None:
            return
        core = _berrut_core(run)
        if task.kind == TaskKind.CODED:
            run.workers[task.slot] = batch.replica.rid
        if isinstance(core, SystematicGroup):
            if task.kind == TaskKind.CODED:
                core.arrive_coded(task.slot, stacked)
            else:
                core.arrive(task.slot, stacked)
            if not core.missing():
                run.finished = True
                return
        else:
            core.arrive(task.slot, stacked)
        if core.ready():
            self._decode(run, core)
        if not run.finished and run.error is not None:
            self._fail_if_stuck(run, run.error)

    def _decode(self, run: GroupRun, core: BerrutGroup | SystematicGroup) -> None:
        try:
            decoded = core.decode()
        except CodingError as exc:
            self.host.emit(CodingFailed(f"Berrut decoding failed: {exc}"))
            run.error = str(exc)
            return
        for slot in decoded.suspected:
            self.host.located(run.workers.get(slot))
        self.host.deliver_decoded(run, decoded)
        run.finished = True

    def on_error(self, batch: InflightBatch, failure: Failure) -> None:
        run = batch.task.group
        if run is None:
            super().on_error(batch, failure)  # a batch that could not be coded, sent plainly
            return
        if _isolate_from_group(self, run, batch.task, failure):
            return
        run.error = failure.error
        run.raised = run.raised or failure.raised
        self._fail_if_stuck(run, failure.error)

    def _fail_if_stuck(self, run: GroupRun, error: str) -> None:
        """Once no task of the group runs or waits to run, its unanswered queries fail, or,
        when the model raised on a coded task (which mixes every row of the group, so no row
        can be blamed), they are sent again uncoded, where a failing batch is split."""
        if all(t.done or t.running == 0 for t in run.tasks) and not any(
                t.needed() for q in self.host.mode.pending.values() for t in q
                if t.group is run):
            run.finished = True
            if run.raised:
                chunks = [[e for e in es if not e.item.answered] for es in run.entries.values()]
                self._send_plainly([c for c in chunks if c])
            else:
                self.host.fail(run.unanswered(), error)


def _isolate_from_group(mode: Redundancy, run: GroupRun, task: Task, failure: Failure) -> bool:
    """A data task of a coding group that the model raised on: its queries leave the group
    and are split like any failed batch (True). The group must not answer them too: its
    decoder would rebuild a bad row's answer from the parity of garbage. The group goes on for
    its other batches."""
    if not failure.raised or task.kind != TaskKind.DATA:
        return False
    run.entries[task.slot] = []
    mode.isolate(task, failure)
    return True


def make_mode(host: Host, settings: ModeSettings) -> Redundancy:
    mode = settings.mode
    if mode == "replication":
        return Replication(host, settings.copies)
    if mode == "reactive":
        assert settings.reissue_after_s is not None
        return Reactive(host, settings.reissue_after_s)
    if mode == "parm":
        assert settings.parity is not None
        return Parm(host, settings.parity)
    if mode in ("berrut", "systematic-berrut"):
        return Berrut(host, settings)
    return Redundancy(host)  # none, equal-resources


def _group_output(run: GroupRun, outputs: Any) -> np.ndarray | None:
    """A member's outputs, stacked for its coding group's decoder; None once the group is
    finished, or when they are not arrays (which cannot be decoded: the group finishes)."""
    if run.finished:
        return None
    stacked = _stack(outputs)
    if stacked is None:
        run.finished = True
    return stacked


def _stack(outputs: Any) -> np.ndarray | None:
    """A batch's outputs as one numeric array (what decoders take), or None."""
    if isinstance(outputs, np.ndarray) and outputs.ndim > 0:
        stacked = outputs  # already one array, one row per output: no copy needed
    else:
        try:
            stacked = np.stack([np.asarray(o) for o in outputs])
        except (ValueError, TypeError):
            return None
    return stacked if np.issubdtype(stacked.dtype, np.number) else None
