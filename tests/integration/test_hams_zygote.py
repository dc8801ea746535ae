"""The README's ``stocks`` graph with its members forked by the server's zygote
(``runtime/fleet/zygote.py``): the zygote dies, the members do not, and recovery goes on.

Every kill is checked to have landed (pids from ``/admin/state`` and ``/proc``)."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from parityserve.client import Client
from tests.integration.conftest import start_server, wait_until
from tests.integration.test_hams_sequences import config, graph_state, synced

OPS = ("seq1", "seq2")


def zygotes() -> list[int]:
    """This process's fork servers (the server runs in this process)."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and b"runtime.fleet.zygote_server" in \
                    (entry / "cmdline").read_bytes() and parent(int(entry.name)) == os.getpid():
                found.append(int(entry.name))
    return found


def parent(pid: int) -> int:
    return int((Path(f"/proc/{pid}/stat").read_text()).rsplit(")", 1)[1].split()[1])


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def members(url: str) -> dict[str, int]:
    ops = graph_state(url)["operators"]
    return {f"{op}/{role}": ops[op][f"{role}_pid"] for op in OPS
            for role in ("primary", "backup", "spare")}


def answers(url: str, stream: str) -> bool:
    with Client(url) as client:
        reply = client.predict_graph("stocks", [0.1] * 4, stream=stream, stream_key="ticker")
    return bool(reply["seqs"]["seq1"] > 0)


def test_killing_the_zygote_kills_no_member_and_failover_still_starts_a_spare(
        tmp_path: Path) -> None:
    running = start_server(config(), tmp_path)
    try:
        url = running.url
        wait_until(lambda: synced(url), 60)
        (zygote,) = zygotes()
        before = members(url)
        assert {parent(pid) for pid in before.values()} == {zygote}  # forked, not spawned
        os.kill(zygote, signal.SIGKILL)
        wait_until(lambda: not alive(zygote), 30)
        assert [role for role, pid in before.items() if not alive(pid)] == []
        assert members(url) == before  # no member was lost, none replaced
        assert answers(url, "a")
        os.kill(before["seq1/primary"], signal.SIGKILL)
        wait_until(lambda: len(graph_state(url)["failovers"]) == 1, 60)
        wait_until(lambda: synced(url), 120)
        after = graph_state(url)["operators"]["seq1"]
        assert after["primary_pid"] == before["seq1/backup"]  # the backup took over
        assert after["spare_pid"] not in (None, *before.values()) and alive(after["spare_pid"])
        assert graph_state(url)["failovers"][0]["lost_pid"] == before["seq1/primary"]
        assert answers(url, "a")
        (replacement,) = zygotes()  # started by the spare's launch, for later starts
        assert replacement != zygote
    finally:
        running.stop()
