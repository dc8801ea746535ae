"""``parityserve start`` SIGKILLed with a stateful graph up: no operator process is left.

Its members are forked by the server's zygote, so the kernel's parent-death signal would name
the zygote, not the frontend; they die with the frontend through a lifeline pipe whose write
end only the frontend holds (``runtime/fleet/zygote_server.watch_lifeline``). The zygote, whose
socket to the frontend closes, goes too."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest

from parityserve.bench.serverproc import ServerProcess, write_config
from tests.integration.test_hams_sequences import config, graph_state, synced

pytestmark = pytest.mark.e2e


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def zygotes_of(frontend: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (entry / "stat").read_text()
            if b"runtime.fleet.zygote_server" in (entry / "cmdline").read_bytes() and \
                    int(stat.rsplit(")", 1)[1].split()[1]) == frontend:
                found.append(int(entry.name))
    return found


def wait_for(condition: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what}: not in {timeout_s:.0f} s")


def test_no_operator_outlives_a_killed_frontend(tmp_path: Path) -> None:
    server = ServerProcess(write_config(config(), tmp_path / "s.yaml"),
                           log_dir=tmp_path / "logs").start()
    pids: list[int] = []
    try:
        assert server.proc is not None
        wait_for(lambda: synced(server.url), 120, "the graph's backups in sync")
        ops = graph_state(server.url)["operators"]
        pids += [ops[op][f"{role}_pid"] for op in ("seq1", "seq2")
                for role in ("primary", "backup", "spare")]
        pids += zygotes_of(server.proc.pid)
        assert len(pids) == 7 and all(alive(pid) for pid in pids)
        os.kill(server.proc.pid, 9)
        server.proc.wait(30)
        wait_for(lambda: not any(alive(pid) for pid in pids), 30,
                 "every operator and the zygote gone")
    finally:
        server.stop()
        for pid in pids:  # what a failure left (never a reused pid: only those still ours)
            with contextlib.suppress(OSError):
                if alive(pid) and b"parityserve" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, 9)
