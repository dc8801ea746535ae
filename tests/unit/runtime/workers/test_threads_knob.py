"""The intra-op threads knob's pure parts: the core budget, the command, the heartbeat that
acknowledges it, and the worker applying it between batches (with a fake socket)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from parityserve.core.scheduling.settings import check_cores
from parityserve.errors import ProtocolError
from parityserve.runtime.workers import messages, wire
from parityserve.runtime.workers.commands import SetThreads
from parityserve.runtime.workers.worker import WorkerSpec, _Worker, apply_threads


@pytest.mark.parametrize(("c", "intra", "cores", "over", "ok"), [
    (1, 2, 2, False, True),
    (2, 1, 2, False, True),
    (2, 2, 2, False, False),
    (3, 1, 2, False, False),
    (4, 1, 2, True, True),     # the labelled extension: c up to 4 on 2 cores
    (2, 2, 2, True, True),
    (5, 1, 2, True, False),
    (1, 16, 16, False, True),
    (1, 17, 16, False, False),
])
def test_c_times_intra_must_fit_the_cores(c, intra, cores, over, ok) -> None:
    if ok:
        check_cores(c, intra, cores, oversubscribe=over)
    else:
        with pytest.raises(ValueError, match="threads"):
            check_cores(c, intra, cores, oversubscribe=over)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_a_thread_count_must_be_a_whole_number(bad) -> None:
    with pytest.raises(ValueError, match="whole number"):
        check_cores(1, bad, 64)


def test_the_command_header() -> None:
    assert SetThreads(3).header() == {"t": wire.THREADS, "n": 3}


def test_a_heartbeat_carries_the_thread_count() -> None:
    beat = messages.decode(wire.encode({"t": wire.HEARTBEAT, "served": 4, "threads": 2}))
    assert beat == messages.Heartbeat(4, 2)
    assert messages.decode(wire.encode({"t": wire.HEARTBEAT, "served": 1})) == \
        messages.Heartbeat(1, None)


@pytest.mark.parametrize("bad", [0, -3, messages.MAX_THREADS + 1, "2", 2.0, True, [2]])
def test_a_heartbeat_with_a_bad_thread_count_is_a_protocol_error(bad: Any) -> None:
    with pytest.raises(ProtocolError, match="threads"):
        messages.decode(wire.encode({"t": wire.HEARTBEAT, "served": 0, "threads": bad}))


class _Socket:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send_multipart(self, frames: list[Any], copy: bool = True) -> None:
        self.sent.append(wire.decode(frames)[0])


def _worker() -> tuple[_Worker, _Socket]:
    sock = _Socket()
    spec = WorkerSpec(replica_id="m/v1/0", model="m", version=1, source="zoo:noop", threads=1)
    return _Worker(spec, object(), sock), sock  # type: ignore[arg-type]


def test_the_worker_applies_threads_and_acknowledges_at_once(monkeypatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # a model without torch
    monkeypatch.delitem(sys.modules, "threadpoolctl", raising=False)
    worker, sock = _worker()
    worker.handle(wire.encode(SetThreads(2).header()))
    assert worker.threads == 2
    assert sock.sent[-1] == {"t": wire.HEARTBEAT, "served": 0, "threads": 2}


@pytest.mark.parametrize("bad", [0, -1, None, "3", 1.5])
def test_a_bad_thread_count_keeps_the_old_one_and_says_so(bad) -> None:
    worker, sock = _worker()
    worker.handle(wire.encode({"t": wire.THREADS, "n": bad}))
    assert worker.threads == 1 and sock.sent[-1]["threads"] == 1


def test_torch_threads_change_live() -> None:
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    try:
        assert apply_threads(2) == 2 == torch.get_num_threads()
        assert apply_threads(1) == 1 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
