"""The run form of the stateful operator API, and the one driver of both forms (re-exported
by ``parityserve.models.stateful``).

```python
class MyOperator:
    def initialize(self) -> dict[str, Tensor]: ...   # the state tensors, by name
    def run(self, batch, state, event) -> outputs:   # reads; event.wait(); then writes
```

This is the paper's ``run(inputs, event)`` (HAMS §V). The state is passed in, as to
``compute`` and ``update``, rather than held by the operator: the runtime owns the dict that
it copies, installs on a backup and rolls back, so the operator cannot drift to another
one, and a run-form and a three-method operator see the same arguments.

``event`` is the very copy-done gate the three-method form's update waits on (a
``CopyGate``): ``event.wait()`` returns once the previous state's copy is done, and raises
``StateCopyTimeout`` when the runtime's time limit runs out (it never returns False: an
operator that ignored the result would write during the copy). Everything before the wait
must only read the state; the writes come after it.

**The trade-off.** ``run`` returns its outputs after its writes, so under ``hams`` they
leave after the update; ``compute``/``update`` lets them leave before it (HAMS's early
release). Choose the run form when splitting the model in two is awkward.

**The guard.** A run-form operator that writes before ``event.wait()``, or writes without
ever calling it, can be copied half-updated: the backup would install a state that never
existed on the primary. The runtime cannot see that cheaply (it would compare the whole
state on every batch); ``writes_before_event(op, batch, state)`` does, for a test.

**Exceptions.** One raised before ``event.wait()`` fails the batch alone (nothing was
written). One raised after it may leave the state half written, so the serving primary
stops and its backup, which holds the last whole state, takes over: validate the batch
before waiting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol, cast

from parityserve.models._stateful_base import (
    State,
    StateCopyTimeout,
    StatefulOperator,
    changed_since,
    snapshot,
)

__all__ = ["AnyStatefulOperator", "CopyDone", "CopyGate", "EventStatefulOperator", "drive",
           "has_stages", "run_batch", "writes_before_event"]


class CopyDone(Protocol):
    """What a run-form operator waits on before writing (a ``CopyGate`` when served)."""

    def wait(self, timeout: float | None = None) -> bool: ...


class EventStatefulOperator(Protocol):
    def initialize(self) -> State: ...

    def run(self, batch: Any, state: State, event: CopyDone) -> Any: ...


AnyStatefulOperator = StatefulOperator | EventStatefulOperator


class CopyGate:
    """The copy-done gate for one batch: ``wait()`` returns once ``copied`` is set, or raises
    ``StateCopyTimeout`` after ``timeout_s``. Once open it holds ``lock`` (if any) until the
    ``with`` block ends, so the worker's "write + number the batch" stays one step that no
    state copy can split (the worker's state thread takes the same lock to copy).

    ``while_waiting`` runs every ``every_s`` of the wait: a graph member's heartbeat, so that
    a primary held here by a slow copy is seen waiting, not silent (the frontend suspects a
    primary silent while it holds a batch: ``hams_watch``'s data path)."""

    def __init__(self, copied: threading.Event, timeout_s: float | None = None,
                 lock: threading.Lock | None = None,
                 while_waiting: Callable[[], None] | None = None, every_s: float = 0.025
                 ) -> None:
        self._copied, self._timeout_s, self._lock = copied, timeout_s, lock
        self._while_waiting, self._every_s = while_waiting, every_s
        self.opened = False

    def wait(self, timeout: float | None = None) -> bool:
        """True once the write may start; a ``timeout`` shorter than the runtime's wins."""
        if self.opened:
            return True
        limit = _shorter(timeout, self._timeout_s)
        if not self._wait_copied(limit):
            raise StateCopyTimeout(f"no copy-done signal within {limit} s; the write must "
                                   "not run (state unchanged)")
        if self._lock is not None:
            self._lock.acquire()
        self.opened = True
        return True

    def _wait_copied(self, limit: float | None) -> bool:
        if self._while_waiting is None:
            return self._copied.wait(limit)
        deadline = None if limit is None else time.monotonic() + limit
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if self._copied.wait(self._every_s if left is None
                                 else max(0.0, min(self._every_s, left))):
                return True
            if left is not None and left <= self._every_s:
                return False
            self._while_waiting()

    def __enter__(self) -> CopyGate:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.opened and self._lock is not None:
            self._lock.release()


def _shorter(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def has_stages(op: object) -> bool:
    """True for the three-method form. An operator with both forms is driven by this one:
    its outputs can leave before the update."""
    return callable(getattr(op, "compute", None)) and callable(getattr(op, "update", None))


def drive(op: AnyStatefulOperator, batch: Any, state: State, gate: CopyGate,
          early: Callable[[Any], None] | None = None,
          wrote: Callable[[Any], None] | None = None) -> Any:
    """One batch through either form, the write gated on ``gate``; the outputs. ``gate`` is
    open when this returns. ``early`` gets the outputs once, as soon as they exist: before
    the write in the three-method form, after it in the run form. ``wrote`` gets the
    three-method form's ``pending`` after its update (it may declare what was written)."""
    if has_stages(op):
        staged = cast(StatefulOperator, op)
        outputs, pending = staged.compute(batch, state)
        if early is not None:
            early(outputs)
        gate.wait()
        staged.update(state, pending)
        if wrote is not None:
            wrote(pending)
        return outputs
    outputs = cast(EventStatefulOperator, op).run(batch, state, gate)
    if early is not None:
        early(outputs)
    # A run that wrote nothing may never have waited; the caller's next step (the worker
    # numbers the batch for the next copy) must still come after the previous copy.
    gate.wait()
    return outputs


def run_batch(op: AnyStatefulOperator, batch: Any, state: State, may_update: threading.Event,
              timeout_s: float | None = None) -> Any:
    """One batch of either form, writing only once ``may_update`` is set (``StateCopyTimeout``
    after ``timeout_s``, nothing written); the outputs."""
    with CopyGate(may_update, timeout_s) as gate:
        return drive(op, batch, state, gate)


class _Probe:
    """An open gate that notes the state tensors changed before it was first waited on."""

    def __init__(self, state: State) -> None:
        self.state, self.before = state, snapshot(state)
        self.early: list[str] | None = None

    def wait(self, timeout: float | None = None) -> bool:
        if self.early is None:
            self.early = changed_since(self.before, self.state)
        return True


def writes_before_event(op: EventStatefulOperator, batch: Any, state: State) -> list[str]:
    """The state tensors ``op.run`` changed before it waited on its event (it must change
    none), or at all if it never waited. Runs the batch for real: ``state`` ends updated."""
    probe = _Probe(state)
    op.run(batch, state, probe)
    return probe.early if probe.early is not None else changed_since(probe.before, state)
