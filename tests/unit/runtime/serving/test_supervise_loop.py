"""The supervision loop survives a round that raises (a dead node's launcher, say)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from parityserve.runtime.serving.system import keep_ticking


def test_a_failing_round_is_logged_and_the_next_rounds_still_run(
        caplog: pytest.LogCaptureFixture) -> None:
    rounds: list[int] = []

    def tick() -> None:
        rounds.append(len(rounds))
        if len(rounds) == 2:
            raise RuntimeError("launcher call failed on a dead node")

    async def main() -> None:
        task = asyncio.create_task(keep_ticking(tick, 0.0))
        while len(rounds) < 5:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with caplog.at_level(logging.ERROR, logger="parityserve.runtime.serving.system"):
        asyncio.run(main())
    assert len(rounds) >= 5
    assert "supervisor round failed (1 so far)" in caplog.text
    assert "launcher call failed on a dead node" in caplog.text
