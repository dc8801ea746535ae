"""frontend_profile.py's cProfile mode: the hook it puts on the server's path profiles only
a process whose argv[0] is the ``parityserve`` script, between SIGUSR1 and SIGUSR2, and the
report divides every count and time by the requests answered."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.diagnostics import frontend_profile as diagnostic

# A stand-in for the server: named like it, busy in one function until told to stop.
_SERVER = """
import os, signal, sys, time
def handle_one(): return sum(range(50))
done = []
signal.signal(signal.SIGTERM, lambda *_: done.append(1))
print("up", flush=True)
while not done:
    handle_one()
    time.sleep(0.0005)
"""


def test_the_hook_profiles_the_frontend_between_the_signals(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "results" / "frontend.prof"
    monkeypatch.setattr(os, "environ", dict(os.environ))
    diagnostic._install_cprofile_hook(tmp_path, out)
    script = tmp_path / "parityserve"
    script.write_text(_SERVER)
    server = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                              env=os.environ)
    try:
        assert server.stdout is not None and server.stdout.readline() == b"up\n"
        server.send_signal(signal.SIGUSR1)
        time.sleep(0.3)
        server.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 10
        while not out.exists():
            assert time.monotonic() < deadline, "no profile written"
            time.sleep(0.05)
    finally:
        server.terminate()
        server.communicate(timeout=10)  # reaps it and closes its pipe
    diagnostic._print_per_request(out, requests=10, top=5)
    text = (tmp_path / "results" / "frontend.prof.txt").read_text()
    assert "10 requests" in text and "handle_one" in text
    calls = next(line for line in text.splitlines() if line.endswith(" handle_one"))
    assert float(calls.split()[0]) > 1  # each of its many calls counted, per request


def test_other_processes_are_left_alone(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "environ", dict(os.environ))
    diagnostic._install_cprofile_hook(tmp_path, tmp_path / "x.prof")
    probe = "import signal; print(signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=os.environ, check=True)
    assert done.stdout.strip() == "True"


def test_a_server_that_writes_no_profile_stops_the_run_with_where_it_looked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server never renames a profile into place (it died, or the hook did not load):
    the harness says so after its wait instead of hanging or reading a partial file."""
    clock = iter([0.0, 10.0, 31.0])
    monkeypatch.setattr(diagnostic.os, "kill", lambda pid, sig: None)
    monkeypatch.setattr(diagnostic.fw, "_wrk", lambda *a: {"requests": 5})
    monkeypatch.setattr(diagnostic.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(diagnostic.time, "sleep", lambda s: None)
    args = argparse.Namespace(seconds=1.0, out=tmp_path / "never.prof")
    with pytest.raises(SystemExit, match="the server wrote no profile to .*never.prof"):
        diagnostic._cprofile_run(1, "http://x/", {}, tmp_path / "b.lua", args)
