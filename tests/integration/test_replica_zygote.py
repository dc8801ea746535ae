"""Model replicas forked by the server's zygote (``runtime/fleet/zygote.py``), on real
servers and real processes: what a forked replica is, what the supervisor sees of it when
it dies, that the zygote's own death takes no replica along, and that ``fork_server: false``
spawns as before.

Each test waits on states (``wait_until``), never on sleeps; every kill is checked to have
landed (pids from the supervisor's records and ``/proc``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import model_state, start_server, wait_until

from parityserve.client import Client
from parityserve.core.scheduling import ReplicaState
from parityserve.runtime.fleet.zygote import ForkServer
from parityserve.runtime.fleet.zygote_server import ENV_ROOM_VAR
from parityserve.runtime.server import RunningServer

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")]

BROKEN = '''
class Broken:
    def __init__(self):
        raise RuntimeError("no weights in this container")

    def predict(self, batch):
        return batch
'''


def config(fork_server: bool = True) -> dict:
    return {"server": {"http_port": 0, "fork_server": fork_server},
            "models": [{"name": "echo", "source": "zoo:echo", "replicas": 2,
                        "threads_per_replica": 2},
                       {"name": "broken", "source": "python:broken_models:Broken",
                        "replicas": 0}]}


def serve(tmp_path: Path, fork_server: bool = True) -> RunningServer:
    (tmp_path / "broken_models.py").write_text(BROKEN)
    return start_server(config(fork_server), tmp_path)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[RunningServer]:
    server = serve(tmp_path)
    try:
        yield server
    finally:
        server.stop()


def forks_of(server: RunningServer) -> ForkServer:
    forks = server.system._forks
    assert forks is not None
    return forks


INDEX: dict[str, int] = {}  # replica id -> its slot


def pids(server: RunningServer, model: str = "echo") -> dict[str, int]:
    """Replica id -> pid, of the replicas the supervisor runs now."""
    replicas = list(server.system.models[model].replicas.items())
    INDEX.update((rid, r.index) for rid, r in replicas)
    return {rid: r.process.pid for rid, r in replicas}


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def alive(pid: int) -> bool:
    """Running (a zombie is not: it has exited and waits to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def environ(pid: int) -> dict[bytes, bytes]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(p.split(b"=", 1) for p in pairs if b"=" in p)


def answers(server: RunningServer) -> bool:
    with Client(server.url) as client:
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        out = client.infer("echo", x)
    return bool(np.array_equal(np.asarray(out), x))


def replaced(server: RunningServer, before: dict[str, int], rid: str) -> int | None:
    """The pid of the ready replica that took ``rid``'s slot (its index), once there is one."""
    slot = INDEX[rid]
    for other, replica in list(server.system.models["echo"].replicas.items()):
        if other not in before and replica.state == ReplicaState.READY and \
                replica.index == slot:
            return int(replica.process.pid)
    return None


def test_a_replica_is_forked_and_is_what_a_spawned_one_would_be(served) -> None:
    """Its parent is the zygote; its command line, environment (keys, thread counts) and
    session are a spawned replica's; it answers."""
    zygote = forks_of(served).zygote_pid
    assert zygote is not None
    running = pids(served)
    assert len(running) == 2
    for rid, pid in running.items():
        assert parent(pid) == zygote  # forked, not spawned by this (the frontend's) process
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        assert argv[:3] == [sys.executable.encode(), b"-m", b"parityserve.runtime.workers.worker"]
        assert argv[argv.index(b"--parent-pid") + 1] == str(os.getpid()).encode()
        assert f'"replica_id":"{rid}"'.encode() in argv[argv.index(b"--spec") + 1]
        env = environ(pid)
        assert env[b"OMP_NUM_THREADS"] == env[b"MKL_NUM_THREADS"] == b"2"
        assert env[b"PARITYSERVE_WORKER_KEYS"]  # CURVE is on by default
        assert ENV_ROOM_VAR.encode() not in env and b"OPENBLAS_NUM_THREADS" not in env
        assert os.getsid(pid) == pid
    assert b"PARITYSERVE_WORKER_KEYS" not in environ(zygote)
    assert answers(served)
    assert forks_of(served).forked >= 2 and forks_of(served).spawned == 0


def test_a_killed_forked_replica_is_seen_and_restarted_forked(
        served, caplog: pytest.LogCaptureFixture) -> None:
    zygote = forks_of(served).zygote_pid
    before = pids(served)
    rid, pid = next(iter(before.items()))
    with caplog.at_level(logging.WARNING, logger="parityserve.runtime.fleet.supervisor"):
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: replaced(served, before, rid) is not None, 60)
    assert f"replica {rid} failed (process exited with code -9)" in caplog.text
    new = replaced(served, before, rid)
    assert new is not None and new != pid and parent(new) == zygote
    assert not alive(pid)
    assert answers(served)


