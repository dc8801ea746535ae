"""Benchmark output: JSON + markdown with the exact command and machine, and latency plots.

What ``bench overhead`` and ``profile`` write with. The experiments under ``benchmarks/`` reach
it through ``benchmarks/report.py``, which adds the plots only they draw (latency CDFs).

A number without its machine, load and command cannot be checked or compared, so every
results file carries all three. Plots use the Agg canvas directly (no pyplot), so they work
headless and touch no global matplotlib state. matplotlib comes with the ``bench`` extra; a
plot without it is a one-line error that names the install command.
"""

from __future__ import annotations

import os
import platform
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from parityserve.bench.extra import require_bench_extra

__all__ = [
    "Column",
    "colours",
    "command_line",
    "machine_info",
    "markdown_table",
    "new_figure",
    "plot_latency_vs_load",
    "save_figure",
    "write_results",
]

# (key in the row, column header, format spec such as ".1f" or a callable value -> str)
Column = tuple[str, str, str | Callable[[Any], str]]
# (offered rate, p50 ms, p99 ms, p99.9 ms)
LoadPoint = tuple[float, float, float, float]

_MISSING = "–"


# --- machine and command ------------------------------------------------------------------


def command_line(argv: list[str] | None = None, cwd: Path | None = None) -> str:
    """The command that started this process, as a reader reruns it from the project root.

    ``sys.orig_argv`` keeps the interpreter and ``-m module``, which ``sys.argv`` loses. The
    interpreter and console-script paths of this machine become ``parityserve``/``python``,
    and absolute paths near the working directory become relative (``../shared/data``).
    """
    args = list(argv if argv is not None else getattr(sys, "orig_argv", None) or sys.argv)
    if args and Path(args[0]).name.startswith("python"):
        rest = args[1:]
        if rest[:2] in (["-m", "parityserve.cli"], ["-m", "parityserve"]):
            args = ["parityserve", *rest[2:]]
        elif rest and Path(rest[0]).name == "parityserve":
            args = ["parityserve", *rest[1:]]
        else:
            args = ["python", *rest]
    elif args and Path(args[0]).name == "parityserve":
        args = ["parityserve", *args[1:]]
    here = cwd or Path.cwd()
    return " ".join(shlex.quote(_near(a, here)) for a in args)


def _near(arg: str, here: Path) -> str:
    """``arg`` relative to ``here`` when it is an absolute path at most one level above it."""
    if not arg.startswith("/"):
        return arg
    relative = os.path.relpath(arg, here)
    return relative if not relative.startswith("../..") else arg


def machine_info() -> dict[str, Any]:
    """What a reader needs to judge a number: CPUs, memory, GPU, software versions, date."""
    return {
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": _memory_gib(),
        "gpu": _gpu_names(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": _version("torch"),
        "parityserve": _version("parityserve"),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)  # the file says kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _gpu_names() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def _version(dist: str) -> str | None:
    # Package metadata, not an import: importing torch just to print its version takes seconds.
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


# --- results files ------------------------------------------------------------------------


def write_results(
    name: str,
    payload: Mapping[str, Any],
    *,
    results_dir: Path = Path("benchmarks/results"),
    markdown: str | None = None,
    command: str | None = None,
) -> dict[str, Path]:
    """Write ``<name>.json`` and ``<name>.md``; returns ``{"json": path, "md": path}``.

    The JSON is ``payload`` plus ``"command"`` (``command``, else the payload's own, else this
    process's command line) and ``"machine"``. The markdown starts with both, then ``markdown``.
    """
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"bad results name {name!r}")
    doc = {"name": name, **payload}
    doc["command"] = command or doc.get("command") or command_line()
    doc.setdefault("machine", machine_info())
    results_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": results_dir / f"{name}.json", "md": results_dir / f"{name}.md"}
    paths["json"].write_bytes(_dumps(doc) + b"\n")
    paths["md"].write_text(_markdown_doc(name, doc, markdown))
    return paths


def _dumps(doc: Mapping[str, Any]) -> bytes:
    option = orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
    return orjson.dumps(doc, option=option, default=_json_default)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):  # non-contiguous arrays, which orjson refuses
        return obj.tolist()
    if isinstance(obj, set | frozenset):
        return sorted(obj, key=str)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__} to JSON")


def _markdown_doc(name: str, doc: Mapping[str, Any], body: str | None) -> str:
    machine = doc["machine"]
    lines = [f"# {name}", "", "Command:", "", "```", str(doc["command"]), "```", "",
             "Machine:", ""]
    if isinstance(machine, Mapping):
        lines += [f"- {key}: {value}" for key, value in machine.items()]
    else:
        lines.append(f"- {machine}")
    lines += ["", body.rstrip() if body else f"Full results: `{name}.json`.", ""]
    return "\n".join(lines)


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column]) -> str:
    """A GitHub markdown table. A missing, None or NaN value shows as an en dash."""
    header = "| " + " | ".join(h for _, h, _ in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(_cell(row.get(key), fmt) for key, _, fmt in columns) + " |"
            for row in rows]
    return "\n".join([header, rule, *body])


def _cell(value: Any, fmt: str | Callable[[Any], str]) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return _MISSING
    text = fmt(value) if callable(fmt) else format(value, fmt)
    return text.replace("|", "\\|")  # a pipe inside a cell would split the column


# --- plots --------------------------------------------------------------------------------

_STYLES: tuple[tuple[Any, str], ...] = (("-", "p50"), ("--", "p99"), (":", "p99.9"))


def plot_latency_vs_load(series: Mapping[str, Sequence[LoadPoint]], path: Path | str,
                         title: str) -> Path:
    """Latency percentiles against offered load: one colour per series, log-y.

    p50 is solid, p99 dashed and p99.9 dotted; the legend names colours and styles apart.
    """
    fig, ax = new_figure()  # first: it says so if matplotlib is missing
    from matplotlib.lines import Line2D

    for colour, (label, points) in zip(colours(len(series)), series.items(), strict=True):
        pts = sorted(points)
        rates = [p[0] for p in pts]
        for col, (style, _) in enumerate(_STYLES, start=1):
            ax.plot(rates, [p[col] for p in pts], linestyle=style, color=colour, marker="o",
                    markersize=3, label=label if col == 1 else None)
    handles, _ = ax.get_legend_handles_labels()
    handles += [Line2D([], [], color="black", linestyle=s, label=n) for s, n in _STYLES]
    ax.legend(handles=handles, fontsize="small")
    ax.set(yscale="log", xlabel="offered load (queries/s)", ylabel="latency (ms)", title=title)
    return save_figure(fig, ax, path)


def new_figure() -> tuple[Any, Any]:
    """A headless 7 x 4.5 in figure and its axes; a clear error if matplotlib is missing."""
    require_bench_extra("plotting", ["matplotlib"])
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.0, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


def colours(n: int) -> list[Any]:
    """``n`` distinct line colours (tab10, or tab20 past ten series)."""
    require_bench_extra("plotting", ["matplotlib"])
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def save_figure(fig: Any, ax: Any, path: Path | str) -> Path:
    """Grid on, then ``fig`` written to ``path`` (its folder made) at 120 dpi; returns it."""
    ax.grid(True, which="both", alpha=0.3)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
