"""The frontend's graph router: every operator's request manager, plus the output commit.

All operator-to-operator traffic passes through the frontend in parityserve, so the router
is where lineage is recorded (one ``RequestManager`` per operator), where a join waits for
all its inputs of one client request, and where replies wait until durable. A failover plan
is applied here to every manager at once.

The driver (asyncio runtime, or a test's simulator) dispatches ``batch(op, n)`` to the op's
worker, reports outputs with ``output``, and durability notices with ``notify``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

from parityserve.core.hams.durability import Held, OutputCommit
from parityserve.core.hams.lineage import FRONTEND, Lineage, client_of, merge, speculative
from parityserve.core.hams.recovery import Failover
from parityserve.core.hams.requests import Arrival, Executed, RequestManager
from parityserve.core.hams.topology import Topology

__all__ = ["GraphRouter"]

P = TypeVar("P")


class GraphRouter(Generic[P]):
    def __init__(self, topology: Topology, combine: Callable[[Sequence[P]], P]) -> None:
        self.topology = topology
        self.managers: dict[str, RequestManager[P]] = {
            op: RequestManager(op) for op in topology.operators}
        self.commit: OutputCommit[P] = OutputCommit(topology.stateful)
        self.epoch = 0
        self._combine = combine
        # a join's inputs per (operator, client request), kept after the join fires: a
        # failover may void one input, and the others are not sent again
        self._joins: dict[tuple[str, int], dict[str, tuple[Lineage, int, P]]] = {}
        self._fired: set[tuple[str, int]] = set()

    def submit(self, client: int, payload: P, origin: Hashable = None) -> None:
        """A client request enters: the frontend's output ``client`` goes to every entry.
        ``origin`` names what it came in with (one HTTP request's rows share one): every
        operator's batches take turns between origins. None: the client request itself."""
        for op in self.topology.entries:
            self._deliver(op, FRONTEND, client, (), payload,
                          client if origin is None else origin)

    def batch(self, op: str, limit: int, same: Callable[[P], Hashable] | None = None
              ) -> list[Executed[P]]:
        return self.managers[op].form_batch(limit, same)

    def records(self) -> int:
        """Per-request records kept: executed requests, join parts and held replies. Each
        goes when its client request leaves the graph (answered or failed)."""
        return (sum(m.records() for m in self.managers.values()) + len(self._joins)
                + self.commit.held())

    def output(self, op: str, seq: int, payload: P) -> list[Held[P]]:
        """``op`` answered its request ``seq``. Returns client replies released now."""
        entry = self.managers[op].record(seq, payload)
        if op in self.topology.exits:
            return self.commit.offer(client_of(entry.lineage), entry.lineage, payload)
        for succ in self.topology.succs(op):
            self._deliver(succ, op, seq, entry.lineage, payload, entry.arrival.origin)
        return []

    def notify(self, op: str, seq: int) -> list[Held[P]]:
        return self.commit.notify(op, seq)

    def _deliver(self, op: str, pred: str, pred_seq: int, lineage: Lineage, payload: P,
                 origin: Hashable) -> None:
        preds = self.topology.preds[op]
        if len(preds) == 1:
            self.managers[op].offer(Arrival(lineage, ((pred, pred_seq),), payload, origin))
            return
        key = (op, pred_seq if pred == FRONTEND else client_of(lineage))
        parts = self._joins.setdefault(key, {})
        parts.setdefault(pred, (lineage, pred_seq, payload))
        if len(parts) == len(preds) and key not in self._fired:
            self._fired.add(key)
            ordered = [parts[p] for p in preds]
            self.managers[op].offer(Arrival(
                merge(lin for lin, _, _ in ordered),
                tuple((p, part[1]) for p, part in zip(preds, ordered, strict=True)),
                self._combine([pl for _, _, pl in ordered]), origin))

    def apply(self, plan: Failover) -> list[int]:
        """Roll back promoted operators, drop speculation everywhere else (H8). Returns the
        client requests whose held reply was dropped (they will be answered again)."""
        self.epoch = max(self.epoch, plan.epoch)
        rolled = set(plan.bounds)
        for op, manager in self.managers.items():
            if op in rolled:
                manager.rollback(plan.bounds[op], plan.bounds)
            else:
                manager.discard(plan.bounds)
        for key, parts in self._joins.items():
            void = [p for p, (lin, _, _) in parts.items() if speculative(lin, plan.bounds)]
            for pred in void:  # the join's arrival was speculative too, and is gone
                del parts[pred]
                self._fired.discard(key)
        return self.commit.discard_beyond(plan.bounds)

    def executed(self, op: str) -> list[Lineage]:
        """What ``op``'s primary was given (its own hop included): the plan's input. A request
        dispatched without an answer yet may have reached the state, so it counts."""
        return [e.lineage for e in self.managers[op].dispatched()]

    def held(self) -> list[Lineage]:
        return self.commit.held_lineages()

    def collect(self, client: int) -> None:
        """The reply left: garbage-collect the client request everywhere (the GC message)."""
        for manager in self.managers.values():
            manager.collect(client)
        for key in [k for k in self._joins if k[1] == client]:
            del self._joins[key]
            self._fired.discard(key)
