"""The fork server's decisions (``core/forking.py``): when a fork is safe, and how the next
graph operator starts."""

from __future__ import annotations

import pytest

from parityserve.config import Server
from parityserve.core.forking import (
    MAX_ZYGOTE_RESTARTS,
    UNKNOWN_EXIT,
    fork_refusal,
    route,
    unusable_reason,
)
from parityserve.runtime.fleet.zygote import fork_server_for


def test_a_fork_is_refused_unless_the_zygote_runs_one_thread() -> None:
    assert fork_refusal(1, 1) is None
    assert "2 Python and 2 OS threads" in str(fork_refusal(2, 2))
    assert "1 Python and 3 OS threads" in str(fork_refusal(1, 3))  # started by a C library


@pytest.mark.parametrize(("ready", "alive", "restarts", "expected"), [
    (True, True, 0, "fork"),
    (False, True, 0, "spawn"),  # still importing: no start waits for it
    (True, False, 0, "restart"),  # killed: replaced, and this start is plain
    (False, False, MAX_ZYGOTE_RESTARTS - 1, "restart"),
    (False, False, MAX_ZYGOTE_RESTARTS, "spawn"),  # dies every time: given up
    (True, True, MAX_ZYGOTE_RESTARTS, "fork"),  # one that came up after restarts is used
])
def test_route(ready: bool, alive: bool, restarts: int, expected: str) -> None:
    assert route(ready, alive, restarts) == expected


def test_no_fork_server_where_it_cannot_work_or_is_turned_off() -> None:
    assert unusable_reason(True, "linux", True) is None
    assert unusable_reason(False, "linux", True) == "server.fork_server is false"
    assert "need Linux" in str(unusable_reason(True, "darwin", True))
    assert "pidfd_open" in str(unusable_reason(True, "linux", False))
    assert fork_server_for(False, None) is None


def test_the_fork_server_is_on_by_default_and_an_unknown_exit_reads_as_killed() -> None:
    assert Server().fork_server is True
    assert UNKNOWN_EXIT < 0  # a graph starts such a member again instead of failing
