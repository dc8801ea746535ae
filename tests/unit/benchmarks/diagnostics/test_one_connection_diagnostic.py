"""The one-connection diagnostic (benchmarks/diagnostics/one_connection.py): its medians, the
tail of the median round, and the report's differences to the bare app."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.diagnostics import one_connection as diagnostic


def _run(p50: float, frontend: float, worker: float = 0.0, n: int = 1000) -> dict[str, float]:
    return {"requests": n, "p50_ms": p50, "p99_ms": p50 * 2, "p999_ms": p50 * 3,
            "frontend_cpu_us_per_request": frontend, "worker_cpu_us_per_request": worker}


def test_summary_takes_medians_and_the_median_rounds_tail() -> None:
    row = diagnostic.summary([_run(0.3, 100, n=1), _run(0.1, 300, n=2), _run(0.2, 200, n=3)])
    assert (row["p50_ms"], row["frontend_us"]) == (0.2, 200)
    assert (row["p99_ms"], row["requests"]) == (0.4, 3)  # the round whose p50 is the median
    assert row["rounds_p50_ms"] == [0.3, 0.1, 0.2]


def test_report_puts_each_system_against_the_bare_app() -> None:
    state = {"command": "python benchmarks/diagnostics/one_connection.py --quick",
             "machine": {"cpu_model": "x", "cpu_count": 2, "date": "today"},
             "runs": {"v2-binary": {"bare": [_run(0.15, 140)],
                                    "floor": [_run(0.48, 350, 120)]}}}
    text = diagnostic.report(state)
    assert "| v2-binary | bare | 0.150 | +0.000 |" in text
    assert "| v2-binary | floor | 0.480 | +0.330 |" in text
    assert text.rstrip().endswith("today")
    assert "| 350 | 120 | +330 |" in text  # 350 + 120 - 140


def test_an_unknown_route_is_a_clear_error() -> None:
    done = subprocess.run([sys.executable, diagnostic.__file__, "--routes", "v3-binary"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown route(s) v3-binary" in done.stderr


def test_a_system_answering_errors_stops_the_run(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    """Numbers from a server that answered errors are not comparable: the run stops, saying
    which system and how many (wrk, the server and /proc are stood in for)."""
    stopped: list[object] = []
    monkeypatch.setattr(diagnostic.fw, "_start", lambda *a: (SimpleProc(), 0))
    monkeypatch.setattr(diagnostic.fw, "_stop", stopped.append)
    monkeypatch.setattr(diagnostic.fw, "_wrk", lambda *a: None)
    monkeypatch.setattr(diagnostic.fw, "_cpu_ticks", lambda pid: {"frontend": 0, "worker": 0})
    run = {"requests": 100, "socket_errors": 0, "status_errors": 7, "p50_us": 200,
           "p99_us": 400, "p999_us": 900}
    monkeypatch.setattr(diagnostic.fw, "run_wrk", lambda *a: (run, 0.0))
    case = diagnostic.load_case("noop", None)
    with pytest.raises(SystemExit, match="floor answered 7 of 100 requests with an error"):
        diagnostic._measure("floor", "v2-binary", case, {}, tmp_path / "x.lua", tmp_path, 1.0)
    assert len(stopped) == 1  # the server is stopped all the same


class SimpleProc:
    pid = 0
