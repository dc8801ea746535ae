"""runtime/serving/client_gate.py: one client address's requests inside a graph at once
(issue 38). Pure asyncio, no server."""

from __future__ import annotations

import asyncio

import pytest

from parityserve.errors import TooManyInFlight
from parityserve.runtime.serving.client_gate import ClientGate


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_an_address_past_its_limit_waits_in_order_and_others_go_straight_in() -> None:
    async def scenario() -> None:
        gate, order = ClientGate(2), []
        release = asyncio.Event()

        async def request(address: str, name: str) -> None:
            async with gate.slot(address, 10, "graph 'g'"):
                order.append(name)
                await release.wait()

        burst = [asyncio.create_task(request("10.0.0.3", f"a{i}")) for i in range(5)]
        await asyncio.sleep(0)
        other = asyncio.create_task(request("10.0.0.1", "b"))
        await asyncio.sleep(0)
        assert order == ["a0", "a1", "b"]  # the other address is not behind the burst
        assert (gate.inside("10.0.0.3"), gate.waiting("10.0.0.3")) == (2, 3)
        release.set()
        await asyncio.gather(*burst, other)
        assert order == ["a0", "a1", "b", "a2", "a3", "a4"]  # the waiters, in order
        assert len(gate) == 0  # no entry left behind

    run(scenario())


def test_a_wait_past_the_deadline_is_a_429_with_retry_after_and_frees_nothing() -> None:
    async def scenario() -> None:
        gate = ClientGate(1)
        hold = asyncio.Event()

        async def holder() -> None:
            async with gate.slot("a", 10, "graph 'g'"):
                await hold.wait()

        task = asyncio.create_task(holder())
        await asyncio.sleep(0)
        with pytest.raises(TooManyInFlight) as caught:
            async with gate.slot("a", 0.01, "graph 'g'"):
                pass
        assert caught.value.status_code == 429 and caught.value.retry_after_s == 1.0
        assert "max_graph_requests_per_address" in str(caught.value)
        assert (gate.inside("a"), gate.waiting("a")) == (1, 0)
        hold.set()
        await task
        assert len(gate) == 0

    run(scenario())


def test_a_waiter_that_gives_up_as_it_is_handed_a_place_passes_it_on() -> None:
    """The place a leaving request hands the first waiter must not be lost when that waiter
    is cancelled (its client went away) in the same turn of the loop."""
    async def scenario() -> None:
        gate, entered = ClientGate(1), []
        first_in = asyncio.Event()
        let_go = asyncio.Event()

        async def request(name: str) -> None:
            async with gate.slot("a", 10, "graph 'g'"):
                entered.append(name)
                if name == "first":
                    first_in.set()
                    await let_go.wait()

        first = asyncio.create_task(request("first"))
        await first_in.wait()
        quitter = asyncio.create_task(request("quitter"))
        last = asyncio.create_task(request("last"))
        while gate.waiting("a") < 2:
            await asyncio.sleep(0)
        let_go.set()
        while gate.waiting("a") > 1:  # first left: the quitter was handed the place ...
            await asyncio.sleep(0)
        quitter.cancel()  # ... and goes away before it runs
        await asyncio.gather(first, last)
        # (Python 3.11's wait_for may return the place rather than raise: either is fine)
        await asyncio.gather(quitter, return_exceptions=True)
        assert entered[0] == "first" and "last" in entered  # the place was not lost
        assert len(gate) == 0

    run(scenario())


def test_a_gate_needs_a_limit_of_at_least_one() -> None:
    with pytest.raises(ValueError):
        ClientGate(0)
