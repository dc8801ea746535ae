"""The profiler's idle part refuses to turn failed requests into service times
(parityserve/bench/profiler.py); the I/O is replaced by fakes, the rules are the real ones."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

import numpy as np
import pytest

from parityserve.bench import profiler
from parityserve.bench.loadgen import LoadResult, run_event_loop
from parityserve.core.queueing import Config
from parityserve.errors import Unavailable

ARGS = argparse.Namespace(warmup=2, idle_requests=3, timeout=5.0)


def _result(ok: list[bool]) -> LoadResult:
    n = len(ok)
    return LoadResult(latencies_s=np.full(n, 0.001), ok=np.array(ok), results=[None] * n,
                      errors=Counter({"HTTP 503": ok.count(False)}), offered_rate=0.0,
                      duration_s=1.0)


def test_a_failed_back_to_back_request_stops_the_profile(monkeypatch: Any) -> None:
    async def closed(send: Any, c: int, requests: int, args: Any) -> LoadResult:
        return _result([True, False, True])

    monkeypatch.setattr(profiler, "apply_configuration", lambda *a: None)
    monkeypatch.setattr(profiler, "_closed", closed)
    monkeypatch.setattr(profiler, "_server_totals", lambda *a: (3, 0.01, 0.005))
    with pytest.raises(Unavailable, match="1 of 3 back-to-back requests failed at c=2"):
        run_event_loop(profiler._busy_slot(None, None, "m", Config(2, 1), ARGS, None))


def test_a_failed_request_after_an_idle_gap_says_so(monkeypatch: Any) -> None:
    async def send(i: int) -> Any:
        raise ConnectionResetError("the server went away")

    monkeypatch.setattr(profiler, "_server_totals", lambda *a: (0, 0.0, 0.0))
    with pytest.raises(Unavailable, match="after a 2 ms idle gap failed: ConnectionReset"):
        run_event_loop(profiler._spaced(send, None, "m", 0.002, ARGS, None))


def test_spaced_runs_report_the_server_slot_and_the_client_round_trip(monkeypatch: Any
                                                                      ) -> None:
    totals = iter([(10, 1.0, 0.5), (13, 1.012, 0.509)])  # 3 batches of 4 ms slot time

    async def send(i: int) -> Any:
        return None

    monkeypatch.setattr(profiler, "_server_totals", lambda *a: next(totals))
    run = run_event_loop(profiler._spaced(send, None, "m", 0.001, ARGS, None))
    assert run.sleep_s == 0.001 and run.slot_s == pytest.approx(0.004)
    assert 0 <= run.client_s < 0.5
