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


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_alone_an_address_has_the_limit_and_shared_the_smaller_share() -> None:
    """A burst from one address while another address asked within the horizon gets
    ``shared_limit`` places; the same burst with nobody else about gets ``limit``."""
    async def scenario() -> None:
        clock = _Clock()
        gate, release = ClientGate(8, 2, horizon_s=1.0, clock=clock), asyncio.Event()

        async def request(address: str) -> None:
            async with gate.slot(address, 10, "graph 'g'"):
                await release.wait()

        alone = [asyncio.create_task(request("10.0.0.3")) for _ in range(10)]
        await asyncio.sleep(0)
        assert (gate.inside("10.0.0.3"), gate.waiting("10.0.0.3")) == (8, 2)
        release.set()
        await asyncio.gather(*alone)

        release.clear()
        async with gate.slot("10.0.0.1", 10, "graph 'g'"):  # another client asks, and leaves
            pass
        clock.now += 0.5  # within the horizon: the graph is shared
        shared = [asyncio.create_task(request("10.0.0.3")) for _ in range(10)]
        await asyncio.sleep(0)
        assert (gate.inside("10.0.0.3"), gate.waiting("10.0.0.3")) == (2, 8)
        assert gate.cap("10.0.0.1") == 2 and gate.cap("10.0.0.3") == 2
        release.set()
        await asyncio.gather(*shared)
        assert len(gate) == 0

    run(scenario())


def test_when_the_other_address_goes_quiet_the_waiters_take_the_whole_limit() -> None:
    """The share grows back past the horizon: the next place to free lets in as many
    waiters as the limit allows, not one."""
    async def scenario() -> None:
        clock = _Clock()
        gate, entered = ClientGate(4, 1, horizon_s=1.0, clock=clock), []
        gates = [asyncio.Event() for _ in range(6)]

        async def request(i: int) -> None:
            async with gate.slot("a", 10, "graph 'g'"):
                entered.append(i)
                await gates[i].wait()

        async with gate.slot("b", 10, "graph 'g'"):
            pass
        burst = [asyncio.create_task(request(i)) for i in range(6)]
        await asyncio.sleep(0)
        assert entered == [0] and gate.waiting("a") == 5
        clock.now += 2.0  # b is gone: a is alone
        assert gate.cap("a") == 4
        gates[0].set()
        for _ in range(5):
            await asyncio.sleep(0)
        assert entered == [0, 1, 2, 3, 4] and gate.inside("a") == 4
        for event in gates:
            event.set()
        await asyncio.gather(*burst)
        assert len(gate) == 0

    run(scenario())


def test_a_share_that_shrinks_under_a_full_address_lets_none_in_until_below_it() -> None:
    async def scenario() -> None:
        clock = _Clock()
        gate, entered = ClientGate(3, 1, horizon_s=1.0, clock=clock), []
        gates = [asyncio.Event() for _ in range(4)]

        async def request(i: int) -> None:
            async with gate.slot("a", 10, "graph 'g'"):
                entered.append(i)
                await gates[i].wait()

        tasks = [asyncio.create_task(request(i)) for i in range(4)]
        await asyncio.sleep(0)
        assert entered == [0, 1, 2] and gate.waiting("a") == 1  # alone: 3
        other = asyncio.Event()

        async def other_client() -> None:
            async with gate.slot("b", 10, "graph 'g'"):
                await other.wait()

        b = asyncio.create_task(other_client())
        await asyncio.sleep(0)
        assert gate.inside("b") == 1  # the other address is never behind a's requests
        gates[0].set()
        gates[1].set()
        for _ in range(5):
            await asyncio.sleep(0)
        assert entered == [0, 1, 2] and gate.inside("a") == 1  # 3 - 2 left, cap 1: none in
        gates[2].set()
        for _ in range(5):
            await asyncio.sleep(0)
        assert entered == [0, 1, 2, 3]
        gates[3].set()
        other.set()
        await asyncio.gather(*tasks, b)
        assert len(gate) == 0

    run(scenario())


