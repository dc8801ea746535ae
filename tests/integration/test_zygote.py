"""The fork server on real processes (``runtime/fleet/zygote.py``): what a forked operator gets,
what comes back from it, and that the zygote is no single point of failure.

Members here are real ``hams_worker`` processes pointed at a port nobody serves: they load
their operator, send a hello into the void and wait, which is all a kill test needs. Each
test waits on states (``wait_until``), never on sleeps.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from parityserve.core.forking import UNKNOWN_EXIT
from parityserve.runtime.fleet.processes import ProcessHandle
from parityserve.runtime.fleet.zygote import OPERATOR, ForkedProcess, ForkServer, start_process
from parityserve.runtime.graphs.hams_protocol import OperatorSpec
from parityserve.runtime.workers.keys import ClientKeys, ServerKeys
from tests.integration.conftest import wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def member_args(name: str) -> list[str]:
    spec = OperatorSpec(worker_id=name, op="op", source="zoo:stream-mean", role="backup")
    return ["--connect", "tcp://127.0.0.1:9", "--spec", spec.to_json()]


def start(forks: ForkServer, args: list[str], keys: ClientKeys | None,
          name: str) -> ProcessHandle:
    """An operator, as a graph starts one (``MemberLauncher``)."""
    return start_process(OPERATOR, args, threads=1, keys=keys, log_dir=forks.log_dir,
                         name=name, forks=forks)


@pytest.fixture
def forks(tmp_path: Path) -> Iterator[ForkServer]:
    server = ForkServer(tmp_path)
    server.open()
    assert asyncio.run(server.wait_ready()), (tmp_path / "zygote.log").read_text()
    yield server
    server.close()


def alive(pid: int) -> bool:
    """Running (a zombie is not: it has exited and waits to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def status(pid: int, field: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def caught(pid: int, sig: int) -> bool:
    return bool(int(status(pid, "SigCgt"), 16) >> (sig - 1) & 1)


def sockets(pid: int) -> set[str]:
    found = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:"):
            found.add(target)
    return found


def test_exit_codes_come_back_from_the_zygote_which_leaves_no_zombie(forks: ForkServer,
                                                                     tmp_path: Path) -> None:
    bad = start(forks, ["--no-such-flag"], None, "g/op/bad-1")
    assert isinstance(bad, ForkedProcess)
    assert bad.wait(60) == 2 and bad.poll() == 2 and bad.returncode == 2  # argparse's
    assert "the following arguments are required" in (tmp_path / "g_op_bad-1.log").read_text()
    member = start(forks, member_args("g/op/backup-1"), None, "g/op/backup-1")
    assert member.poll() is None
    member.kill()
    assert member.wait(30) == -signal.SIGKILL
    wait_until(lambda: not Path(f"/proc/{member.pid}").exists(), 30)  # reaped, not a zombie
    member.kill()  # after its exit: harmless (the pidfd names it, never a reused pid)
    with pytest.raises(subprocess.TimeoutExpired):
        start(forks, member_args("g/op/backup-2"), None, "g/op/backup-2").wait(0.05)
    assert forks.forked == 3 and forks.spawned == 0


def test_a_forked_member_starts_as_a_spawned_one_would(forks: ForkServer) -> None:
    """Its own session, the zygote's signal handlers and socket gone, its command line as if
    spawned (``ps`` and the tests read the spec there), keys only in its environment."""
    keys = ServerKeys.in_memory().client()
    member = start(forks, member_args("g/op/backup-7"), keys, "g/op/backup-7")
    zygote = forks.zygote_pid
    assert zygote is not None
    try:
        wait_until(lambda: b"hams_worker" in Path(f"/proc/{member.pid}/cmdline").read_bytes())
        argv = Path(f"/proc/{member.pid}/cmdline").read_bytes().split(b"\0")
        assert argv[:3] == [sys.executable.encode(), b"-m",
                            b"parityserve.runtime.graphs.hams_worker"]
        assert b'"worker_id":"g/op/backup-7"' in argv[argv.index(b"--spec") + 1]
        assert os.getsid(member.pid) == member.pid != os.getsid(zygote)
        assert int(status(member.pid, "PPid")) == zygote
        assert caught(zygote, signal.SIGCHLD) and not caught(member.pid, signal.SIGCHLD)
        assert not sockets(zygote) & sockets(member.pid)
        assert keys.public.decode() not in Path(f"/proc/{zygote}/environ").read_text()
    finally:
        member.kill()
        member.wait(30)


def test_the_zygote_is_no_single_point_of_failure(forks: ForkServer,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    first = start(forks, member_args("g/op/backup-1"), None, "g/op/backup-1")
    zygote = forks.zygote_pid
    assert zygote is not None
    os.kill(zygote, signal.SIGKILL)
    wait_until(lambda: not alive(zygote), 30)
    assert alive(first.pid) and first.poll() is None  # the member stays
    with caplog.at_level(logging.WARNING):
        plain = start(forks, member_args("g/op/backup-2"), None, "g/op/backup-2")
    assert isinstance(plain, subprocess.Popen)  # spawned while a new zygote imports
    assert "is gone; starting another" in caplog.text and forks.restarts == 1
    assert forks.zygote_pid != zygote
    first.kill()  # its exit is seen without the zygote (a pidfd), not its code
    assert first.wait(30) == UNKNOWN_EXIT and isinstance(first, ForkedProcess)
    assert not first.exit_known
    plain.kill()
    plain.wait(30)
    assert asyncio.run(forks.wait_ready())
    again = start(forks, member_args("g/op/backup-3"), None, "g/op/backup-3")
    assert isinstance(again, ForkedProcess)
    again.kill()
    assert again.wait(30) == -signal.SIGKILL


_THREADED = ("import sys, threading, time; "
             "threading.Thread(target=time.sleep, args=(600,), daemon=True).start(); "
             "from parityserve.runtime.fleet.zygote_server import main; sys.exit(main())")


def test_a_zygote_running_a_thread_refuses_to_fork_and_the_member_is_spawned(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    forks = ForkServer(tmp_path, command=[sys.executable, "-c", _THREADED])
    forks.open()
    try:
        assert asyncio.run(forks.wait_ready())
        with caplog.at_level(logging.WARNING):
            member = start(forks, member_args("g/op/backup-1"), None, "g/op/backup-1")
        assert isinstance(member, subprocess.Popen)
        assert "spawned plainly: the zygote refused: the zygote runs 2 Python" in caplog.text
        member.kill()
        member.wait(30)
    finally:
        forks.close()


_RNG = """
import os, sys
import numpy as np, torch
from parityserve.runtime.fleet.zygote_server import _reseed
np.random.seed(0)
torch.manual_seed(0)
draws = set()
for _ in range(2):
    r, w = os.pipe()
    if os.fork() == 0:
        _reseed()
        os.write(w, repr((np.random.random(), float(torch.rand(1)))).encode())
        os._exit(0)
    os.close(w)
    draws.add(os.read(r, 200))
    os.wait()
sys.exit(0 if len(draws) == 2 else 1)
"""


def test_two_forked_members_draw_different_random_streams() -> None:
    """numpy's and torch's global generators would be the zygote's in every child."""
    subprocess.run([sys.executable, "-c", _RNG], check=True, timeout=120)


def test_closing_the_fork_server_ends_the_zygote_and_its_leftover_members(
        tmp_path: Path) -> None:
    """Its lifeline's write end is closed: a member the graphs did not stop reads EOF."""
    forks = ForkServer(tmp_path)
    forks.open()
    assert asyncio.run(forks.wait_ready())
    member = start(forks, member_args("g/op/backup-1"), None, "g/op/backup-1")
    zygote = forks.zygote_pid
    assert zygote is not None
    wait_until(lambda: b"hams_worker" in Path(f"/proc/{member.pid}/cmdline").read_bytes())
    forks.close()
    assert not alive(zygote)
    wait_until(lambda: not alive(member.pid), 30)
    assert "the frontend is gone" in (tmp_path / "g_op_backup-1.log").read_text()
