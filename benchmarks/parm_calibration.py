"""``python -m benchmarks.parm_calibration``: set the testbed's shuffle slowdown from ParM's
own numbers, measuring the baseline alone.

Why: ParM (section 6.1) says what a background shuffle is (two instances, 128-256 MB) but not
what it does to one query on the busy link, so ``benchmarks.parm_testbed`` needs a slowdown
of its own (``--shuffle-delay-ms``, with ``--shuffle-delay-distribution``). Its first default,
a constant 50 ms on every batch, was a guess, and it gives the baseline a far heavier tail
than ParM's cluster had. ParM does say two things about that tail (section 6.2.1, k = 2, GPU
cluster): ParM cuts the p99.9 - p50 gap by G = 2.6-3.2x against equal-resources, and its
p99.9 is c = 38-43% lower, at medians within 0.5 ms. With one median m for both, those fix
equal-resources' own p99.9 / p50:

    E - m = G (P - m),  P = (1 - c) E   =>   E / m = (G - 1) / (G (1 - c) - 1)

which is 2.24-3.32 over the corners of the ranges and 2.62 at their middles
(``paper_tail_ratio``). This experiment runs equal-resources (m + m/2 plain replicas, the
baseline ParM k = 2 is judged against) through the real testbed at a grid of slowdowns,
finds where its p99.9 / p50 crosses 2.62 for each distribution, and prints the testbed
command to run at that slowdown. **ParM's own latency is never measured here**, so the
setting cannot be tuned toward ParM's result. Every number is from the EMULATED testbed.

Each grid point is one ``benchmarks.parm_testbed`` run (its own results folder under
``RESULTS_DIR/parm-calibration/``, resumable), so a point can be rerun or inspected alone.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from benchmarks import _cli
from benchmarks import parm_testbed as testbed
from benchmarks.report import markdown_table, new_figure, save_figure, write_results

__all__ = [
    "DEFAULT_GRID",
    "add_arguments",
    "build_parser",
    "crossing",
    "floor_verdict",
    "max_gap_cut",
    "main",
    "paper_tail_ratio",
    "paper_tail_band",
    "run",
]

# ParM section 6.2.1, GPU cluster, k = 2: the gap cut and the p99.9 cut (ranges over rates)
PAPER_GAP_CUT = (2.6, 3.2)
PAPER_P999_CUT = (0.38, 0.43)
DEFAULT_GRID = {"constant": (10.0, 20.0, 30.0, 50.0), "exponential": (5.0, 10.0, 20.0, 40.0),
                "pareto": (3.0, 5.0, 8.0)}
TESTBED_RATE = testbed.RATES[0]  # what parm_testbed runs without --rates
QUICK_GRID = {"constant": (10.0, 50.0), "exponential": (5.0, 40.0), "pareto": (3.0, 8.0)}


def paper_tail_ratio(gap_cut: float, p999_cut: float) -> float:
    """Equal-resources' p99.9 / p50 implied by ParM's gap cut G and p99.9 cut c at one
    shared median (derivation in the module docstring)."""
    if gap_cut <= 1 or not 0 < p999_cut < 1:
        raise ValueError("need a gap cut above 1 and a p99.9 cut in (0, 1)")
    denominator = gap_cut * (1 - p999_cut) - 1
    if denominator <= 0:
        raise ValueError(f"G = {gap_cut} and c = {p999_cut} cannot hold at one median")
    return (gap_cut - 1) / denominator


def paper_tail_band() -> tuple[float, float, float]:
    """(lowest, middle, highest) p99.9 / p50 over the corners of ParM's two ranges; the
    middle is at the middles of both ranges."""
    corners = [paper_tail_ratio(g, c) for g in PAPER_GAP_CUT for c in PAPER_P999_CUT]
    middle = paper_tail_ratio(sum(PAPER_GAP_CUT) / 2, sum(PAPER_P999_CUT) / 2)
    return min(corners), middle, max(corners)


def crossing(points: Sequence[tuple[float, float]], target: float) -> float | None:
    """The slowdown where the tail ratio crosses ``target``, linear between the two grid
    points around it (by slowdown); None when no neighbouring pair brackets it."""
    ordered = sorted(points)
    for (d0, r0), (d1, r1) in zip(ordered, ordered[1:], strict=False):
        if min(r0, r1) <= target <= max(r0, r1):
            if r1 == r0:
                return d0
            return d0 + (target - r0) * (d1 - d0) / (r1 - r0)
    return None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", type=Path, help="datasets/weights ($PARITYSERVE_DATA)")
    p.add_argument("--constant-ms", help="comma list: constant slowdowns to try "
                   f"(default {_grid_text(DEFAULT_GRID['constant'])})")
    p.add_argument("--exponential-ms", help="comma list: exponential means to try "
                   f"(default {_grid_text(DEFAULT_GRID['exponential'])})")
    p.add_argument("--pareto-ms", help="comma list: heavy-tailed (Lomax) means to try "
                   f"(default {_grid_text(DEFAULT_GRID['pareto'])})")
    p.add_argument("--tail-index", type=float, default=2.0,
                   help="pareto: the tail index a of P(wait > d) = (1 + d/s)^-a (> 1; "
                        "smaller is heavier)")
    p.add_argument("--distributions", default="constant,exponential",
                   help="which slowdown distributions to calibrate (comma list of "
                        f"{', '.join(DEFAULT_GRID)})")
    p.add_argument("--deployed", type=int, default=12,
                   help="deployed instances m; equal-resources runs m + m/2 (ParM: 12)")
    p.add_argument("--rate", type=float, default=TESTBED_RATE,
                   help="offered q/s (the testbed's full-run rate by default)")
    p.add_argument("--shuffles", type=int, default=4,
                   help="concurrent shuffles: ParM's numbers above are for 4")
    p.add_argument("--queries", type=int, default=10_000, help="queries per point")
    p.add_argument("--repeats", type=int, default=1, help="repetitions per point (medians)")
    p.add_argument("--warmup", type=int, default=testbed.WARMUP,
                   help="queries before each point's load (the testbed's --warmup)")
    p.add_argument("--results-dir", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--quick", action="store_true",
                   help="2,000 queries and two slowdowns per distribution: checks the "
                        "harness (about 3 min estimated: 5 server starts, 10,000 queries); "
                        "not a calibration to use")
    p.add_argument("--resume", action="store_true",
                   help="reuse the grid points an earlier run saved")
    p.set_defaults(func=run)


def _folder_name(args: argparse.Namespace) -> str:
    """``parm-calibration``, marked with the rate and shuffles where they differ from the
    testbed's defaults, and ``-quick`` for a harness check."""
    name = "parm-calibration"
    if args.rate != TESTBED_RATE:
        name += f"-{args.rate:g}qps"
    if args.shuffles != 4:
        name += f"-{args.shuffles}-shuffles"
    return name + ("-quick" if args.quick else "")


