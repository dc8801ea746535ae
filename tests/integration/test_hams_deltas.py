"""Declared deltas on real processes (issue 39, case 6): the README's ``stocks`` graph's
per-stream LSTMs ship only the stream slots a batch changed. After many such batches, and
after a kill -9 of a primary in the middle of them, every stream's replies equal a replay
through fresh LSTMs, and each operator's backup holds, byte for byte, its primary's state
(``/admin/graphs/stocks/digests``)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import numpy as np
import torch

from parityserve.models.stateful import OperatorBatch, StreamLSTM
from tests.integration.conftest import start_server, wait_until
from tests.integration.test_hams_sequences import (
    LSTM1,
    LSTM2,
    STEPS,
    STREAMS,
    check_against_replay,
    config,
    graph_state,
    send_streams,
    series,
    synced,
)


def delta_config() -> dict:
    """Deltas only, but for the seeding copy: a wrong delta is never papered over by a
    periodic full state."""
    raw = config()
    raw["graphs"][0]["full_state_every"] = 1_000_000
    return raw


def replayed(*parts: dict[str, np.ndarray]) -> dict[str, list[float]]:
    """Each stream's outputs for its steps of every part, in order, through fresh LSTMs."""
    first, second = StreamLSTM(**LSTM1), StreamLSTM(**LSTM2)  # type: ignore[arg-type]
    s1, s2 = first.initialize(), second.initialize()
    out: dict[str, list[float]] = {s: [] for s in STREAMS}
    for step in range(STEPS * len(parts)):
        for stream in STREAMS:
            x = parts[step // STEPS][stream][step % STEPS:step % STEPS + 1]
            y1, p1 = first.compute(OperatorBatch.from_numpy(x, [stream]), s1)
            first.update(s1, p1)
            y2, p2 = second.compute(OperatorBatch.from_numpy(y1.numpy(), [stream]), s2)
            second.update(s2, p2)
            out[stream].append(float(torch.as_tensor(y2).reshape(-1)[0]))
    return out


def digests(url: str) -> dict:
    return httpx.get(f"{url}/admin/graphs/stocks/digests", timeout=30).raise_for_status().json()


def backups_hold_the_primarys_state(url: str) -> bool:
    found = digests(url)
    return all(d["backup"] is not None and d["backup"]["synced"]
               and (d["backup"]["seq"], d["backup"]["digest"])
               == (d["primary"]["seq"], d["primary"]["digest"]) for d in found.values())


def test_backups_applying_deltas_hold_their_primarys_state_through_a_failover(
        tmp_path: Path) -> None:
    running = start_server(delta_config(), tmp_path)
    try:
        url = running.url
        wait_until(lambda: synced(url), 60)
        data = series(7)
        check_against_replay(send_streams(url, data), data)
        wait_until(lambda: backups_hold_the_primarys_state(url), 60)
        shipped = {op: d["primary"]["shipped"] for op, d in digests(url).items()}
        for op, counts in shipped.items():  # what the backups hold came as deltas
            assert counts["deltas"] >= STEPS, (op, counts)
            assert counts["full"] == 0, (op, counts)  # the base is sent on attach, apart

        before = graph_state(url)["operators"]["seq1"]
        more = series(8)  # the same streams go on: their state carries over
        replies = send_streams(url, more, {STEPS // 2: lambda: os.kill(
            before["primary_pid"], signal.SIGKILL)})
        state = graph_state(url)
        assert [f["lost_pid"] for f in state["failovers"]] == [before["primary_pid"]]
        assert state["operators"]["seq1"]["primary_pid"] == before["backup_pid"]
        expected = replayed(data, more)  # the promoted backup's state was built from deltas
        for stream in STREAMS:
            got = [float(np.ravel(r["output"])[0]) for r in replies[stream]]
            np.testing.assert_allclose(got, expected[stream][STEPS:], rtol=1e-4, atol=1e-5,
                                       err_msg=f"stream {stream} diverged from its replay")
        wait_until(lambda: synced(url), 60)
        wait_until(lambda: backups_hold_the_primarys_state(url), 60)
        promoted = digests(url)["seq1"]["primary"]["shipped"]
        assert promoted["deltas"] > 0, promoted  # the promoted primary ships deltas too
    finally:
        running.stop()
