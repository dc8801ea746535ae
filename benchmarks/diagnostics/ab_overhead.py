"""Before/after: `parityserve bench overhead` on two versions of the code, interleaved.

A change that must not slow serving down (issue 16 allows at most 5%) is judged by running
the same benchmark on the old tree and the new one in turns, in one session, so that the
machine's drift (other load, thermal state, caches) hits both alike. Each round runs
`bench overhead` once per tree, alternating which goes first; the bare Starlette app that
`bench overhead` measures in every run is reported too, as the control: if the bare app
moved as much as parityserve did, the difference is the machine, not the change.

    python benchmarks/diagnostics/ab_overhead.py --before 5f43751 --rounds 3 --models mlp \
        --data-dir ../shared/data

``--before`` (and ``--after``) take a git ref, checked out into a temporary worktree, or a
directory holding a checkout; ``--after`` defaults to this checkout. Both run with this
checkout's interpreter and packages, with ``PYTHONPATH`` at their tree (worker processes
inherit it). Results: ``benchmarks/results/ab-overhead/`` (JSON, markdown table, plot, the
command). A stopped run resumes: finished runs are kept in the JSON and skipped.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SYSTEMS = ("parityserve", "bare")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out = args.results_dir.resolve()  # the runs execute with their tree as the working directory
    out.mkdir(parents=True, exist_ok=True)
    state_path = out / "ab-overhead.json"
    state = _load(state_path, args)
    with _tree(args.before) as before, _tree(args.after) as after:
        trees = {"before": before, "after": after}
        for round_ in range(args.rounds):
            order = ("before", "after") if round_ % 2 == 0 else ("after", "before")
            for label in order:
                key = f"{label}-{round_}"
                if key in state["runs"]:
                    continue
                print(f"round {round_ + 1}/{args.rounds}: {label} ({trees[label]})", flush=True)
                state["runs"][key] = _one_run(trees[label], args, out / ".work" / key)
                state_path.write_text(json.dumps(state, indent=2))
    summary = summarise(state["runs"], args.models.split(","))
    state["summary"] = summary
    state_path.write_text(json.dumps(state, indent=2))
    (out / "ab-overhead.md").write_text(_markdown(state, summary))
    _plot(state["runs"], args.models.split(","), out / "ab-overhead.png")
    print((out / "ab-overhead.md").read_text())
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--before", required=True, help="git ref or checkout directory")
    p.add_argument("--after", default=".", help="git ref or checkout directory (default: .)")
    p.add_argument("--rounds", type=int, default=3, help="runs per tree (default: 3)")
    p.add_argument("--models", default="mlp", help="bench overhead --models (default: mlp)")
    p.add_argument("--rates", default="100", help="offered loads; the first is the low-load "
                   "point compared (default: 100)")
    p.add_argument("--queries", type=int, default=2000, help="queries per rate")
    p.add_argument("--saturation-queries", type=int, default=3000)
    p.add_argument("--data-dir", type=Path, help="datasets and weights (the mlp case)")
    p.add_argument("--results-dir", type=Path, default=Path("benchmarks/results/ab-overhead"))
    return p


def _load(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    command = " ".join(["python", "benchmarks/diagnostics/ab_overhead.py",
                        *map(shlex.quote, sys.argv[1:])])
    fresh = {"command": command, "before": args.before, "after": args.after, "runs": {}}
    if not path.exists():
        return fresh
    saved = json.loads(path.read_text())
    same = all(saved.get(k) == fresh[k] for k in ("before", "after"))
    return {**saved, "command": command} if same else fresh


@contextmanager
def _tree(ref: str) -> Iterator[Path]:
    """A directory holding the code at ``ref``: the directory itself, or a temporary worktree."""
    if Path(ref).is_dir():
        yield Path(ref).resolve()
        return
    with tempfile.TemporaryDirectory(prefix="ab-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref],
                       check=True, capture_output=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           check=False, capture_output=True)


def _one_run(tree: Path, args: argparse.Namespace, results: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "parityserve.cli", "bench", "overhead", "--models", args.models,
           "--rates", args.rates, "--queries", str(args.queries), "--saturation-queries",
           str(args.saturation_queries), "--repeats", "1", "--results-dir", str(results)]
    if args.data_dir is not None:
        cmd += ["--data-dir", str(args.data_dir.resolve())]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run(cmd, check=True, env=env, cwd=tree)
    report = json.loads((results / "overhead.json").read_text())
    return {model: _points(report["models"][model]) for model in report["models"]}


def _points(model: dict[str, Any]) -> dict[str, Any]:
    """Per system: p50/p99/p99.9 at the lowest rate, and peak throughput at saturation."""
    finite = [p for p in model["points"] if p["rate"] is not None and math.isfinite(p["rate"])]
    low = min(p["rate"] for p in finite)
    found: dict[str, Any] = {}
    for system in SYSTEMS:
        at_low = next(p for p in finite if p["system"] == system and p["rate"] == low)
        peak = model["peak"][system]  # the saturation run is reported apart from the points
        found[system] = {"rate": low, "n": at_low["n"], "p50_ms": at_low["p50_ms"],
                         "p99_ms": at_low["p99_ms"], "p999_ms": at_low["p999_ms"],
                         "peak_qps": peak["throughput_qps"], "peak_n": peak["n"]}
    return found


def summarise(runs: dict[str, Any], models: list[str]) -> dict[str, Any]:
    """Medians over rounds per tree, and after/before ratios, per model and system."""
    summary: dict[str, Any] = {}
    for model in models:
        for system in SYSTEMS:
            row: dict[str, Any] = {}
            for label in ("before", "after"):
                mine = [r[model][system] for k, r in runs.items()
                        if k.startswith(label + "-") and model in r]
                if not mine:
                    continue
                for metric in ("peak_qps", "p50_ms", "p99_ms", "p999_ms"):
                    row[f"{label}_{metric}"] = statistics.median(m[metric] for m in mine)
                row[f"{label}_rounds"] = len(mine)
                row["n"] = mine[0]["n"]
            if "before_peak_qps" in row and "after_peak_qps" in row:
                row["peak_ratio"] = row["after_peak_qps"] / row["before_peak_qps"]
                row["p50_ratio"] = row["after_p50_ms"] / row["before_p50_ms"]
            summary[f"{model}/{system}"] = row
    return summary


def _markdown(state: dict[str, Any], summary: dict[str, Any]) -> str:
    lines = ["# Before/after: bench overhead, interleaved", "",
             f"Command: `{state['command']}`", "",
             f"before = `{state['before']}`, after = `{state['after']}`. Medians over rounds; "
             "p50/p99/p99.9 at the lowest offered rate (n queries per run), peak = throughput "
             "at saturation. `bare` is the control: the same Starlette app in both columns.", "",
             "| model / system | rounds | peak q/s before | peak q/s after | ratio | "
             "p50 ms before | p50 ms after | ratio | p99 ms b/a | p99.9 ms b/a | n |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in summary.items():
        if "peak_ratio" not in r:
            continue
        lines.append(
            f"| {name} | {r['before_rounds']}/{r['after_rounds']} | {r['before_peak_qps']:.0f} "
            f"| {r['after_peak_qps']:.0f} | {r['peak_ratio']:.3f} | {r['before_p50_ms']:.3f} "
            f"| {r['after_p50_ms']:.3f} | {r['p50_ratio']:.3f} | {r['before_p99_ms']:.2f} / "
            f"{r['after_p99_ms']:.2f} | {r['before_p999_ms']:.2f} / {r['after_p999_ms']:.2f} "
            f"| {r['n']} |")
    return "\n".join(lines) + "\n"


def _plot(runs: dict[str, Any], models: list[str], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: no plot (matplotlib is in the [bench] extra)", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric, title in ((axes[0], "peak_qps", "peak throughput, q/s"),
                              (axes[1], "p50_ms", "p50 at the lowest rate, ms")):
        for i, label in enumerate(("before", "after")):
            for j, model in enumerate(models):
                values = [r[model]["parityserve"][metric] for k, r in sorted(runs.items())
                          if k.startswith(label + "-") and model in r]
                ax.scatter([j * 3 + i] * len(values), values, label=f"{model} {label}")
        ax.set_title(title)
        ax.set_xticks([])
        ax.legend(fontsize=8)
    fig.suptitle("parityserve, before and after (each dot one interleaved run)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
