"""A member that used CPU during its silence is busy, not hung (``Watch._ran_while_quiet``):
its threads' states are one instant, and a make test saw a healthy primary, starved in a
full garbage collection (threads RRRSSS by its own report), asleep again when the frontend
looked at 214 ms, and fenced. Real child processes: one that spins while it is quiet and one
that only sleeps."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

import pytest

from parityserve.runtime.graphs.hams_stall import cpu_ticks
from parityserve.runtime.graphs.hams_watch import Watch

# says it is ready, spins for 0.4 s of CPU (or not), then sleeps
CHILD = """
import sys, time
print("ready", flush=True)
spin = float(sys.argv[1])
t = time.process_time()
while time.process_time() - t < spin:
    pass
time.sleep(60)
"""


def _child(spin_s: float) -> subprocess.Popen[str]:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(spin_s)],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


def _stop(child: subprocess.Popen[str]) -> None:
    child.kill()
    child.wait()
    assert child.stdout is not None
    child.stdout.close()


def _watch(member: Any) -> Watch:
    ctx = SimpleNamespace(graph=SimpleNamespace(heartbeat_timeout_ms=200, detection="timeout"),
                          plan=None)
    return Watch(ctx, SimpleNamespace(by_id={member.worker_id: ("op", member)}),  # type: ignore[arg-type]
                 None, None, None)  # type: ignore[arg-type]


def _member(pid: int) -> Any:
    return SimpleNamespace(worker_id="g/op/primary-1", pid=pid, on_this_host=True,
                           last_beat=10.0, hello=SimpleNamespace(done=lambda: True),
                           exited=lambda: False)


@pytest.mark.parametrize(("spin_s", "verdict"), [(0.4, None), (0.0, "timeout")])
def test_a_member_that_ran_while_quiet_gets_the_grace_and_an_idle_one_does_not(
        spin_s: float, verdict: str | None) -> None:
    child = _child(spin_s)
    try:
        member = _member(child.pid)
        watch = _watch(member)
        watch._sample_quiet_cpu(member, now=10.15)  # quiet past half the limit: noted
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until it sleeps again (state S)
            time.sleep(0.05)
            with open(f"/proc/{child.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "S" and (
                        spin_s == 0 or cpu_ticks(child.pid) > watch._quiet_cpu[
                            member.worker_id][0]):
                    break
        assert watch._loss(member, 10.25, hearing=True) == verdict
        # it worked early in its silence, then nothing: one interval later the reading has
        # moved on, and the timeout holds (not the whole starvation grace)
        assert watch._loss(member, 10.31, hearing=True) == "timeout"
    finally:
        _stop(child)


def test_speaking_again_clears_the_note_and_a_gone_process_has_no_ticks() -> None:
    child = _child(0.0)
    member = _member(child.pid)
    watch = _watch(member)
    watch._sample_quiet_cpu(member, now=10.15)
    assert member.worker_id in watch._quiet_cpu
    watch._sample_quiet_cpu(member, now=10.05)  # heard within half the limit
    assert watch._quiet_cpu == {}
    _stop(child)
    assert cpu_ticks(child.pid) is None
