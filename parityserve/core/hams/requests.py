"""One operator's request manager (HAMS Alg. 1 with decisions H3, H5, H8).

In parityserve every operator-to-operator message passes through the frontend's graph
router, so the router holds one ``RequestManager`` per operator (the paper puts one in a
proxy beside each operator). What that buys: the retained outputs and the executed-request
log survive a worker crash without being shipped in every state message, and "the
predecessors resend from lineage" is a local lookup in the frontend.

The manager
* deduplicates inputs by their sources ``(pred, pred_seq)``, keeping the first copy;
* assigns contiguous sequence numbers from 1 when a batch is formed, i.e. in execution
  order (H3), not on receipt;
* keeps each executed request and its output until the frontend garbage-collects its
  client request (H5), so a recovered successor can be fed again;
* after a failover, rolls back to a promoted backup's sequence number or discards
  speculation (H8).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from parityserve.core.fair_queue import FairQueue
from parityserve.core.hams.lineage import Lineage, client_of, extend, speculative

__all__ = ["Arrival", "Executed", "RequestManager"]

P = TypeVar("P")

Sources = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Arrival(Generic[P]):
    """An input for the operator: the lineage so far, which outputs it combines, the data,
    and its origin: the client's request it came in (batches share turns between origins)."""
    lineage: Lineage
    sources: Sources
    payload: P
    origin: Hashable = None


@dataclass
class Executed(Generic[P]):
    """A request the operator was given, with its sequence number and, later, its output."""
    seq: int
    arrival: Arrival[P]
    lineage: Lineage
    output: P | None = None
    done: bool = field(default=False)


class RequestManager(Generic[P]):
    def __init__(self, op: str) -> None:
        self.op = op
        self._next_seq = 1
        # one lane per origin, taken in turns: a 1,024-row request does not put a one-row
        # request behind all of its rows (see core/fair_queue.py)
        self._queue: FairQueue[Arrival[P]] = FairQueue()
        self._keys: set[Sources] = set()
        self._log: dict[int, Executed[P]] = {}
        # each client request's sequence numbers, so that collecting one is not a scan of the
        # whole log (it was 6% of the frontend's time at batch 64); a number renumbered by a
        # rollback may still be listed under its old client, so collect checks ownership
        self._by_client: dict[int, set[int]] = {}
        self._slots: dict[Sources, int] = {}  # discarded outputs to re-execute in place (H8)

    @property
    def last_seq(self) -> int:
        return self._next_seq - 1

    def queued(self) -> int:
        return len(self._queue)

    def offer(self, arrival: Arrival[P]) -> bool:
        """Queue an input; False (and nothing changes) if these sources were seen before."""
        if arrival.sources in self._keys:
            return False
        self._keys.add(arrival.sources)
        self._queue.append(arrival.origin, arrival)
        return True

    def records(self) -> int:
        """Executed requests still kept (until their client request is collected)."""
        return len(self._log)

    def form_batch(self, limit: int, same: Callable[[P], Hashable] | None = None
                   ) -> list[Executed[P]]:
        """Take up to ``limit`` inputs, one per origin in turn (in arrival order within an
        origin), and number them as they will execute. With ``same``, only inputs whose
        ``same(payload)`` is the first one's: inputs of two shapes never share a batch (one
        would fail it)."""
        batch: list[Executed[P]] = []
        kind: Callable[[Arrival[P]], Hashable] | None = None
        if same is not None:
            kind = lambda arrival: same(arrival.payload)  # noqa: E731
        for arrival in self._queue.take(limit, kind):
            seq = self._slots.pop(arrival.sources, None) or self._take_seq()
            lineage = extend(arrival.lineage, arrival.sources, self.op, seq)
            self._log[seq] = entry = Executed(seq, arrival, lineage)
            self._by_client.setdefault(client_of(lineage), set()).add(seq)
            batch.append(entry)
        return batch

    def _take_seq(self) -> int:
        seq, self._next_seq = self._next_seq, self._next_seq + 1
        return seq

    def record(self, seq: int, output: P) -> Executed[P]:
        """Keep the output of request ``seq`` until its client request is collected."""
        entry = self._log[seq]
        entry.output, entry.done = output, True
        return entry

    def current(self, seq: int) -> Executed[P] | None:
        """The request now numbered ``seq``: a driver checks that an answer it got is for the
        entry it dispatched, since a failover may have renumbered or discarded it."""
        return self._log.get(seq)

    def dispatched(self) -> list[Executed[P]]:
        return [e for _, e in sorted(self._log.items())]

    def unanswered(self) -> list[Executed[P]]:
        """Dispatched but never answered: what a restarted stateless operator is given again,
        under the same sequence numbers."""
        return [e for _, e in sorted(self._log.items()) if not e.done]

    def retained(self, after: int = 0) -> list[Executed[P]]:
        """Executed requests with an output, beyond sequence number ``after``, in order."""
        return [e for seq, e in sorted(self._log.items()) if seq > after and e.done]

    def collect(self, client: int) -> int:
        """Forget every executed request of a client request that has left the graph."""
        gone = [seq for seq in sorted(self._by_client.pop(client, ()))
                if seq in self._log and client_of(self._log[seq].lineage) == client]
        for seq in gone:
            self._keys.discard(self._log.pop(seq).arrival.sources)
        return len(gone)

    def rollback(self, to_seq: int, bounds: Mapping[str, int]) -> None:
        """This operator's backup, holding state ``to_seq``, was promoted: what it executed
        after ``to_seq`` runs again under new numbers, except inputs that were themselves
        speculation (their upstream recomputes and sends them again)."""
        redo = [e.arrival for seq, e in sorted(self._log.items()) if seq > to_seq]
        for seq in [seq for seq in self._log if seq > to_seq]:
            del self._log[seq]
        self._next_seq = to_seq + 1
        # slots past the rollback point are renumbered too: keeping one would hand a later
        # input a number the new sequence also reaches, twice
        self._slots = {src: seq for src, seq in self._slots.items() if seq <= to_seq}
        queue = FairQueue((a.origin, a) for a in (*redo, *self._queue))
        self._drop_keys(queue.remove(lambda a: speculative(a.lineage, bounds)))
        self._queue = queue

    def discard(self, bounds: Mapping[str, int]) -> None:
        """An upstream operator rolled back: drop queued speculation, and free the executed
        slots that depended on it so that the re-sent input re-executes under its original
        sequence number (H8: downstream numbering stays contiguous)."""
        self._drop_keys(self._queue.remove(lambda a: speculative(a.lineage, bounds)))
        for seq, entry in list(self._log.items()):
            if speculative(entry.lineage, bounds):
                del self._log[seq]
                self._keys.discard(entry.arrival.sources)
                self._slots[entry.arrival.sources] = seq

    def _drop_keys(self, arrivals: Iterable[Arrival[P]]) -> None:
        for arrival in arrivals:
            self._keys.discard(arrival.sources)
