"""The frontend CPU diagnostic (benchmarks/diagnostics/frontend_cpu.py): its sample split and
its refusal to run --py-spy without py-spy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.diagnostics import frontend_cpu as diagnostic


def test_split_counts_main_thread_samples_by_first_bucket(tmp_path: Path) -> None:
    main = "Runner.run (asyncio/runners.py:118);serve (parityserve/runtime/server.py:151)"
    raw = tmp_path / "raw.txt"
    raw.write_text("\n".join([
        f"{main};_Frontend.predict (parityserve/runtime/frontend/http.py:503) 6",
        f"{main};WorkerLink._receive_pass (parityserve/runtime/workers/rpc.py:103) 3",
        f"{main};RequestResponseCycle.send (uvicorn/x.py:1) 1",
        "GarbageCollectorThread.run (zmq/utils/garbage.py:56) 90",  # another thread
    ]))
    assert diagnostic.split_samples(raw) == pytest.approx(
        {"serving path (_Frontend.predict)": 0.6,
         "worker RPC (WorkerLink._receive_pass)": 0.3, "the rest": 0.1})


def test_py_spy_missing_is_a_clear_error(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, diagnostic.__file__, "--py-spy", "--out", str(tmp_path)],
                          capture_output=True, text=True, env={"PATH": str(tmp_path)},
                          timeout=60)
    assert done.returncode == 2
    assert "--py-spy needs py-spy on PATH" in done.stderr
    assert not (tmp_path / "frontend-cpu.json").exists()
