"""A process started by a Ray actor takes its frontend's niceness (``workers.niceness``), on
every thread, or says why it cannot; and ``fleet.processes.wait_child``, the actors' long-poll
on their child. Real processes: niceness is the kernel's."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from parityserve.runtime.fleet.processes import niceness_env, wait_child
from parityserve.runtime.workers.niceness import NICENESS_ENV, take_niceness


def _child(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=60, check=True)


def test_every_thread_takes_the_niceness_asked_for() -> None:
    out = _child(f"""
        import os, threading
        from parityserve.runtime.workers.niceness import take_niceness
        started = threading.Event()
        threading.Thread(target=lambda: (started.set(), threading.Event().wait()),
                         daemon=True).start()  # a library's thread, there before main runs
        started.wait()
        assert take_niceness({{"{NICENESS_ENV}": "7"}}) is None
        later = []
        t = threading.Thread(target=lambda: later.append(os.getpriority(os.PRIO_PROCESS, 0)))
        t.start(); t.join()
        print(sorted({{os.getpriority(os.PRIO_PROCESS, int(tid))
                      for tid in os.listdir("/proc/self/task")}}), later)
    """)
    assert out.stdout.split() == ["[7]", "[7]"]


def test_a_process_that_may_not_raise_its_priority_says_so_and_goes_on() -> None:
    # Ray's worker at 15 asked for the frontend's 0, without CAP_SYS_NICE: root drops to
    # nobody first, with no niceness allowance (RLIMIT_NICE 0), as an ordinary user has
    out = _child(f"""
        import os, resource
        from parityserve.runtime.workers.niceness import take_niceness
        os.setpriority(os.PRIO_PROCESS, 0, 15)
        resource.setrlimit(resource.RLIMIT_NICE, (0, 0))
        if os.geteuid() == 0:
            os.setgid(65534); os.setuid(65534)
        said = take_niceness({{"{NICENESS_ENV}": "0"}})
        print("RESULT", os.getpriority(os.PRIO_PROCESS, 0), said)
    """)
    result = out.stdout.split("RESULT ", 1)[1]
    assert result.startswith("15 runs at niceness 15, not its frontend's 0")
    assert "RAY_worker_niceness=0" in out.stderr  # the operator's log says how to fix it


def test_nothing_asked_nothing_done_and_a_bad_value_is_named() -> None:
    assert take_niceness({}) is None
    said = take_niceness({NICENESS_ENV: "high"})
    assert said is not None and "'high' is not an integer" in said


def test_the_frontend_passes_its_own_niceness() -> None:
    import os

    assert niceness_env() == {NICENESS_ENV: str(os.getpriority(os.PRIO_PROCESS, 0))}


def test_wait_child_returns_the_exit_code_as_the_child_exits() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3); exit(3)"])
    assert wait_child(child, 0.01) is None  # still running: None after the timeout
    started = time.monotonic()
    assert wait_child(child, 30) == 3
    assert time.monotonic() - started < 10  # woken by the exit, not by the 30 s timeout
    assert wait_child(child, 30) == 3  # reaped already: at once


def test_wait_child_sees_a_sigkill() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    child.kill()
    assert wait_child(child, 30) == -9