def _grid_text(values: Sequence[float]) -> str:
    return ",".join(f"{v:g}" for v in values)


def _grid(args: argparse.Namespace) -> dict[str, tuple[float, ...]]:
    base = QUICK_GRID if args.quick else DEFAULT_GRID
    chosen = [d.strip() for d in args.distributions.split(",") if d.strip()]
    unknown = sorted(set(chosen) - set(DEFAULT_GRID))
    if unknown or not chosen:
        raise SystemExit(f"--distributions takes {', '.join(DEFAULT_GRID)}, got "
                         f"{args.distributions!r}")
    grid = {}
    if "pareto" in chosen and not args.tail_index > 1:
        raise SystemExit(f"--tail-index must be > 1 (a finite mean), got {args.tail_index:g}")
    for dist, given in (("constant", args.constant_ms), ("exponential", args.exponential_ms),
                        ("pareto", args.pareto_ms)):
        if dist not in chosen:
            continue
        try:
            values = tuple(float(v) for v in given.split(",") if v.strip()) if given \
                else base[dist]
        except ValueError:
            raise SystemExit(f"--{dist}-ms takes numbers, got {given!r}") from None
        if any(not (v > 0 and math.isfinite(v)) for v in values):
            raise SystemExit(f"--{dist}-ms: every slowdown must be > 0 ms, got {given!r}")
        grid[dist] = values
    return grid


