"""Pure helpers of ``python -m benchmarks.selection``: the stream plan, error curves, tables, plots.

Nothing here talks to a server; ``selection.py`` does the I/O and hands its records to these
functions, which the unit tests drive directly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from parityserve.bench.stats import percentiles

__all__ = [
    "best_model",
    "cumulative_error",
    "downsample",
    "exploration_cost",
    "fig8_rows",
    "fig8_verdict",
    "fig9_row",
    "fig9_summary",
    "fig9_verdicts",
    "group_bounds",
    "phase_oracle",
    "plot_fig8",
    "plot_fig9",
    "stream_plan",
]


# ---- the stream ----------------------------------------------------------------------------
def stream_plan(n_items: int, queries: int, seed: int, variants: int = 1
                ) -> tuple[np.ndarray, np.ndarray, bool]:
    """(index, variant, repeats) per query: a fresh seeded shuffle of the items per pass.

    Pass p uses version ``p`` of each input while ``p < variants`` (e.g. mirrored images);
    ``repeats`` says whether any input is sent twice (more passes than versions).
    """
    if n_items < 1 or queries < 0:
        raise ValueError(f"need n_items >= 1 and queries >= 0, got {n_items}, {queries}")
    passes = -(-queries // n_items)
    order = [np.random.default_rng([seed, p]).permutation(n_items) for p in range(passes)]
    index = np.concatenate(order)[:queries] if order else np.zeros(0, dtype=np.int64)
    variant = np.minimum(np.arange(queries) // n_items, max(variants - 1, 0))
    return index, variant, passes > max(variants, 1)


def group_bounds(n: int, size: int, cuts: Sequence[int] = ()) -> list[tuple[int, int]]:
    """[start, end) groups of at most ``size`` queries; no group straddles a cut.

    A cut at c means query c starts a group (e.g. the query at which a fault is injected).
    """
    if size < 1:
        raise ValueError(f"group size must be >= 1, got {size}")
    edges = sorted({0, n, *(c for c in cuts if 0 < c < n)})
    out = []
    for lo, hi in zip(edges, edges[1:], strict=False):
        out += [(s, min(s + size, hi)) for s in range(lo, hi, size)]
    return out


# ---- errors --------------------------------------------------------------------------------
def cumulative_error(wrong: Sequence[float] | np.ndarray) -> np.ndarray:
    """Mistakes so far / queries so far, after each query. NaN (no answer) counts as a mistake."""
    w = np.asarray(wrong, dtype=float)
    w = np.where(np.isnan(w), 1.0, w)
    return np.cumsum(w) / np.arange(1, w.size + 1) if w.size else np.zeros(0)


def best_model(losses: np.ndarray, names: Sequence[str]) -> str:
    """The model with the lowest mean loss (rows: queries, columns: ``names``); NaN is 1."""
    if losses.shape[0] == 0:
        raise ValueError("best_model needs at least one query")
    means = np.where(np.isnan(losses), 1.0, losses).mean(axis=0)  # no answer: a mistake
    return names[int(np.argmin(means))]


def _rate(wrong: np.ndarray, lo: int, hi: int) -> float | None:
    part = np.asarray(wrong, dtype=float)[lo:hi]
    return float(np.where(np.isnan(part), 1.0, part).mean()) if part.size else None


def fig8_rows(wrong: Mapping[str, np.ndarray], window: tuple[int, int],
              kinds: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """One row per curve: final cumulative error and the error rate before/in/after ``window``."""
    lo, hi = window
    rows = []
    for name, w in wrong.items():
        w = np.asarray(w, dtype=float)
        n = int(w.size)
        rows.append({"curve": name, "kind": (kinds or {}).get(name, ""), "queries": n,
                     "final_cumulative_error": float(cumulative_error(w)[-1]) if n else None,
                     "error_before": _rate(w, 0, min(lo, n)),
                     "error_degraded": _rate(w, min(lo, n), min(hi, n)),
                     "error_after": _rate(w, min(hi, n), n),
                     "missing": int(np.isnan(w).sum())})
    return rows


def fig8_verdict(rows: Sequence[Mapping[str, Any]], policies: Sequence[str],
                 static: Sequence[str]) -> dict[str, Any]:
    """Whether each policy's final cumulative error is below every static model's."""
    final = {r["curve"]: r["final_cumulative_error"] for r in rows}
    best_static = min(static, key=lambda m: final[m])
    out: dict[str, Any] = {"best_static": best_static,
                           "best_static_error": final[best_static], "policies": {}}
    for p in policies:
        out["policies"][p] = {"final_cumulative_error": final[p],
                              "below_every_static": bool(final[p] < final[best_static]),
                              "margin": final[best_static] - final[p]}
    return out


_PHASES = ("error_before", "error_degraded", "error_after")


def _phase_sizes(window: tuple[int, int], queries: int) -> dict[str, int]:
    lo, hi = window
    return dict(zip(_PHASES, (lo, hi - lo, queries - hi), strict=True))


def phase_oracle(rows: Sequence[Mapping[str, Any]], static: Sequence[str],
                 window: tuple[int, int], queries: int) -> dict[str, Any]:
    """The error of a one-model-per-query policy that knew, in hindsight, which static model is
    best in each phase (before, in and after the window) and asked only that one.

    No bandit can expect to beat it, so ``headroom`` (best static model minus this) is all a
    bandit such as Exp3 has to pay for exploring and learning if it is to end below every
    static model.
    """
    by = {r["curve"]: r for r in rows if r["curve"] in static}
    best: dict[str, str] = {}
    total = 0.0
    for phase, n in _phase_sizes(window, queries).items():
        if n > 0:
            best[phase] = min(by, key=lambda c: by[c][phase])
            total += n * by[best[phase]][phase]
    error = total / queries
    static_best = min(r["final_cumulative_error"] for r in by.values())
    return {"error": error, "best_by_phase": best, "headroom": static_best - error,
            "headroom_queries": round((static_best - error) * queries)}


def exploration_cost(rows: Sequence[Mapping[str, Any]], static: Sequence[str],
                     window: tuple[int, int], queries: int, gamma: float) -> float:
    """Expected extra error from Exp3's uniform exploration alone: in each phase a share
    ``gamma`` of queries goes to a uniformly drawn model instead of the phase's best one."""
    by = [r for r in rows if r["curve"] in static]
    total = 0.0
    for phase, n in _phase_sizes(window, queries).items():
        if n > 0:
            errors = [r[phase] for r in by]
            total += n * gamma * (float(np.mean(errors)) - min(errors))
    return total / queries


