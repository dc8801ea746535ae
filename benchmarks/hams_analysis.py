"""The pure rules of ``benchmarks.hams``: percentiles, overhead ratios, recovery phases,
the consistency oracle, and the markdown table. No I/O, so they have table tests."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.hams_chaos import render_chaos, render_stocks

__all__ = ["ConsistencyOracle", "latency_summary", "median_and_max", "overhead_of", "overhead_rows",
           "recovery_phases", "render_markdown"]


def latency_summary(latencies_s: Sequence[float], rows: int, wall_s: float) -> dict[str, Any]:
    """Mean, p50, p99 and p99.9 in ms with the sample count behind them, and rows/s."""
    ms = np.asarray(latencies_s, dtype=np.float64) * 1e3
    if not ms.size:
        return {"n": 0}
    return {"n": int(ms.size), "mean_ms": float(ms.mean()),
            "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "p999_ms": float(np.percentile(ms, 99.9)),
            "rows_per_s": rows / wall_s if wall_s > 0 else 0.0}


def overhead_rows(cells: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]],
                  base: str = "bare") -> list[dict[str, Any]]:
    """Per mode and batch size: the median over repetitions of each statistic, and the
    ratio of the mean latency and of the throughput to ``base``'s at the same batch size
    (ratios of the medians; ``mean_vs_bare_paired`` is the median of each repetition's own
    ratio, the steadier figure on a noisy machine), with every repetition's mean. The
    ratios' keys name the base (``mean_vs_unix`` against mode ``unix``)."""
    out = []
    bare = cells.get(base, {})
    for mode, by_batch in cells.items():
        for batch, reps in sorted(by_batch.items()):
            row: dict[str, Any] = {"mode": mode, "batch": batch, "reps": len(reps)}
            for key in ("mean_ms", "p50_ms", "p99_ms", "p999_ms", "rows_per_s", "n"):
                row[key] = float(np.median([r[key] for r in reps])) if reps else float("nan")
            row["each_mean_ms"] = [float(r["mean_ms"]) for r in reps]
            same = bare.get(batch)
            if same:
                row[f"mean_vs_{base}"] = row["mean_ms"] / float(np.median([r["mean_ms"]
                                                                           for r in same]))
                row[f"tput_vs_{base}"] = row["rows_per_s"] / float(np.median([r["rows_per_s"]
                                                                              for r in same]))
                if len(same) == len(reps):  # repetition i of both ran back to back
                    row[f"mean_vs_{base}_paired"] = float(np.median(
                        [r["mean_ms"] / b["mean_ms"] for r, b in zip(reps, same, strict=True)]))
            out.append(row)
    return out


def median_and_max(runs: Sequence[Mapping[str, float | None]], keys: Sequence[str]
                   ) -> dict[str, Any]:
    """Per key, the median and the maximum over the runs that have it (None: none has)."""
    stats: dict[str, Any] = {"kills": len(runs), "each": list(runs)}
    for name, fn in (("median", np.median), ("max", max)):
        stats[name] = {}
        for key in keys:
            values = [r[key] for r in runs if r[key] is not None]
            stats[name][key] = float(fn(values)) if values else None
    return stats


def recovery_phases(killed_at: float, failover: Mapping[str, Any]) -> dict[str, float | None]:
    """HAMS's split of one recovery, in ms: detection (kill -> noticed), protocol (noticed
    -> backups promoted and lineage rolled back), handover (-> first reply committed
    through the promoted primary), and the total from the kill."""
    detected, protocol = failover["detected_at"], failover["protocol_done_at"]
    first = failover.get("first_reply_at")
    return {"detection_ms": (detected - killed_at) * 1e3,
            "protocol_ms": (protocol - detected) * 1e3,
            "handover_ms": None if first is None else (first - protocol) * 1e3,
            "total_ms": None if first is None else (first - killed_at) * 1e3}


@dataclass
class ConsistencyOracle:
    """Every (operator, seq) a client saw, and every client reply: two values for one
    (operator, seq) is a conflict; a request answered twice or never is a loss."""

    seen: dict[tuple[str, int], Any] = field(default_factory=dict)
    conflicts: list[str] = field(default_factory=list)
    answered: dict[str, int] = field(default_factory=dict)

    def record(self, reply: Mapping[str, Any], watched: Iterable[str]) -> None:
        self.answered[reply["query_id"]] = self.answered.get(reply["query_id"], 0) + 1
        for op in watched:
            key = (op, int(reply["seqs"][op]))
            value = _hashable(reply["output"])
            if self.seen.setdefault(key, value) != value:
                self.conflicts.append(f"{op}#{key[1]}: {self.seen[key]} then {value}")

    def duplicates(self) -> int:
        return sum(1 for n in self.answered.values() if n > 1)


def _hashable(value: Any) -> Any:
    return tuple(_hashable(v) for v in value) if isinstance(value, list) else value


def overhead_of(result: Mapping[str, Any]) -> tuple[list[dict[str, Any]], Mapping[str, Any]]:
    """The overhead rows and the load they were measured under (runs before open-loop
    latency stored a bare list of rows, measured with one closed-loop client)."""
    part = result.get("overhead") or []
    return (list(part), {}) if isinstance(part, list) else (list(part["rows"]), part)


