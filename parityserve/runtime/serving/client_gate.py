"""Each client address's share of a stateful graph: at most ``limit`` of its requests inside
a graph at once; the rest wait their turn at the door, in order, for as long as the graph's
own deadline (issue 38).

Why: a graph runs its requests through one pipeline of operator batches, and its frontend's
one event loop. One client sending 25 requests at once each second (the soak's wrong-width
recipe: 20 of them well-formed) put every other client's request behind that burst: the
well-behaved client's p99 was 2.97x its calm p99 beside 20 well-formed requests at once, and
1.79x when the same burst went 8 at a time (``benchmarks/diagnostics/graph_burst.py``). The
burst itself finished sooner spread out (round p50 66 ms against 94). So the excess of one
address waits, and is not refused: a client that sends many requests at once is served,
only not ahead of everyone else. A request that waits past its graph's deadline is answered
429 ``too_many_in_flight`` with a Retry-After.

Hand-written rather than an ``asyncio.Semaphore`` per address: the table must drop an
address once none of its requests is inside or waiting (a client on each of many addresses
must not leave one entry each behind), which needs the waiting count a semaphore hides.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from parityserve.errors import TooManyInFlight

__all__ = ["ClientGate"]


@dataclass
class _Address:
    inside: int = 0
    waiting: deque[asyncio.Future[None]] = field(default_factory=deque)


class ClientGate:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a client gate's limit is at least 1, got {limit}")
        self.limit = limit
        self._addresses: dict[str, _Address] = {}

    def inside(self, address: str) -> int:
        found = self._addresses.get(address)
        return found.inside if found is not None else 0

    def waiting(self, address: str) -> int:
        found = self._addresses.get(address)
        return len(found.waiting) if found is not None else 0

    def __len__(self) -> int:
        """Addresses with a request inside or waiting."""
        return len(self._addresses)

    @asynccontextmanager
    async def slot(self, address: str, wait_s: float, what: str) -> AsyncIterator[None]:
        """Inside while the block runs; waits (FIFO per address) while ``limit`` of this
        address's requests are inside, at most ``wait_s``. ``what`` names the graph."""
        entry = self._addresses.setdefault(address, _Address())
        if entry.inside < self.limit and not entry.waiting:
            entry.inside += 1
        else:
            await self._wait(address, entry, wait_s, what)
        try:
            yield
        finally:
            self._leave(address, entry)

    async def _wait(self, address: str, entry: _Address, wait_s: float, what: str) -> None:
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry.waiting.append(turn)
        try:
            await asyncio.wait_for(asyncio.shield(turn), wait_s)
        except BaseException as exc:
            if turn.done() and not turn.cancelled():  # handed a place as it gave up: pass
                self._leave(address, entry)  # it on
            else:
                turn.cancel()
                entry.waiting.remove(turn)
                self._forget_if_idle(address, entry)
            if isinstance(exc, TimeoutError):
                raise TooManyInFlight(
                    f"{what}: this client address already has {self.limit} requests in it "
                    f"(server.limits.max_graph_requests_per_address), and this one waited "
                    f"{wait_s:g} s for a place", retry_after_s=1.0) from None
            raise

    def _leave(self, address: str, entry: _Address) -> None:
        """A place frees: the next waiter of the address takes it, else it is given back."""
        while entry.waiting:
            turn = entry.waiting.popleft()
            if not turn.done():
                turn.set_result(None)  # the place passes on: ``inside`` stays
                return
        entry.inside -= 1
        self._forget_if_idle(address, entry)

    def _forget_if_idle(self, address: str, entry: _Address) -> None:
        if entry.inside == 0 and not entry.waiting and self._addresses.get(address) is entry:
            del self._addresses[address]