def run(args: argparse.Namespace) -> int:
    if args.quick:
        args.queries = min(args.queries, 2000)
    grid = _grid(args)
    low, middle, high = paper_tail_band()
    folder = args.results_dir / _folder_name(args)
    started = time.monotonic()
    total = sum(len(v) for v in grid.values())
    print(f"== calibration: equal-resources alone, {total} slowdowns, {args.queries} queries "
          f"x {args.repeats} at {args.rate:g} q/s, {args.shuffles} shuffles; target "
          f"p99.9 / p50 = {middle:.2f} (ParM's numbers: {low:.2f}-{high:.2f}) ==", flush=True)
    floor = _grid_point(args, folder, "constant", 0.0, shuffles=0)
    rows = [_with_headroom(_grid_point(args, folder, dist, delay), floor)
            for dist, delays in grid.items() for delay in delays]
    picks = {}
    for dist in grid:
        points = [(r["delay_ms"], r["tail_ratio"]) for r in rows
                  if r["distribution"] == _dist_label(dist, args)]
        picks[dist] = crossing(points, middle)
    report = {"deployed": args.deployed, "rate": args.rate, "shuffles": args.shuffles,
              "queries_per_point": args.queries, "repeats": args.repeats, "warmup": args.warmup,
              "quick": args.quick,
              "paper": {"gap_cut": PAPER_GAP_CUT, "p999_cut": PAPER_P999_CUT,
                        "tail_ratio_band": [low, high], "tail_ratio_target": middle},
              "floor": floor, "rows": rows, "picks": picks,
              "testbed_commands": {d: _testbed_command(d, v, args) for d, v in picks.items()
                                   if v is not None},
              "wall_s": time.monotonic() - started}
    _write(folder, report)
    print("  " + floor_verdict(floor, middle).replace("**", ""), flush=True)
    for dist, value in picks.items():
        print(f"  {dist}: " + (f"{value:.1f} ms" if value is not None else
                               "not bracketed by the grid; widen it"), flush=True)
    return 0


def max_gap_cut(row: dict[str, Any], floor: dict[str, Any]) -> float | None:
    """The most any redundancy could cut this row's p99.9 - p50 gap: down to the gap the
    same baseline has with no shuffles at all (the frontend's and the machine's own tail,
    which every copy of a query shares). None when the floor has no gap."""
    floor_gap = floor["p999_ms"] - floor["p50_ms"]
    return (row["p999_ms"] - row["p50_ms"]) / floor_gap if floor_gap > 0 else None


def floor_verdict(floor: dict[str, Any], target: float) -> str:
    """Whether the machine's own tail leaves room for the calibration at all."""
    ratio = floor["tail_ratio"]
    if ratio < target:
        return (f"With no shuffles the baseline's p99.9 / p50 is {ratio:.2f}, below the "
                f"target {target:.2f}: the shuffles can be set to supply the rest.")
    return (f"**With no shuffles at all, the baseline's p99.9 / p50 is already {ratio:.2f}, "
            f"at or above the {target:.2f} that ParM's numbers imply for its baseline *with* "
            f"shuffles.** No slowdown can match ParM's baseline on this machine: its p99.9 "
            f"is this machine's own tail, which every copy of a query waits behind and no "
            f"redundancy can remove.")


def _with_headroom(row: dict[str, Any], floor: dict[str, Any]) -> dict[str, Any]:
    return {**row, "max_gap_cut": max_gap_cut(row, floor)}


