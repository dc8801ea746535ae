"""The frontend GC diagnostic (benchmarks/diagnostics/frontend_gc.py): its hook records the
serving process's collector passes and only those, its summary, and its refusal of a --tree
that is no checkout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.diagnostics import frontend_gc as diagnostic

_ROOT = Path(__file__).parents[4]

# A stand-in for the server: cycles made before the startup heap is frozen are not counted,
# cycles made after it are.
_PROGRAM = """
import gc, sys
sys.argv = ["parityserve", "start"] if sys.argv[1] == "serve" else ["other"]
class Node:
    pass
def cycles(n):
    for _ in range(n):
        a, b = Node(), Node()
        a.b, b.a = b, a
cycles(50)
gc.collect()
gc.freeze()
cycles(100)
gc.collect()
"""


@pytest.mark.parametrize(("role", "expected"), [("serve", 200), ("other", 0)])
def test_the_hook_records_the_serving_processes_passes_after_the_freeze(
        tmp_path: Path, role: str, expected: int) -> None:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(diagnostic._HOOK)
    log = tmp_path / "log"
    log.mkdir()
    subprocess.run([sys.executable, "-c", _PROGRAM, role], check=True,
                   env={"PYTHONPATH": str(hook), "FRONTEND_GC_LOG": str(log)})
    passes = [json.loads(line) for f in log.glob("*.jsonl") for line in f.read_text().splitlines()]
    # The 100 two-object cycles made after the freeze, and not the 50 made before it (the
    # interpreter's own pass at exit, which frees nothing here, is a pass like any other).
    assert sum(p["collected"] for p in passes) == expected
    assert all(p["gen"] == 2 and p["ms"] >= 0 for p in passes)
    assert bool(passes) == bool(expected)


def test_a_run_of_code_from_outside_the_tree_is_refused(tmp_path: Path) -> None:
    tree = tmp_path / "checkout"
    inside = {"gen": 0, "ms": 1.0, "collected": 1, "code": f"{tree}/parityserve/__init__.py"}
    diagnostic._check_code([inside], tree)
    outside = {**inside, "code": "/site-packages/parityserve/__init__.py"}
    with pytest.raises(SystemExit, match="ran parityserve from .*site-packages"):
        diagnostic._check_code([inside, outside], tree)


def test_a_run_is_summarised_by_generation_pause_and_garbage_per_query() -> None:
    point = {"case": "parm-k2", "n": 1000, "p50_ms": 34.0, "p99_ms": 50.0, "p999_ms": 70.0}
    passes = [{"gen": 0, "ms": 10.0, "collected": 12000}, {"gen": 0, "ms": 20.0,
                                                            "collected": 12000},
              {"gen": 1, "ms": 60.0, "collected": 14000}]
    row = diagnostic._row("before", "parm", point, passes)
    assert row["passes"] == "2/1/0"
    assert (row["pause_ms_median"], row["pause_ms_max"], row["pause_ms_total"]) == (
        20.0, 60.0, 90.0)
    assert row["freed_per_query"] == pytest.approx(38.0)
    assert diagnostic._row("after", "parm", point, [])["passes"] == "0/0/0"


def test_a_tree_that_is_no_checkout_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="give LABEL=DIR"):
        diagnostic._tree(f"before={tmp_path}")
    with pytest.raises(SystemExit, match="give LABEL=DIR"):
        diagnostic._tree(str(_ROOT))  # no label
    assert diagnostic._tree(f"here={_ROOT}") == ("here", _ROOT)
