"""A graph's requests, from the door to the reply: admission, each row's answer or error, and
the release of replies the output commit held until durable (HAMS H10, the request manager).

One client never hurts another (issue 38): rows that do not fit the shape the graph declares
(``Graph.door``; never one learned from traffic, which a client could choose) are refused at
the door, and so are new streams while an operator on the way has no room for them; an
operator's refusal fails the refused rows alone.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from parityserve.core.hams import Executed, Held, admits, client_of, seq_at
from parityserve.core.hams.door import StreamGate
from parityserve.errors import (
    DeadlineExceeded,
    InvalidInput,
    PredictError,
    TooManyStreams,
    Unavailable,
)
from parityserve.runtime.graphs.hams_context import (
    Batch,
    GraphAnswer,
    GraphContext,
    log,
)

__all__ = ["Requests"]

_RELEASED_KEPT = 100_000  # answered requests remembered to drop a late duplicate


@dataclass
class _Waiting:
    stream: str
    label: int
    future: asyncio.Future[GraphAnswer]
    name: str = ""  # how an error names the row: "input_batch[3]: " in a request of several


class Requests:
    def __init__(self, ctx: GraphContext, input_shape: tuple[int, ...] | None) -> None:
        self.ctx = ctx
        # declared only: learned from the first answer, one client chose it for everyone
        self.input_shape = input_shape
        # a stateful operator's "no room for a new stream until t", repeated at the door
        self.gate = StreamGate(ctx.topology.stateful)
        self.waiting: dict[int, _Waiting] = {}
        self.abandoned: dict[int, _Waiting] = {}  # timed out, their rows still in the graph
        self._released: deque[int] = deque()
        self._clients = itertools.count(1)
        self.pump: Callable[[], None] = lambda: None  # dispatch: send what is queued

    async def predict(self, rows: Sequence[np.ndarray], streams: Sequence[str],
                      labels: Sequence[int], timeout_s: float) -> list[GraphAnswer]:
        ctx = self.ctx
        if ctx.broken is not None:
            raise Unavailable(f"graph {ctx.graph.name!r} lost state it cannot rebuild: "
                              f"{ctx.broken}")
        self._check_shapes(rows)
        self._check_gate(streams)
        loop = asyncio.get_running_loop()
        futures, clients = [], []
        origin = object()  # this request's rows take turns with other requests' in batches
        for i, (row, stream, label) in enumerate(zip(rows, streams, labels, strict=True)):
            client = next(self._clients)
            waiting = _Waiting(stream, label, loop.create_future(),
                               f"input_batch[{i}]: " if len(rows) > 1 else "")
            self.waiting[client] = waiting
            clients.append(client)
            futures.append(waiting.future)
            ctx.router.submit(client, row, origin)
        self.pump()
        done, pending = await asyncio.wait(futures, timeout=timeout_s)
        for client in clients:  # given up on: nobody waits for it any more, but its row
            if (gone := self.waiting.pop(client, None)) is not None:  # still runs on its
                self.abandoned[client] = gone  # stream, and is collected when it leaves
        if pending:
            raise DeadlineExceeded(f"graph {ctx.graph.name!r} did not answer within "
                                   f"{timeout_s:g} s ({len(pending)} of {len(futures)} rows)")
        return [f.result() for f in futures]

    def _check_shapes(self, rows: Sequence[np.ndarray]) -> None:
        """A row that does not fit the declared shape is refused here, before it enters
        any batch. With none declared, every row goes on and stands or falls alone."""
        shape = self.input_shape
        for i, row in enumerate(rows):
            if not admits(np.shape(row), shape):
                where = f"input_batch[{i}]" if len(rows) > 1 else "the input"
                raise InvalidInput(f"graph {self.ctx.graph.name!r} takes rows of shape "
                                   f"{list(shape or ())} (declared; -1 is any size); "
                                   f"{where} has shape {list(np.shape(row))}")

    def _check_gate(self, streams: Sequence[str]) -> None:
        """A new stream while an operator on the way says its table has no room: the 429
        it would answer, now, before the rows cross the operators ahead of it."""
        closed = self.gate.closed(streams, self.ctx.clock())
        if closed is None:
            return
        where = f"input_batch[{closed.row}]: " if len(streams) > 1 else ""
        raise TooManyStreams(
            f"{where}{closed.reason or closed.op + ': no room for a new stream'} (refused at "
            f"the graph's door: {closed.op} takes no new stream for {closed.retry_after_s:.3g} "
            "s more, and this one is new to it)", closed.retry_after_s)

    def row_of(self, entry: Executed[np.ndarray]) -> tuple[str, int] | None:
        """The stream and label of ``entry``'s request, for its operator's batch."""
        waiting = self._find(client_of(entry.lineage))
        return None if waiting is None else (waiting.stream, waiting.label)

    def _find(self, client: int) -> _Waiting | None:
        return self.waiting.get(client) or self.abandoned.get(client)

    def deliver(self, op: str, batch: Batch, outcomes: Sequence[np.ndarray | Exception]
                ) -> None:
        """Each row's output goes on through the graph; each error fails its request. A row
        whose output cannot go on fails alone."""
        for entry, outcome in zip(batch, outcomes, strict=True):
            try:
                if isinstance(outcome, Exception):
                    self.refuse(op, entry, outcome)
                else:
                    self.output(op, entry, outcome)
            except Exception as exc:
                log.exception("graph %s: %s's output could not go on", self.ctx.graph.name, op)
                self.refuse(op, entry, PredictError(
                    f"{op}: its output could not go on: {type(exc).__name__}: {exc}"))

    def output(self, op: str, entry: Executed[np.ndarray], row: np.ndarray) -> None:
        """An operator answered ``entry``; ignored when a failover renumbered it since."""
        router = self.ctx.router
        if router.managers[op].current(entry.seq) is not entry or entry.done:
            return
        if op in self.ctx.pairs:  # it answered a row of this stream: the stream has a slot
            waiting = self._find(client_of(entry.lineage))
            self.gate.took(op, "" if waiting is None else waiting.stream)
        self.release(router.output(op, entry.seq, row))

    def fail_batch(self, op: str, batch: Batch, exc: Exception) -> None:
        for entry in batch:
            self.refuse(op, entry, exc)

    def refuse(self, op: str, entry: Executed[np.ndarray], exc: Exception) -> None:
        """The operator refused this row (bad input, no room, a model error). Its client
        gets the error now: an error shows no state, so it waits for no durability. The row
        stops here, and its request leaves the graph everywhere."""
        manager = self.ctx.router.managers[op]
        if manager.current(entry.seq) is not entry or entry.done:
            return  # a failover renumbered it, or it was answered already
        manager.record(entry.seq, np.empty(0))
        if isinstance(exc, TooManyStreams) and op in self.ctx.pairs:
            self.gate.refused(op, self.ctx.clock(), exc.retry_after_s, str(exc))
        client = client_of(entry.lineage)
        self.abandoned.pop(client, None)
        waiting = self.waiting.pop(client, None)
        if waiting is not None and not waiting.future.done():
            waiting.future.set_exception(_named(exc, waiting.name))
            waiting.future.exception()  # retrieved: a client that left logs nothing
        self.ctx.router.collect(client)

    def release(self, held: list[Held[np.ndarray]]) -> None:
        now, router = self.ctx.clock(), self.ctx.router
        for reply in held:
            self._note_first_reply(reply, now)
            self.abandoned.pop(reply.client, None)
            waiting = self.waiting.pop(reply.client, None)
            if waiting is not None and not waiting.future.done():
                seqs = {h.op: h.seq for h in reply.lineage}
                waiting.future.set_result(GraphAnswer(reply.client, reply.reply, seqs))
            router.collect(reply.client)
            self._released.append(reply.client)
            if len(self._released) > _RELEASED_KEPT:
                router.commit.forget(self._released.popleft())

    def _note_first_reply(self, reply: Held[np.ndarray], now: float) -> None:
        for record in self.ctx.failovers:
            if record.first_reply_at is None:
                seq = seq_at(reply.lineage, record.op)
                if seq is not None and seq > record.bounds.get(record.op, 0):
                    record.first_reply_at = now

    def break_all(self, reason: str) -> None:
        """The graph gives up (or closes): every waiting client gets ``reason``, a 503."""
        self.ctx.broken = reason
        for client, waiting in list(self.waiting.items()):
            if not waiting.future.done():
                waiting.future.set_exception(Unavailable(reason))
                waiting.future.exception()  # retrieved: a client that left logs nothing
            del self.waiting[client]
        self.abandoned.clear()


def _named(exc: Exception, name: str) -> Exception:
    """``exc`` with the row it fails named first ("input_batch[3]: ..."), when the request
    had several; a copy, since one error may fail several rows."""
    if not name:
        return exc
    try:
        named = copy.copy(exc)
    except Exception:  # an error that cannot be copied keeps its words
        return exc
    named.args = (f"{name}{exc}",)
    return named
