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

**Shared, an address's share shrinks** (``shared_limit``, 2 by default): while another address
has asked for a graph within the last ``horizon_s`` (1 s), no address has more than that
inside. Why: at 8 a time, the soak's burster still held the graph's pipeline and the machine's
cores whenever the well-behaved client's next request came (its p99 2.4-2.8x the calm one);
at 1 a time it did not (1.4-1.8x), but a limit of 1 for everyone serialised the well-behaved
client's own Poisson arrivals even alone (calm graph p99 31-41 ms against 26-27). So the small
share applies only while the graph is shared: a client alone still has ``limit``, and a
client that sends one request at a time never notices either.

Hand-written rather than an ``asyncio.Semaphore`` per address: the table must drop an
address once none of its requests is inside or waiting (a client on each of many addresses
must not leave one entry each behind), which needs the waiting count a semaphore hides.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from parityserve.errors import TooManyInFlight

__all__ = ["ClientGate"]


@dataclass
class _Address:
    inside: int = 0
    waiting: deque[asyncio.Future[None]] = field(default_factory=deque)


class ClientGate:
    def __init__(self, limit: int, shared_limit: int | None = None, horizon_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if limit < 1 or (shared_limit is not None and shared_limit < 1):
            raise ValueError(f"a client gate's limits are at least 1, got {limit} and "
                             f"{shared_limit}")
        self.limit = limit
        self.shared_limit = limit if shared_limit is None else min(shared_limit, limit)
        self.horizon_s = horizon_s
        self._clock = clock
        self._addresses: dict[str, _Address] = {}
        # address -> when it last asked, oldest first: who shares the graphs just now. Pruned
        # as it is read, so it holds at most the addresses of the last horizon_s.
        self._seen: OrderedDict[str, float] = OrderedDict()

    def cap(self, address: str) -> int:
        """How many of ``address``'s requests may be inside now: ``limit`` alone,
        ``shared_limit`` while another address is inside, waiting, or asked within
        ``horizon_s``."""
        now = self._clock()
        while self._seen and next(iter(self._seen.values())) < now - self.horizon_s:
            self._seen.popitem(last=False)
        others = (len(self._seen) - (address in self._seen) > 0
                  or len(self._addresses) - (address in self._addresses) > 0)
        return self.shared_limit if others else self.limit

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
        """Inside while the block runs; waits (FIFO per address) while its cap of this
        address's requests are inside, at most ``wait_s``. ``what`` names the graph."""
        self._seen[address] = self._clock()
        self._seen.move_to_end(address)
        entry = self._addresses.setdefault(address, _Address())
        cap = self.cap(address)
        self._admit(entry, cap)  # a cap that grew since the last leave: waiters first
        if entry.inside < cap and not entry.waiting:
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
            handed = turn.done() and not turn.cancelled()
            held, cap = entry.inside - handed, self.cap(address)  # before the cleanup below
            if handed:  # handed a place as it gave up: pass it on
                self._leave(address, entry)
            else:
                turn.cancel()
                entry.waiting.remove(turn)
                self._forget_if_idle(address, entry)
            if isinstance(exc, TimeoutError):
                knob = ("max_graph_requests_per_address_shared, while other addresses use "
                        "the graphs too" if cap < self.limit else
                        "max_graph_requests_per_address")
                raise TooManyInFlight(
                    f"{what}: this client address had {held} of its {cap} places in the "
                    f"graphs taken (server.limits.{knob}), and this request waited "
                    f"{wait_s:g} s for one", retry_after_s=1.0) from None
            raise

    def _leave(self, address: str, entry: _Address) -> None:
        """A place frees; waiters of the address take the places its cap now allows (none
        while it is past a cap that shrank, several when one grew)."""
        entry.inside -= 1
        if entry.waiting:
            self._admit(entry, self.cap(address))
        self._forget_if_idle(address, entry)

    def _admit(self, entry: _Address, cap: int) -> None:
        """Waiters take the places the address's ``cap`` allows now, in order."""
        while entry.waiting and entry.inside < cap:
            turn = entry.waiting.popleft()
            if not turn.done():
                entry.inside += 1
                turn.set_result(None)  # inside now: its own _leave gives the place back

    def _forget_if_idle(self, address: str, entry: _Address) -> None:
        if entry.inside == 0 and not entry.waiting and self._addresses.get(address) is entry:
            del self._addresses[address]
