"""What every experiment under ``benchmarks/`` writes with: results files, tables and plots.

One public surface, so that an experiment never reaches for a private name of the package:
the results files (JSON + markdown with the command and the machine), markdown tables, the
latency-vs-load plot and the figure helpers come from ``parityserve.bench.report`` (``bench
overhead`` and ``profile`` write with them too); the latency CDFs, which only the experiments
draw, live here. A plot needs matplotlib (the ``bench`` extra).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from parityserve.bench.report import (
    Column,
    colours,
    command_line,
    machine_info,
    markdown_table,
    new_figure,
    plot_latency_vs_load,
    save_figure,
    write_results,
)

__all__ = [
    "Column",
    "colours",
    "command_line",
    "machine_info",
    "markdown_table",
    "new_figure",
    "plot_cdf",
    "plot_latency_vs_load",
    "plot_quantile_cdf",
    "save_figure",
    "write_results",
]


def plot_cdf(latencies_s: Mapping[str, np.ndarray | Sequence[float]], path: Path | str,
             title: str) -> Path:
    """Empirical latency CDF per label, log-x in milliseconds; non-finite values dropped."""
    curves = {}
    for label, lat in latencies_s.items():
        ms = np.sort(np.asarray(lat, dtype=float)) * 1e3
        ms = ms[np.isfinite(ms)]
        curves[label] = (ms, np.arange(1, ms.size + 1) / max(ms.size, 1))
    return _draw_cdf(curves, path, title)


def plot_quantile_cdf(quantiles_ms: Mapping[str, Sequence[float]],
                      probabilities: Sequence[float], path: Path | str, title: str,
                      note: str | None = None) -> Path:
    """Latency CDF per label from stored quantiles (milliseconds at ``probabilities``), log-x;
    ``note`` goes under the legend (say which labels have no curve, and why)."""
    probs = np.asarray(probabilities, dtype=float)
    curves = {}
    for label, values in quantiles_ms.items():
        ms = np.asarray(values, dtype=float)
        if ms.shape != probs.shape:
            raise ValueError(f"{label}: {ms.size} quantiles for {probs.size} probabilities")
        keep = np.isfinite(ms)
        curves[label] = (ms[keep], probs[keep])
    return _draw_cdf(curves, path, title, note)


def _draw_cdf(curves: Mapping[str, tuple[np.ndarray, np.ndarray]], path: Path | str,
              title: str, note: str | None = None) -> Path:
    fig, ax = new_figure()
    for colour, (label, (ms, probs)) in zip(colours(len(curves)), curves.items(),
                                            strict=True):
        if ms.size:
            ax.step(ms, probs, where="post", color=colour, label=label)
    if any(ms.size for ms, _ in curves.values()):
        ax.legend(fontsize="small", title=note, title_fontsize="x-small")
    else:  # nothing to draw: say so on the plot rather than leave it silently empty
        ax.text(0.5, 0.5, note or "no latencies", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_xlim(0.1, 1000.0)
    ax.set(xscale="log", xlabel="latency (ms)", ylabel="fraction of queries", ylim=(0, 1.01),
           title=title)
    return save_figure(fig, ax, path)