def test_the_seen_table_keeps_only_the_horizons_addresses() -> None:
    async def scenario() -> None:
        clock = _Clock()
        gate = ClientGate(8, 2, horizon_s=1.0, clock=clock)
        for i in range(1000):
            async with gate.slot(f"10.0.{i // 250}.{i % 250}", 10, "graph 'g'"):
                pass
            clock.now += 0.01
        gate.cap("x")
        assert len(gate._seen) <= 101  # the last second's addresses, not all 1,000

    run(scenario())


def test_the_shared_share_is_never_above_the_limit() -> None:
    assert ClientGate(1, 2).shared_limit == 1
    assert ClientGate(4).shared_limit == 4
    with pytest.raises(ValueError):
        ClientGate(4, 0)


def test_a_request_inside_past_the_horizon_still_makes_the_graphs_shared() -> None:
    """The other address's one slow request counts for as long as it is inside, not only
    for the second after it asked."""
    async def scenario() -> None:
        clock = _Clock()
        gate, release = ClientGate(8, 2, horizon_s=1.0, clock=clock), asyncio.Event()

        async def slow() -> None:
            async with gate.slot("victim", 10, "graph 'g'"):
                await release.wait()

        task = asyncio.create_task(slow())
        await asyncio.sleep(0)
        clock.now += 5.0
        assert gate.cap("attacker") == 2
        release.set()
        await task
        assert gate.cap("attacker") == 8

    run(scenario())


def test_an_address_that_keeps_asking_does_not_pin_the_seen_table() -> None:
    """An address asking again moves to the table's end: the others' old entries behind it
    are still pruned, and an attacker alone again gets the whole limit."""
    async def scenario() -> None:
        clock = _Clock()
        gate = ClientGate(8, 2, horizon_s=1.0, clock=clock)
        for i in range(500):
            for address in ("steady", f"passer{i}"):
                async with gate.slot(address, 10, "graph 'g'"):
                    pass
            clock.now += 0.01
        gate.cap("steady")
        assert len(gate._seen) <= 102, len(gate._seen)
        clock.now += 1.5
        async with gate.slot("steady", 10, "graph 'g'"):
            assert gate.cap("steady") == 8

    run(scenario())


def test_waiters_go_before_a_newcomer_when_the_cap_has_grown() -> None:
    """The other address went quiet while nobody of this one left: the next arrival lets
    the waiters in first, up to the grown cap, and waits if that fills it."""
    async def scenario() -> None:
        clock = _Clock()
        gate, order = ClientGate(3, 1, horizon_s=1.0, clock=clock), []
        hold = asyncio.Event()

        async def request(name: str) -> None:
            async with gate.slot("a", 10, "graph 'g'"):
                order.append(name)
                await hold.wait()

        async with gate.slot("b", 10, "graph 'g'"):
            pass
        tasks = [asyncio.create_task(request(f"w{i}")) for i in range(3)]
        try:
            await asyncio.sleep(0)
            assert order == ["w0"] and gate.waiting("a") == 2
            clock.now += 2.0  # b is gone: the cap is 3, and nobody has left yet
            tasks.append(asyncio.create_task(request("new")))
            await asyncio.sleep(0)
            assert (gate.inside("a"), gate.waiting("a")) == (3, 1)  # w1, w2 in; new waits
        finally:
            hold.set()  # (an assertion above must not leave the tasks hanging)
        await asyncio.gather(*tasks)
        assert order[-1] == "new" and len(gate) == 0, order

    run(scenario())


def test_the_429_names_the_cap_that_held_it() -> None:
    async def scenario() -> None:
        clock = _Clock()
        gate, hold = ClientGate(8, 1, horizon_s=1.0, clock=clock), asyncio.Event()

        async def holder(address: str) -> None:
            async with gate.slot(address, 10, "graph 'g'"):
                await hold.wait()

        tasks = [asyncio.create_task(holder(a)) for a in ("a", "b")]
        await asyncio.sleep(0)
        with pytest.raises(TooManyInFlight) as caught:
            async with gate.slot("a", 0.01, "graph 'g'"):
                pass
        text = str(caught.value)
        assert "had 1 of its 1 places" in text, text
        assert "max_graph_requests_per_address_shared" in text, text
        hold.set()
        await asyncio.gather(*tasks)

    run(scenario())