def _grid_point(args: argparse.Namespace, folder: Path, dist: str, delay: float,
                shuffles: int | None = None) -> dict[str, Any]:
    """One testbed run of equal-resources at this slowdown, read back from its report;
    ``shuffles=0`` is the floor (no shuffles, so the slowdown does nothing)."""
    shuffles = args.shuffles if shuffles is None else shuffles
    out = folder / (f"{_dist_name(dist, args)}-{delay:g}ms" if shuffles else "no-shuffles")
    argv = ["--modes", "equal-resources", "--ks", "2", "--deployed", str(args.deployed),
            "--rates", f"{args.rate:g}",
            "--queries", str(args.queries), "--repeats", str(args.repeats),
            "--warmup", str(args.warmup), "--shuffles", str(shuffles),
            "--shuffle-delay-ms", f"{delay:g}", "--shuffle-delay-distribution", dist,
            "--results-dir", str(out)]
    if dist == "pareto":
        argv += ["--shuffle-tail-index", f"{args.tail_index:g}"]
    if args.data_dir is not None:
        argv += ["--data-dir", str(args.data_dir)]
    if args.resume:
        argv.append("--resume")
    testbed.run(testbed.build_parser().parse_args(argv))
    report = orjson.loads((out / "parm-testbed.json").read_bytes())
    point = next(p for p in report["points"] if p["mode"] == "equal-resources")
    return {"distribution": _dist_label(dist, args) if shuffles else "no shuffles",
            "delay_ms": delay,
            "shuffles": shuffles, "case": point["case"],
            "p50_ms": point["p50_ms"], "p99_ms": point["p99_ms"], "p999_ms": point["p999_ms"],
            "tail_ratio": point["p999_ms"] / point["p50_ms"], "n": point.get("n"),
            "folder": str(out)}


def _testbed_command(dist: str, delay: float, args: argparse.Namespace) -> str:
    deployed = f" --deployed {args.deployed}" if args.deployed != 12 else ""
    rate = f" --rates {args.rate:g}" if args.rate != TESTBED_RATE else ""
    return (f"python -m benchmarks.parm_testbed --data-dir ../shared/data{deployed}{rate} "
            f"--shuffles {args.shuffles} --shuffle-delay-distribution {dist} "
            f"--shuffle-delay-ms {round(delay * 2) / 2:g}"
            + (f" --shuffle-tail-index {args.tail_index:g}" if dist == "pareto" else ""))


def _dist_name(dist: str, args: argparse.Namespace) -> str:
    """A grid point's folder stem: pareto points carry their tail index."""
    return f"pareto-a{args.tail_index:g}" if dist == "pareto" else dist


def _dist_label(dist: str, args: argparse.Namespace) -> str:
    return f"pareto (a = {args.tail_index:g})" if dist == "pareto" else dist


_COLUMNS = [("distribution", "slowdown", "s"), ("delay_ms", "ms (mean)", "g"),
            ("case", "case", "s"), ("p50_ms", "p50 ms", ".2f"), ("p99_ms", "p99 ms", ".2f"),
            ("p999_ms", "p99.9 ms", ".2f"), ("tail_ratio", "p99.9 / p50", ".2f"),
            ("n", "answers", "d"), ("max_gap_cut", "most any redundancy can cut the gap",
                                    ".2f")]


