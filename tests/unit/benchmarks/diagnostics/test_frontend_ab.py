"""The tree A/B diagnostic (benchmarks/diagnostics/frontend_ab.py): what it accepts as a tree
and how it reports rounds as medians and ratios to the first tree."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks.diagnostics import frontend_ab


def test_a_tree_is_name_equals_a_parityserve_checkout(tmp_path: Path) -> None:
    name, where = frontend_ab._tree(f"here={frontend_ab.ROOT}")
    assert (name, where) == ("here", frontend_ab.ROOT)
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=PATH"):
        frontend_ab._tree(str(frontend_ab.ROOT))
    with pytest.raises(argparse.ArgumentTypeError, match="holds no parityserve package"):
        frontend_ab._tree(f"empty={tmp_path}")


def _run(rps: float, cpu: float | None = 100.0) -> dict[str, float | None]:
    return {"rps": rps, "frontend_cpu_us_per_request": cpu, "worker_cpu_us_per_request": 9.0,
            "mean_batch": 16.0, "p50_1conn_ms": 0.4}


def test_the_report_gives_medians_and_ratios_to_the_first_tree() -> None:
    state = {"command": "python benchmarks/diagnostics/frontend_ab.py ...", "machine": "m",
             "trees": {"before": "/tmp/before", "after": "."}, "routes": ["clipper-json"],
             "runs": {"clipper-json/before": [_run(1000), _run(1200), _run(1100)],
                      "clipper-json/after": [_run(1320), _run(1210, None), _run(1400)]}}
    text = frontend_ab.report(state)
    assert "| clipper-json | before | 1,100 | [1000, 1200, 1100] | 1.000 | 100 |" in text
    assert "| clipper-json | after | 1,320 | [1320, 1210, 1400] | 1.200 | 100 |" in text
    assert "vs before" in text