def test_a_hung_forked_replica_is_killed_reaped_and_restarted(
        served, caplog: pytest.LogCaptureFixture) -> None:
    """No heartbeat: the supervisor kills it through the zygote's pidfd, the zygote reaps
    it (no zombie is left), and a forked replica takes its slot."""
    before = pids(served)
    rid = next(r for r in before if INDEX[r] == 0)
    with Client(served.url) as client, caplog.at_level(logging.WARNING):
        client.set_faults("echo", "0", hang_after_batches=0)
        for _ in range(4):  # one of these reaches replica 0 and hangs it; all are answered
            assert answers(served)
        wait_until(lambda: replaced(served, before, rid) is not None, 60)
    assert f"replica {rid} failed (no heartbeat" in caplog.text
    wait_until(lambda: not Path(f"/proc/{before[rid]}").exists(), 30)  # reaped, not a zombie
    new = replaced(served, before, rid)
    assert new is not None and parent(new) == forks_of(served).zygote_pid


def test_killing_the_zygote_kills_no_replica_and_the_next_start_replaces_it(
        served, caplog: pytest.LogCaptureFixture) -> None:
    forks = forks_of(served)
    zygote = forks.zygote_pid
    assert zygote is not None
    before = pids(served)
    os.kill(zygote, signal.SIGKILL)
    wait_until(lambda: not alive(zygote), 30)
    assert all(alive(pid) for pid in before.values()) and pids(served) == before
    assert answers(served)
    (first, pid), (second, other) = before.items()
    with caplog.at_level(logging.WARNING):
        os.kill(pid, signal.SIGKILL)  # its exit is seen without the zygote: code unknown
        wait_until(lambda: replaced(served, before, first) is not None, 60)
    assert f"replica {first} failed (process exited with code -255)" in caplog.text
    assert "is gone; starting another" in caplog.text and forks.restarts == 1
    plain = replaced(served, before, first)
    assert plain is not None and parent(plain) == os.getpid()  # spawned meanwhile
    assert forks.zygote_pid not in (None, zygote)
    assert asyncio.run(forks.wait_ready())
    now = pids(served)
    os.kill(other, signal.SIGKILL)
    wait_until(lambda: replaced(served, now, second) is not None, 60)
    forked = replaced(served, now, second)
    assert forked is not None and parent(forked) == forks.zygote_pid  # the new zygote's
    assert answers(served)


def load_error(server: RunningServer) -> str:
    with Client(server.url) as client:
        client.set_replicas("broken", 1)
        wait_until(lambda: model_state(client, "broken")["load_error"] is not None, 60)
        return str(model_state(client, "broken")["load_error"])


@pytest.mark.parametrize("fork_server", [True, False], ids=["forked", "spawned"])
def test_a_model_that_fails_to_load_reports_its_error_forked_or_spawned(
        tmp_path: Path, fork_server: bool) -> None:
    server = serve(tmp_path, fork_server)
    try:
        forks = server.system._forks
        assert (forks is not None) is fork_server
        error = load_error(server)
        assert error == ("model 'broken' (python:broken_models:Broken) failed to load: "
                         "python:broken_models:Broken: constructor raised RuntimeError: "
                         "no weights in this container")
        if forks is not None:
            assert forks.forked >= 3 and forks.spawned == 0  # echo's 2, broken's 1 or more
        log = (tmp_path / "logs").glob("broken*.log")
        assert any("no weights in this container" in p.read_text() for p in log)
    finally:
        server.stop()


def test_with_fork_server_off_replicas_are_spawned_as_before(tmp_path: Path) -> None:
    server = serve(tmp_path, fork_server=False)
    try:
        assert server.system._forks is None
        for pid in pids(server).values():
            assert parent(pid) == os.getpid()
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            assert b"parityserve.runtime.workers.worker" in argv
            assert environ(pid)[b"OMP_NUM_THREADS"] == b"2"
        assert answers(server)
    finally:
        server.stop()