def _write(folder: Path, report: dict[str, Any]) -> None:
    paper = report["paper"]
    low, high = paper["tail_ratio_band"]
    picks = "\n".join(
        f"- {d}: " + (f"**{v:.1f} ms**: `{report['testbed_commands'][d]}`" if v is not None
                      else "not bracketed by the grid") for d, v in report["picks"].items())
    body = f"""# Calibrating the EMULATED testbed's shuffle slowdown on the baseline alone

Equal-resources ({report['deployed']} + {report['deployed'] // 2} plain replicas) on the EMULATED testbed, {report['shuffles']} shuffles, {report['rate']:g} q/s, {report['queries_per_point']} queries x {report['repeats']} per slowdown.{' QUICK: a harness check, not a calibration.' if report['quick'] else ''}

ParM section 6.2.1 (k = 2, GPU cluster): the p99.9 - p50 gap is {paper['gap_cut'][0]:g}-{paper['gap_cut'][1]:g}x smaller with ParM and ParM's p99.9 is {paper['p999_cut'][0]:.0%}-{paper['p999_cut'][1]:.0%} lower, at one median. So equal-resources had p99.9 / p50 = (G - 1) / (G (1 - c) - 1) = {low:.2f}-{high:.2f}, **{paper['tail_ratio_target']:.2f}** at the middles. ParM's own latency is not measured here.

{markdown_table([*report['rows'], report['floor']], _COLUMNS)}

The last row runs no shuffles: its tail is the frontend's and this machine's own, which
every copy of a query shares, so no redundancy scheme can take a baseline's gap below it.
`most any redundancy can cut the gap` is each row's p99.9 - p50 over the no-shuffles row's.

Where p99.9 / p50 crosses {paper['tail_ratio_target']:.2f} (linear between grid points):

{picks}

{floor_verdict(report['floor'], paper['tail_ratio_target'])}

Plot: `parm-calibration.png`."""  # noqa: E501
    plot = _plot(folder / "parm-calibration.png", report)
    write_results("parm-calibration", {**report, "plot": str(plot)}, results_dir=folder,
                  markdown=body)


def _plot(path: Path, report: dict[str, Any]) -> Path:
    fig, ax = new_figure()
    low, high = report["paper"]["tail_ratio_band"]
    ax.axhspan(low, high, color="0.85", label="implied by ParM 6.2.1")
    ax.axhline(report["paper"]["tail_ratio_target"], color="0.4", linestyle="--")
    ax.axhline(report["floor"]["tail_ratio"], color="tab:red", linestyle=":",
               label="no shuffles (this machine's floor)")
    for dist in dict.fromkeys(r["distribution"] for r in report["rows"]):
        pts = sorted((r["delay_ms"], r["tail_ratio"]) for r in report["rows"]
                     if r["distribution"] == dist)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=dist)
    ax.set_xlabel("shuffle slowdown per batch, ms (mean)")
    ax.set_ylabel("equal-resources p99.9 / p50")
    ax.legend(loc="upper left")
    ax.set_title("EMULATED testbed: baseline tail vs shuffle slowdown")
    return save_figure(fig, ax, path)


# ---- python -m benchmarks.parm_calibration ---------------------------------------------------

DESCRIPTION = ("Set the EMULATED testbed's shuffle slowdown from ParM's own section 6.2.1 "
               "numbers: run equal-resources alone at a grid of slowdowns (constant, "
               "exponential or heavy-tailed pareto) and find where its p99.9 / p50 matches "
               "what ParM's numbers imply for its baseline (2.62). ParM itself is not run.")
EXAMPLES = (
    ("python -m benchmarks.parm_calibration --data-dir ../shared/data",
     "the calibration: 8 slowdowns and the floor, 10,000 queries each (10 min on 2026-11-25)"),
    ("python -m benchmarks.parm_calibration --quick",
     "check the harness: 4 slowdowns, 2,000 queries each (about 3 min, estimated)"),
    ("python -m benchmarks.parm_calibration --exponential-ms 5,10,15,20 --resume",
     "a finer grid, reusing the points already measured"),
    ("python -m benchmarks.parm_calibration --data-dir ../shared/data --rate 150 "
     "--distributions pareto --tail-index 2",
     "a heavy-tailed slowdown (Lomax, tail index 2): 3 means, about 5 min"),
)


def build_parser() -> argparse.ArgumentParser:
    return _cli.build_parser("parm_calibration", DESCRIPTION, _cli.examples(EXAMPLES),
                             add_arguments)


def main(argv: Sequence[str] | None = None) -> int:
    return _cli.main(build_parser(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
