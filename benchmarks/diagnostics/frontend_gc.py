"""Does the serving frontend's own garbage collector make the testbed's tail? A look inside.

ParM k = 2 on the EMULATED testbed with no shuffles at all measured a p99.9 of about 70 ms
at a 34 ms median, where the simulator of the same deployment says 41 ms. This runs that
case (``benchmarks.parm_testbed``, no shuffles, one repetition per mode) with a
``gc.callbacks`` hook in the frontend process only, and records every cyclic-GC pass it makes
once serving has begun (after ``server._tune_gc_for_serving`` froze the startup heap): its
generation, how long it took, and how many unreachable objects it freed.

``--tree`` runs the testbed from another checkout of the project, so the code before a change
can be measured beside the code after it (``git worktree add /tmp/before REV``):

    python benchmarks/diagnostics/frontend_gc.py --data-dir ../shared/data \\
        --tree before=/tmp/before --tree after=.

Writes ``benchmarks/results/frontend-gc/frontend-gc.{json,md}``. The hook is a
``sitecustomize`` module put first on ``PYTHONPATH`` for the testbed's processes; nothing in
the project changes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.frontend_cases import default_data_dir  # noqa: E402
from benchmarks.report import markdown_table, write_results  # noqa: E402

# The hook: in the process started as ``parityserve ... start``, one JSON line per collector
# pass once the startup heap is frozen (gc.get_freeze_count() > 0: serving has begun).
_HOOK = '''
import gc, json, os, sys, time
_t = {}
def _serving():
    argv = getattr(sys, "argv", None) or []
    return "start" in argv and gc.get_freeze_count() > 0
def _cb(phase, info):
    if phase == "start":
        _t["t"] = time.perf_counter()
        return
    t0 = _t.pop("t", None)
    if t0 is None or not _serving():
        return
    line = {"gen": info["generation"], "ms": (time.perf_counter() - t0) * 1000,
            "collected": info["collected"],
            "code": getattr(sys.modules.get("parityserve"), "__file__", None)}
    with open(os.path.join(os.environ["FRONTEND_GC_LOG"], f"{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\\n")
gc.callbacks.append(_cb)
'''


def main() -> int:
    args = _parser().parse_args()
    trees = [_tree(spec) for spec in args.tree] or [("this tree", ROOT)]
    rows = [_measure(label, tree, mode, args) for label, tree in trees for mode in args.modes]
    command = "python benchmarks/diagnostics/frontend_gc.py " + " ".join(sys.argv[1:])
    report = {"rate": args.rate, "queries": args.queries, "rows": rows}
    md = _markdown(report)
    print(md)
    write_results("frontend-gc", report, results_dir=args.results_dir, markdown=md,
                  command=command)
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=Path, default=default_data_dir())
    p.add_argument("--modes", type=lambda s: s.split(","), default=["equal-resources", "parm"],
                   help="testbed modes, one run each (default equal-resources,parm)")
    p.add_argument("--rate", type=float, default=150.0)
    p.add_argument("--queries", type=int, default=5000)
    p.add_argument("--tree", action="append", default=[], metavar="LABEL=DIR",
                   help="a checkout to run the testbed from (repeat for an A/B; default: "
                        "this one)")
    p.add_argument("--results-dir", type=Path, default=Path("benchmarks/results/frontend-gc"))
    return p


def _tree(spec: str) -> tuple[str, Path]:
    label, sep, where = spec.partition("=")
    path = Path(where).resolve()
    if not sep or not (path / "benchmarks" / "parm_testbed.py").is_file():
        raise SystemExit(f"--tree {spec!r}: give LABEL=DIR, DIR a checkout of this project")
    return label, path


def _measure(label: str, tree: Path, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="frontend-gc-") as tmp:
        work = Path(tmp)
        (work / "hook").mkdir()
        (work / "hook" / "sitecustomize.py").write_text(_HOOK)
        (work / "log").mkdir()
        env = {**os.environ, "PYTHONPATH": str(work / "hook"),
               "FRONTEND_GC_LOG": str(work / "log")}
        cmd = [sys.executable, "-m", "benchmarks.parm_testbed", "--data-dir",
               str(args.data_dir.resolve()), "--modes", mode, "--ks", "2", "--rates",
               f"{args.rate:g}", "--shuffles", "0", "--repeats", "1", "--queries",
               str(args.queries), "--results-dir", str(work / "results")]
        print(f"== {label}: {mode}, {args.queries} queries at {args.rate:g} q/s", flush=True)
        subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
        point = json.loads((work / "results" / "parm-testbed.json").read_text())["points"][0]
        passes = [json.loads(line) for f in (work / "log").glob("*.jsonl")
                  for line in f.read_text().splitlines()]
    _check_code(passes, tree)
    return _row(label, mode, point, passes)


def _check_code(passes: list[dict[str, Any]], tree: Path) -> None:
    """Refuse a run whose frontend imported parityserve from anywhere but ``tree`` (an
    installed copy ahead of the checkout would measure the wrong code)."""
    elsewhere = {p["code"] for p in passes if not str(p["code"]).startswith(f"{tree}{os.sep}")}
    if elsewhere:
        raise SystemExit(f"the frontend ran parityserve from {sorted(elsewhere)}, not {tree}")


def _row(label: str, mode: str, point: dict[str, Any], passes: list[dict[str, Any]]
         ) -> dict[str, Any]:
    ms = np.array([p["ms"] for p in passes]) if passes else np.zeros(0)
    n = int(point.get("n") or 0)
    return {"tree": label, "case": point["case"], "mode": mode, "n": n,
            "p50_ms": point["p50_ms"], "p99_ms": point["p99_ms"], "p999_ms": point["p999_ms"],
            "passes": "/".join(str(sum(p["gen"] == g for p in passes)) for g in (0, 1, 2)),
            "pause_ms_median": float(np.median(ms)) if len(ms) else 0.0,
            "pause_ms_max": float(ms.max()) if len(ms) else 0.0,
            "pause_ms_total": float(ms.sum()),
            "freed_per_query": sum(p["collected"] for p in passes) / n if n else 0.0}


_COLUMNS = [("tree", "tree", "s"), ("case", "case", "s"), ("n", "queries", "d"),
            ("p50_ms", "p50 ms", ".2f"), ("p99_ms", "p99 ms", ".2f"),
            ("p999_ms", "p99.9 ms", ".2f"), ("passes", "GC passes, gen 0/1/2", "s"),
            ("pause_ms_median", "pause median ms", ".1f"),
            ("pause_ms_max", "pause max ms", ".1f"), ("pause_ms_total", "pauses, total ms", ".0f"),
            ("freed_per_query", "freed objects per query", ".1f")]


def _markdown(report: dict[str, Any]) -> str:
    return "\n".join([
        "# The serving frontend's cyclic-GC passes on the EMULATED testbed", "",
        f"No shuffles, {report['rate']:g} q/s, {report['queries']} queries per run, one run "
        "per row, so each p99.9 stands on about queries / 1000 answers. Passes are counted "
        "in the frontend process from the moment it froze its startup heap until it "
        "stopped; 'freed' is what the collector found unreachable: garbage held in "
        "reference cycles, which reference counting alone never frees.", "",
        markdown_table(report["rows"], _COLUMNS), ""])

if __name__ == "__main__":
    sys.exit(main())
