"""The wrk harness (benchmarks/frontend_wrk.py): what it makes of wrk's numbers and how it
summarises rounds into ratios against the bare app and LitServe."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

_SCRIPT = Path(__file__).parents[2] / "benchmarks" / "frontend_wrk.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("frontend_wrk", _SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rates_count_only_answered_requests() -> None:
    rates = _module()._rates({"requests": 1000, "duration_us": 2_000_000, "socket_errors": 10,
                              "status_errors": 90, "p50_us": 1500, "p99_us": 4000,
                              "p999_us": 9000})
    assert rates["rps"] == 450 and rates["errors"] == 100
    assert (rates["p50_ms"], rates["p99_ms"], rates["p999_ms"]) == (1.5, 4.0, 9.0)


def _point(rps: float, p50: float) -> dict:
    return {"rps": rps, "requests": 1000, "p50_ms": 1.0, "p99_ms": 2.0, "p999_ms": 3.0,
            "p50_1conn_ms": p50, "frontend_cpu_us_per_request": 100.0,
            "worker_cpu_us_per_request": 5.0}


def test_summary_takes_medians_and_ratios_to_bare_and_litserve() -> None:
    points = {"0/bare/clipper-json/distinct": _point(4000, 0.3),
              "1/bare/clipper-json/distinct": _point(4400, 0.2),
              "0/litserve/clipper-json/distinct": _point(800, 1.0),
              "0/parityserve/clipper-json/distinct": _point(3000, 0.5),
              "1/parityserve/clipper-json/distinct": _point(2600, 0.6),
              "0/bare/v2-binary/distinct": _point(5000, 0.2),
              "0/parityserve/grpc/distinct": _point(2500, 0.4)}
    rows = {(r["system"], r["route"]): r for r in _module().summarise(points)}
    ours = rows["parityserve", "clipper-json"]
    assert ours["rps"] == 2800 and ours["rps_rounds"] == [3000, 2600]
    assert ours["vs_bare"] == pytest.approx(2800 / 4200)
    assert ours["vs_litserve"] == pytest.approx(3.5)
    assert ours["p50_over_bare_ms"] == pytest.approx(0.55 - 0.25)
    assert rows["parityserve", "grpc"]["vs_bare"] == pytest.approx(0.5)  # vs V2 binary
