"""``runtime.serving.settle``: the hot routes' wait for a request's futures until its deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

from parityserve.runtime.serving.settle import settle


def test_it_returns_once_every_future_is_done_and_leaves_no_callback() -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in range(3)]
        for i, future in enumerate(futures):
            loop.call_later(0.01 * (i + 1), future.set_result, i)
        start = time.monotonic()
        await settle(futures, 5.0)
        assert time.monotonic() - start < 1.0
        assert [f.result() for f in futures] == [0, 1, 2]
        assert all(not f._callbacks for f in futures)  # noqa: SLF001

    asyncio.run(body())


def test_at_the_timeout_it_returns_and_cancels_nothing() -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        done, late = loop.create_future(), loop.create_future()
        done.set_result("early")
        start = time.monotonic()
        await settle([done, late], 0.05)
        assert 0.04 <= time.monotonic() - start < 1.0
        assert not late.done() and not late.cancelled()  # still anyone else's to resolve
        assert not late._callbacks  # noqa: SLF001
        late.set_result("later")

    asyncio.run(body())


def _returns_without_waiting(coro: Coroutine[Any, Any, None]) -> bool:
    """Whether a coroutine finishes on its first step, never yielding to the event loop: "at
    once" as an ordering, which no clock or machine load can blur."""
    try:
        coro.send(None)
    except StopIteration:
        return True
    coro.close()
    return False


def test_nothing_pending_returns_at_once() -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        future.set_exception(ValueError("failed"))
        assert _returns_without_waiting(settle([future], 10.0))
        assert _returns_without_waiting(settle([], 10.0))
        assert not future._callbacks  # noqa: SLF001
        assert isinstance(future.exception(), ValueError)
        # And the check can fail: a pending future makes settle wait.
        assert not _returns_without_waiting(settle([loop.create_future()], 10.0))

    asyncio.run(body())


def test_cancelling_the_waiting_request_leaves_its_futures_alone() -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        shared = loop.create_future()
        waiting = asyncio.ensure_future(settle([shared], 10.0))
        await asyncio.sleep(0.01)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert waiting.cancelled()
        assert not shared.cancelled() and not shared._callbacks  # noqa: SLF001

    asyncio.run(body())