def downsample(curve: np.ndarray, max_points: int = 400) -> tuple[list[int], list[float]]:
    """(query numbers, values) at about ``max_points`` evenly spaced queries, last one kept."""
    n = len(curve)
    if n == 0:
        return [], []
    idx = np.unique(np.linspace(0, n - 1, min(n, max_points)).round().astype(int))
    return (idx + 1).tolist(), [float(curve[i]) for i in idx]


# ---- figure 9 ------------------------------------------------------------------------------
def fig9_row(k: int, mode: str, slo_ms: float, latencies_s: np.ndarray, ok: np.ndarray,
             answered: np.ndarray, correct: np.ndarray) -> dict[str, Any]:
    """One (ensemble size, mode) point. Accuracy counts failed or default answers as wrong."""
    lat = np.asarray(latencies_s, dtype=float)[np.asarray(ok, dtype=bool)]
    ans = np.asarray(answered, dtype=float)
    n = int(len(correct))
    return {"ensemble": k, "mode": mode, "slo_ms": slo_ms, "n": n,
            "accuracy": float(np.mean(correct)) if n else None,
            **percentiles(lat),
            "mean_answered": float(np.nanmean(ans)) if np.isfinite(ans).any() else None,
            "all_answered": float(np.mean(ans == k)) if n else None,
            "failed": int(n - int(np.asarray(ok, dtype=bool).sum()))}


