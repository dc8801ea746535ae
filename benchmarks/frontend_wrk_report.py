"""``frontend_wrk.py``'s results: medians over rounds, ratios, the issue's target, the table
and the plot. Points are keyed ``round/model/system/route/bodies``."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from benchmarks.frontend_cases import BATCHED_DELAY_MS, PARITYSERVE_SYSTEMS

__all__ = ["MLP_TARGET", "markdown", "plot", "summarise", "verdicts"]

MLP_TARGET = 0.9  # issue 17: MLP throughput >= 90% of the bare app with the same batching
_METRICS = ("rps", "p50_ms", "p99_ms", "p999_ms", "p50_1conn_ms",
            "frontend_cpu_us_per_request", "worker_cpu_us_per_request")


def summarise(points: dict[str, Any]) -> list[dict[str, Any]]:
    """Medians over rounds per (model, system, route, bodies), with ratios to bare, the floor
    and LitServe serving the same model: each the median over rounds of that round's ratio
    (a round measures a point on every system back to back, so its ratio is a pair)."""
    groups: dict[tuple[str, ...], dict[str, dict[str, Any]]] = {}
    for key, point in points.items():
        round_, *group = key.split("/")
        groups.setdefault(tuple(group), {})[round_] = point
    rows = [_median_row(group, runs) for group, runs in sorted(groups.items())]
    by = {(r["model"], r["system"], r["route"], r["bodies"]): r for r in rows}
    for row in rows:
        route = row["route"] if row["route"] != "grpc" else "v2-binary"
        bare = by.get((row["model"], "bare", route, row["bodies"]))
        lit = by.get((row["model"], "litserve", "clipper-json", row["bodies"]))
        floor = by.get((row["model"], "floor", route, row["bodies"]))
        row["vs_bare"] = _paired_ratio(row, bare)
        row["vs_floor"] = _paired_ratio(row, floor)
        row["vs_litserve"] = _paired_ratio(row, lit)
        row["p50_over_bare_ms"] = row["p50_1conn_ms"] - bare["p50_1conn_ms"] if bare else None
    return rows


def _paired_ratio(row: dict[str, Any], reference: dict[str, Any] | None) -> float | None:
    """The median over the rounds both measured of ``row``'s req/s over ``reference``'s."""
    if reference is None:
        return None
    mine, theirs = row["rps_by_round"], reference["rps_by_round"]
    ratios = [mine[r] / theirs[r] for r in mine if r in theirs and theirs[r] > 0]
    return statistics.median(ratios) if ratios else None


def _median_row(group: tuple[str, ...], runs_by_round: dict[str, dict[str, Any]]
                ) -> dict[str, Any]:
    model, system, route, kind = group
    runs = [runs_by_round[r] for r in sorted(runs_by_round, key=int)]
    row: dict[str, Any] = {"model": model, "system": system, "route": route, "bodies": kind,
                           "rounds": len(runs), "requests": runs[0]["requests"]}
    for metric in _METRICS:
        row[metric] = statistics.median(r[metric] for r in runs)
    row["rps_rounds"] = [round(r["rps"]) for r in runs]
    row["rps_by_round"] = {r: p["rps"] for r, p in runs_by_round.items()}
    # absent where the server does not say (or, for steal, where the host has no counter)
    for metric in ("mean_batch", "model_calls", "steal_share", "bystander_share"):
        known = [r[metric] for r in runs if r.get(metric) is not None]
        row[metric] = statistics.median(known) if known else None
    return row


def verdicts(rows: list[dict[str, Any]]) -> list[str]:
    """The MLP target, judged per route on parityserve's ratio to the bare app (the median
    over rounds of each round's pair), with the floor's for scale."""
    by = {(r["model"], r["system"], r["route"], r["bodies"]): r for r in rows}
    out = []
    for r in rows:
        if r["model"] != "mlp" or r["system"] not in PARITYSERVE_SYSTEMS:
            continue
        bare = by.get((r["model"], "bare", r["route"], r["bodies"]))
        if r["vs_bare"] is None or bare is None:
            out.append(f"mlp {r['route']}: no bare row in this run, target not judged")
            continue
        met = "met" if r["vs_bare"] >= MLP_TARGET else "missed"
        line = (f"mlp {r['route']}: {r['system']} {r['rps']:.0f} req/s (median) against the "
                f"bare app's {bare['rps']:.0f} is {r['vs_bare']:.0%} of it, round by round "
                f"(target >= {MLP_TARGET:.0%}): **{met}**")
        floor = by.get((r["model"], "floor", r["route"], r["bodies"]))
        if floor is not None and floor.get("vs_bare") is not None and r.get("vs_floor"):
            line += (f". The floor (the bare app with the same batcher plus one worker-process "
                     f"round trip per batch, and nothing else) reaches {floor['rps']:.0f} "
                     f"req/s, {floor['vs_bare']:.0%} of the bare app: no design with the model "
                     f"in a worker process does better on this core; {r['system']} is "
                     f"{r['vs_floor']:.0%} of the floor")
        out.append(line)
    return out


def _models(rows: list[dict[str, Any]]) -> list[str]:
    """The models in these rows, noop first."""
    return sorted({r["model"] for r in rows}, key=lambda m: (m != "noop", m))


def _fmt(value: Any, spec: str) -> str:
    return "–" if value is None else format(value, spec)


_INTRO = ("Medians over rounds (each round's req/s listed). In a round every system's "
          "server is up, and each point (route, bodies) is measured on every system back to "
          "back, the order alternating from point to point, so the ratios (vs bare, vs floor, "
          "vs LitServe) are medians over rounds of each round's ratio: pairs measured within "
          "a minute of each other. The servers not being measured sit idle on the same core; "
          "the last column is the share of that core they used during the 64-connection run "
          "(median over rounds). LitServe is started for its own points only: idle with "
          "batching on, it polls its queue. `floor` is the bare app plus "
          "one CURVE round trip per batch to a parityserve worker process, through "
          "parityserve's RPC layer and nothing else of it: the ceiling for any design that "
          "runs models in worker processes. 64 connections closed loop for "
          "req/s and p50/p99/p99.9 (n requests); p50 at 1 connection; CPU per request from "
          "/proc for the server process (frontend) and its parityserve worker processes "
          "(worker). The bare app runs its model in its own process, so all its CPU is "
          "frontend; LitServe's processes are all counted as frontend too. Mean batch: "
          "queries per model call during the 64-connection run (median over rounds), from "
          "parityserve's "
          "`parityserve_batch_size` histogram and the bare MLP app's batcher (LitServe does "
          "not say). CPU stolen: the share of this VM's CPU time its host took during the "
          "64-connection run (`/proc/stat`, `benchmarks.steal`; median over rounds): "
          "every process here stops while it happens, so a system measured in a spell of "
          "steal reads slower for reasons of the host's.")
_HEADER = ["| system | route | bodies | req/s | rounds | vs bare | vs floor | vs LitServe "
           "| p50 1-conn ms | over bare ms | p50 / p99 / p99.9 ms @64 | n | frontend us/req | "
           "worker us/req | mean batch @64 | CPU stolen @64 | idle servers' CPU @64 |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]


def markdown(state: dict[str, Any], machine: dict[str, Any]) -> str:
    lines = ["# The frontend under wrk: one core for the server, one for the client", "",
             f"Command: `{state['command']}`", "", _INTRO, ""]
    for model in _models(state["summary"]):
        lines += [*_section(model, state), ""]
    lines += ["Machine: " + ", ".join(f"{k} {machine[k]}" for k in
                                      ("cpu_model", "cpu_count", "python", "date"))]
    return "\n".join(lines) + "\n"


def _section(model: str, state: dict[str, Any]) -> list[str]:
    rows = [r for r in state["summary"] if r["model"] == model]
    lines = [f"## {_TITLES.get(model, model)}", "", _NOTES.get(model, "").format(**state.get(
        "mlp", {})), "", *_HEADER, *map(_table_row, rows)]
    if model == "mlp":
        lines += ["", f"Target (issue 17): parityserve's req/s >= {MLP_TARGET:.0%} of the bare "
                      "app's with the same batching, per route.", "",
                  *(f"- {v}" for v in verdicts(rows))]
    return lines


_TITLES = {"noop": "No-op model (`zoo:noop`)",
           "mlp": "MNIST MLP (`zoo:parm-mlp`, published weights) on real MNIST test images"}
_NOTES = {
    "noop": ("2,000 distinct random 784-float bodies, or one fixed body; parityserve with its "
             "prediction cache off, so every request takes the whole path to the worker and "
             "back (with the default cache on, the bodies would be cache hits after their "
             "first pass; see the model calls). gRPC is measured "
             "with `parityserve bench load` (wrk speaks only HTTP) and compared with the bare "
             "app's V2 binary route. `parityserve` runs as it ships: a batch leaves as soon "
             "as a replica is free, except that while its event loop is saturated a partial "
             "batch waits up to `batching.busy_delay_ms` (2 ms) for more (the busy hold, "
             "which an idle server never pays). `parityserve-batched` is the same server with "
             f"`batching.max_delay_ms: {BATCHED_DELAY_MS:g}`: a partial batch waits up to "
             f"{BATCHED_DELAY_MS:g} ms for more queries (fewer, larger worker round trips "
             f"under load, at up to {BATCHED_DELAY_MS:g} ms more latency; its 1-connection "
             "p50 shows the price)."),
    "mlp": ("{bodies:,} distinct MNIST test images as 784-float bodies (Clipper JSON, V2 "
            "binary). Every system batches up to {max_batch_size} queries per model call: "
            "parityserve with AIMD adaptive batching (one replica, cache off so every query "
            "runs the model), the bare app with an in-process batcher that takes the queries "
            "that arrived while the model ran (batches run {bare_batch_run}), LitServe with "
            "max_batch_size {max_batch_size} and batch_timeout {litserve_batch_timeout_s} s; "
            f"`parityserve-batched` lets a partial batch wait up to {BATCHED_DELAY_MS:g} ms "
            "for more."),
}


def _table_row(r: dict[str, Any]) -> str:
    return (f"| {r['system']} | {r['route']} | {r['bodies']} | {r['rps']:.0f} | "
            f"{r['rps_rounds']} | {_fmt(r['vs_bare'], '.2f')} | {_fmt(r.get('vs_floor'), '.2f')}"
            f" | {_fmt(r['vs_litserve'], '.2f')}"
            f" | {r['p50_1conn_ms']:.3f} | {_fmt(r['p50_over_bare_ms'], '+.3f')} | "
            f"{r['p50_ms']:.2f} / {r['p99_ms']:.2f} / {r['p999_ms']:.2f} | {r['requests']} | "
            f"{r['frontend_cpu_us_per_request']:.0f} | {r['worker_cpu_us_per_request']:.0f} | "
            f"{_batch_cell(r)} | {_fmt(r.get('steal_share'), '.1%')} | "
            f"{_fmt(r.get('bystander_share'), '.1%')} |")


def _batch_cell(r: dict[str, Any]) -> str:
    if r.get("model_calls") == 0:
        return "no model calls"
    return _fmt(r.get("mean_batch"), ".1f")


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """One panel per model: req/s of each system and route on the distinct bodies."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    models = _models(rows)
    distinct = {m: [r for r in rows if r["model"] == m and r["bodies"] == "distinct"]
                for m in models}
    widths = [max(2, len(d)) for d in distinct.values()]
    fig, axes = plt.subplots(1, len(models), figsize=(max(6, sum(widths) * 1.1), 4),
                             gridspec_kw={"width_ratios": widths}, squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        _panel(ax, model, distinct[model])
    axes[0][0].set_ylabel("requests/s, 64 connections, one server core")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


_COLOURS = {"bare": "grey", "floor": "silver", "litserve": "tab:orange",
            "parityserve": "tab:blue", "parityserve-batched": "tab:cyan"}


def _panel(ax: Any, model: str, rows: list[dict[str, Any]]) -> None:
    ax.bar(range(len(rows)), [r["rps"] for r in rows],
           color=[_COLOURS.get(r["system"], "tab:green") for r in rows])
    ax.set_xticks(range(len(rows)), [f"{r['system']}\n{r['route']}" for r in rows], fontsize=7)
    ax.set_title({"noop": "no-op model, 2,000 distinct 784-float bodies",
                  "mlp": "MNIST MLP, 2,000 MNIST test images"}.get(model, model), fontsize=9)
    if model == "mlp":
        _target_marks(ax, rows)


def _target_marks(ax: Any, rows: list[dict[str, Any]]) -> None:
    """A dashed line over each parityserve bar at 90% of the bare app's req/s on its route."""
    label: str | None = f"target: {MLP_TARGET:.0%} of bare"
    for i, r in enumerate(rows):
        if r["system"] == "parityserve" and r["vs_bare"]:
            ax.hlines(MLP_TARGET * r["rps"] / r["vs_bare"], i - 0.4, i + 0.4, colors="black",
                      linestyles="dashed", label=label)
            label = None  # one legend entry
    if label is None:
        ax.legend(fontsize=7, loc="upper right")