def _load_note(load: Mapping[str, Any]) -> str:
    if not load:
        return ("Latency: one closed-loop client (one request = one batch of B rows). "
                "rows/s: three clients, at saturation.")
    sat = ", ".join(f"{rate:.0f} at B={b}" for b, rate in
                    sorted(load["bare_saturation_rows_per_s"].items(), key=lambda x: int(x[0])))
    return (f"Latency: open-loop Poisson arrivals at {load['load_share']:.0%} of `bare`'s "
            f"saturation throughput (rows/s: {sat}), the same offered load for every mode; one "
            "request = one operator batch of exactly B rows (H13); latency counted from each "
            "request's intended send time. rows/s: three closed-loop clients, at saturation.")


def render_markdown(result: Mapping[str, Any]) -> str:
    rows, load = overhead_of(result)
    lines = [f"# HAMS on this machine ({result.get('title', '')})", "",
             *([_load_note(load), ""] if rows else []),
             f"Command: `{result.get('command', '')}`", "",
             *[f"Parts added with: `{c}`" for c in result.get("more_commands", [])], "",
             result.get("machine", ""), ""]
    if result.get("elapsed_s"):
        lines += ["Wall time per part: " + ", ".join(
            f"{part} {seconds / 60:.1f} min" for part, seconds in result["elapsed_s"].items()),
            ""]
    lines += render_stocks(result.get("stocks") or {})
    lines += render_chaos(result.get("chaos") or {})
    if rows:
        lines += ["## Normal-case overhead (online MLP)", "",
                  "| mode | batch | mean ms | p50 ms | p99 ms | p99.9 ms | rows/s | mean vs "
                  "bare | paired | rows/s vs bare | requests per rep (median) | mean ms per rep "
                  "| reps |", "|---" * 13 + "|"]
        for r in rows:
            lines.append(
                f"| {r['mode']} | {r['batch']} | {r['mean_ms']:.2f} | {r['p50_ms']:.2f} | "
                f"{r['p99_ms']:.2f} | {_ms(r.get('p999_ms'))} | {r['rows_per_s']:.0f} | "
                f"{_ratio(r.get('mean_vs_bare'))} | {_ratio(r.get('mean_vs_bare_paired'))} | "
                f"{_ratio(r.get('tput_vs_bare'))} | {r['n']:.0f} | "
                f"{' / '.join(f'{m:.1f}' for m in r.get('each_mean_ms', [])) or '–'} | "
                f"{r['reps']} |")
        lines.append("")
    for name, rec in (result.get("recovery") or {}).items():
        lines += [f"## Recovery after kill -9 of the stateful primary: {name}", "",
                  "| | detection ms | protocol ms | handover ms | total ms |", "|---" * 5 + "|"]
        for stat in ("median", "max"):
            cells = [_ms(rec.get(stat, {}).get(k)) for k in
                     ("detection_ms", "protocol_ms", "handover_ms", "total_ms")]
            lines.append(f"| {stat} of {rec.get('kills', 0)} kills | " + " | ".join(cells) + " |")
        lines.append("")
    if result.get("correlated"):
        lines += ["## Recovery on the sequence service (two adjacent stateful LSTMs)", "",
                  "| case | kills | total ms (median / max) | failovers | worst reply ms "
                  "(median / max) | normal p50 ms |", "|---" * 6 + "|"]
        for name, rec in result["correlated"].items():
            med, top = rec.get("median", {}), rec.get("max", {})
            lines.append(f"| {name} | {rec.get('kills', 0)} | {_ms(med.get('total_ms'))} / "
                         f"{_ms(top.get('total_ms'))} | {_ms(med.get('failovers'))} | "
                         f"{_ms(med.get('worst_reply_ms'))} / {_ms(top.get('worst_reply_ms'))}"
                         f" | {_ms(med.get('normal_p50_ms'))} |")
        lines.append("")
    if result.get("consistency"):
        c = result["consistency"]
        lines += ["## Global consistency under random kills (sequence service, noise on)", ""]
        for run in (c, c.get("checkpoint-replay")):
            if not run:
                continue
            lines += [f"**{run.get('mode', 'hams')}**", "",
                      f"- kills: {run['kills']} ({run['by_role']}), failovers: "
                      f"{run.get('failovers', '–')}",
                      f"- requests sent: {run['sent']}, answered: {run['answered']}, failed: "
                      f"{run['lost']}, answered twice: {run['duplicates']}",
                      f"- (operator, seq) pairs clients saw: {run['pairs']}, seen with two "
                      f"values: {run['conflicts']}",
                      f"- replayed outputs that differ from the answered ones: "
                      f"{run.get('replay_conflicts', 0)}", ""]
        lines += _replay_lines(c.get("replay") or {})
    return "\n".join(lines)


def _replay_lines(runs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Per mode: does the learner's final state equal a replay of its durable history?"""
    if not runs:
        return []
    lines = ["## Final state against a replay of the durable history (online learner, audit "
             "and noise on)", "",
             "| mode | kills | failovers | requests | batches replayed | final state = replay "
             "| backup = primary | why not |", "|---" * 8 + "|"]
    for mode, run in runs.items():
        lines.append(f"| {mode} | {run['kills']} | {run.get('failovers', '–')} | "
                     f"{run.get('requests', '–')} | {run.get('batches', '–')} | "
                     f"{_yes(run.get('final_state_matches_replay'))} | "
                     f"{_yes(run.get('backup_matches_primary'))} | {run.get('why') or ''} |")
    return [*lines, ""]


def _yes(value: bool | None) -> str:
    return "–" if value is None else ("yes" if value else "**no**")


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}x"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"