def fig9_verdicts(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Per ensemble size: p99 and accuracy with the deadline against waiting for all."""
    by = {(r["ensemble"], r["mode"]): r for r in rows}
    out = []
    for k in sorted({r["ensemble"] for r in rows}):
        w, d = by.get((k, "wait for all")), by.get((k, "deadline"))
        if w is None or d is None:
            continue
        out.append(f"{k} models: p99 {d['p99_ms']:.1f} ms with the deadline vs "
                   f"{w['p99_ms']:.1f} ms waiting for all ({w['p99_ms'] / d['p99_ms']:.1f}x); "
                   f"accuracy {d['accuracy']:.2%} vs {w['accuracy']:.2%} "
                   f"({(d['accuracy'] - w['accuracy']) * 100:+.2f} points); "
                   f"{d['mean_answered']:.2f} of {k} models answered on average")
    return out


def fig9_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The paper's three claims, measured: the deadline holds the tail near the SLO at every
    size; waiting for all makes the tail grow with the ensemble; the deadline costs little
    accuracy."""
    by = {(r["ensemble"], r["mode"]): r for r in rows}
    sizes = sorted(k for k in {r["ensemble"] for r in rows}
                   if (k, "deadline") in by and (k, "wait for all") in by)
    if not sizes:
        return {}
    dl = [by[(k, "deadline")] for k in sizes]
    wait = [by[(k, "wait for all")] for k in sizes]
    cost = [(w["accuracy"] - d["accuracy"]) * 100 for d, w in zip(dl, wait, strict=True)]
    return {"sizes": sizes, "slo_ms": dl[0]["slo_ms"],
            "deadline_p99_ms": [d["p99_ms"] for d in dl],
            "wait_p99_ms": [w["p99_ms"] for w in wait],
            "deadline_p99_over_slo_ms": max(d["p99_ms"] - d["slo_ms"] for d in dl),
            "wait_p99_grows": bool(all(b["p99_ms"] > a["p99_ms"]
                                       for a, b in zip(wait, wait[1:], strict=False))),
            "tail_cut": [w["p99_ms"] / d["p99_ms"] for d, w in zip(dl, wait, strict=True)],
            "accuracy_cost_points": cost}


# ---- plots ---------------------------------------------------------------------------------
def _figure(rows: int, height: float) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.0, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, 1, squeeze=False)[:, 0]


def plot_fig8(curves: Mapping[str, np.ndarray], window: tuple[int, int],
              weights: Mapping[str, np.ndarray], path: Path, title: str,
              policies: Sequence[str] = ("Exp3", "Exp4")) -> Path:
    """Cumulative error per curve (policies bold) with the degraded window shaded; below it,
    each policy's weight share of the degraded model."""
    fig, (top, bottom) = _figure(2, 7.0)
    colours = _colours(curves, policies)
    for name, curve in curves.items():
        bold = name in policies
        top.plot(np.arange(1, len(curve) + 1), curve, label=name, color=colours[name],
                 linewidth=2.2 if bold else 1.2, linestyle="-" if bold else "--")
    for ax in (top, bottom):
        ax.axvspan(*window, color="grey", alpha=0.18, label="degraded" if ax is top else None)
        ax.grid(True, alpha=0.3)
    top.set(ylabel="cumulative error", title=title, ylim=(0, None))
    top.legend(fontsize="small", ncol=2)
    for name, share in weights.items():
        bottom.plot(np.arange(1, len(share) + 1), share, label=name, color=colours[name])
    bottom.set(xlabel="queries", ylabel="weight share of the degraded model", ylim=(0, 1.02))
    bottom.legend(fontsize="small")
    return _save(fig, path)


_POLICY_COLOURS = ("black", "magenta", "darkcyan")


def _colours(curves: Mapping[str, Any], policies: Sequence[str]) -> dict[str, Any]:
    """Models take the tab10 colours in order; policies take black, magenta, ..."""
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    models = [c for c in curves if c not in policies]
    out: dict[str, Any] = {m: cmap(i % cmap.N) for i, m in enumerate(models)}
    for i, p in enumerate(policies):
        out[p] = _POLICY_COLOURS[i % len(_POLICY_COLOURS)]
    return out


def plot_fig9(rows: Sequence[Mapping[str, Any]], path: Path, title: str) -> Path:
    """Accuracy, p99 latency and the share of the ensemble missing at answer time, against
    ensemble size, with and without the deadline."""
    fig, (acc, lat, miss) = _figure(3, 8.5)
    for mode, marker in (("deadline", "o"), ("wait for all", "s")):
        pts = sorted((r["ensemble"], r["accuracy"], r["p99_ms"], r.get("mean_answered"))
                     for r in rows if r["mode"] == mode)
        ks = [p[0] for p in pts]
        acc.plot(ks, [p[1] * 100 for p in pts], marker=marker, label=mode)
        lat.plot(ks, [p[2] for p in pts], marker=marker, label=mode)
        miss.plot(ks, [100 * (1 - p[3] / p[0]) if p[3] is not None else np.nan for p in pts],
                  marker=marker, label=mode)
    slo = next((r["slo_ms"] for r in rows if r["mode"] == "deadline"), None)
    if slo is not None:
        lat.axhline(slo, color="grey", linestyle=":", label=f"SLO {slo:g} ms")
    acc.set(ylabel="accuracy (%)", title=title)
    lat.set(ylabel="p99 latency (ms)", ylim=(0, None))
    miss.set(xlabel="models in the ensemble", ylabel="ensemble missing (%)", ylim=(0, None))
    for ax in (acc, lat, miss):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        ax.set_xticks(sorted({r["ensemble"] for r in rows}))
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
