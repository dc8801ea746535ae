"""The pure rules of ``benchmarks.hams_nodes`` (issue 41): one kill event's failover split
and consistency verdict, the part's summary against the goals, and the markdown. No I/O, so
they have table tests (``tests/unit/benchmarks/test_hams_nodes_analysis.py``).

**Failover as a client sees it.** A node's crash can take more than one primary (or a
primary and the next operator's backup, HAMS Fig. 6), so an event's failover records are
folded into one: detection from the kill to the first loss noticed, protocol from there to
the last promotion done, handover from there to the last first reply through a promoted
primary (``hams_analysis.recovery_phases``'s split). An event that took no primary (a
backup's or a spare's node) has no failover; its clients' longest reply gap says what they
saw.

**Consistency.** An event is consistent when every request its clients sent was answered
exactly once (none lost, none answered with an error, none twice), no (operator, sequence)
pair was seen with two outputs, every stream equals its replay through fresh LSTMs, and
each stateful operator's backup holds its primary's state (digest and request) once the
load stopped.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from benchmarks.hams_analysis import _ms, median_and_max, recovery_phases
from benchmarks.hams_chaos import render_stocks

__all__ = ["PHASES", "digests_equal", "event_failover", "event_problems", "goals",
           "render_markdown", "summarise"]

PHASES = ("detection_ms", "protocol_ms", "handover_ms", "total_ms")
FIG6 = {"seq1 primary", "seq2 backup"}  # HAMS Fig. 6: a primary beside the next one's backup
GOAL_RATIO = 2.0  # node-loss failover median <= 2x the process kill's
GOAL_LINK = 1.10  # TCP state link <= 1.10x the Unix one at 64 rows


def event_failover(killed_at: float, records: Sequence[Mapping[str, Any]]
                   ) -> dict[str, float | None]:
    """The event's failover records folded into one split (None everywhere: no failover)."""
    if not records:
        return dict.fromkeys(PHASES)
    firsts = [r.get("first_reply_at") for r in records]
    folded = {"detected_at": min(r["detected_at"] for r in records),
              "protocol_done_at": max(r["protocol_done_at"] for r in records),
              "first_reply_at": None if None in firsts else max(firsts)}  # type: ignore[type-var]
    return recovery_phases(killed_at, folded)


def digests_equal(digests: Mapping[str, Mapping[str, Any]]) -> bool:
    """Every stateful operator's backup at its primary's request with its primary's
    digest (an operator with no primary or no backup fails)."""
    for sides in digests.values():
        primary, backup = sides.get("primary"), sides.get("backup")
        if primary is None or backup is None:
            return False
        if (primary["seq"], primary["digest"]) != (backup["seq"], backup["digest"]):
            return False
    return bool(digests)


def event_problems(event: Mapping[str, Any]) -> list[str]:
    """Why the event is not consistent (empty: it is)."""
    problems = []
    unanswered = event["sent"] - event["answered"] - event["errors"]
    for key, what in (("lost", "lost (no answer or 504)"), ("errors", "answered with an error"),
                      ("duplicates", "answered twice"),
                      ("conflicts", "(operator, sequence) pairs with two outputs"),
                      ("diverged_streams", "streams diverging from their replay")):
        if event.get(key):
            problems.append(f"{event[key]} {what}")
    if unanswered > event.get("lost", 0):
        problems.append(f"{unanswered} rows sent but not answered")
    if not event.get("digests_equal"):
        problems.append("backup and primary digests differ")
    if event.get("not_whole"):
        problems.append(f"not whole again: {event['not_whole']}")
    return problems


def summarise(events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Consistency count and the failover split (median and max) over the events that had a
    failover; the longest reply gap over all of them; events per kind."""
    with_failover = [{k: e["failover"][k] for k in PHASES} for e in events
                     if e["failover"].get("detection_ms") is not None]
    split = median_and_max(with_failover, PHASES)
    split.pop("each")
    gaps = [e["gap_ms"] for e in events if e.get("gap_ms") is not None]
    strikes = [e["strike_ms"] for e in events if e.get("strike_ms") is not None]
    kinds: dict[str, int] = {}
    for e in events:
        kinds[e["kind"]] = kinds.get(e["kind"], 0) + 1
    return {"events": len(events),
            "consistent": sum(1 for e in events if not event_problems(e)),
            "failovers": split,
            "gap_ms": {"median": float(np.median(gaps)) if gaps else None,
                       "max": max(gaps) if gaps else None},
            "kinds": kinds,
            "fig6": sum(1 for e in events if set(e.get("held", [])) >= FIG6),
            "strike_ms": {"median": float(np.median(strikes)) if strikes else None,
                          "max": max(strikes) if strikes else None},
            "detections": sorted({d for e in events for d in e.get("detections", [])}),
            # what noticed each lost member (exit, heartbeat, data path), counted over events
            "detectors": dict(sorted(collections.Counter(
                d for e in events for d in e.get("detectors", [])).items())),
            "problems": {str(e["index"]): event_problems(e) for e in events
                         if event_problems(e)}}


def goals(node: Mapping[str, Any], process: Mapping[str, Any], planned: int,
          link_rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The issue's goal lines: all node events consistent, the node failover's median
    total at most twice the process kill's (both from this run), TCP <= 1.10x Unix at 64."""
    out: dict[str, Any] = {}
    if node:
        out[f"{planned} of {planned} node kills consistent"] = \
            node["events"] == planned and node["consistent"] == planned
    node_med = (node.get("failovers") or {}).get("median", {}).get("total_ms")
    proc_med = (process.get("failovers") or {}).get("median", {}).get("total_ms")
    ratio = node_med / proc_med if node_med is not None and proc_med else None
    out["failover_ratio"] = ratio
    if ratio is not None:
        out[f"node-loss failover median <= {GOAL_RATIO:g}x process kill"] = ratio <= GOAL_RATIO
    tcp64 = next((r for r in link_rows if r["mode"] == "tcp" and r["batch"] == 64), None)
    if tcp64 is not None and tcp64.get("mean_vs_unix_paired") is not None:
        out[f"TCP link <= {GOAL_LINK:.2f}x Unix at 64 rows"] = \
            tcp64["mean_vs_unix_paired"] <= GOAL_LINK
    return out


# ---- markdown -----------------------------------------------------------------------------
def render_markdown(state: Mapping[str, Any]) -> str:
    lines = [f"# HAMS members on Ray nodes: node kills and the state link ({state['title']})",
             "", f"Command: `{state['command']}`", "",
             *[f"Resumed with: `{c}`" for c in state.get("more_commands", [])],
             state.get("machine", ""), ""]
    if state.get("elapsed_s"):
        lines += ["Wall time per part: " + ", ".join(
            f"{p} {s / 60:.1f} min" for p, s in state["elapsed_s"].items()), ""]
    verdicts = state.get("goals") or {}
    if verdicts:
        ratio = verdicts.get("failover_ratio")
        lines += ["## Goals", "",
                  *[f"- {k}: {'met' if v else '**not met**'}" for k, v in verdicts.items()
                    if isinstance(v, bool)],
                  f"- failover median, node loss over process kill: "
                  f"{'–' if ratio is None else f'{ratio:.2f}x'}", ""]
    kills = state.get("kills") or {}
    if kills:
        lines += _render_kills(kills)
    if state.get("link"):
        lines += _render_link(state["link"])
    return "\n".join(lines)


def _render_kills(kills: Mapping[str, Any]) -> list[str]:
    lines = ["## Failover as a client sees it", "",
             "Each event under closed-loop stream clients (fresh streams per event). Node: "
             "the node holding the chosen member crashed (its raylet and every process on it "
             "killed), a node added back, the graph whole again. Process: `kill -9` of a "
             "primary, the same graph on the local launcher, this run. Split as HAMS does: "
             "detection (kill -> loss noticed), protocol (-> backups promoted), handover "
             "(-> first reply through the promoted primary); events with no failover (a "
             "backup's or a spare's node) count in the gap column only.", "",
             "| kills | events | consistent | with failover | detection ms (median / max) | "
             "protocol ms | handover ms | total ms | longest reply gap ms |", "|---" * 9 + "|"]
    for name, label in (("process", "process (kill -9)"), ("node", "node (crash)")):
        s = (kills.get(name) or {}).get("summary")
        if not s:
            continue
        med, top = s["failovers"]["median"], s["failovers"]["max"]
        lines.append(f"| {label} | {s['events']} | {s['consistent']} | "
                     f"{s['failovers']['kills']} | "
                     + " | ".join(f"{_ms(med[k])} / {_ms(top[k])}" for k in PHASES)
                     + f" | {_ms(s['gap_ms']['median'])} / {_ms(s['gap_ms']['max'])} |")
    lines.append("")
    node = kills.get("node") or {}
    if node.get("events"):
        lines += ["Node events per kind: " + ", ".join(
            f"{k} {n}" for k, n in node["summary"]["kinds"].items())
            + f"; of them on a node holding seq1's primary and seq2's backup (HAMS Fig. 6): "
            f"{node['summary']['fig6']}; detection by: "
            f"{', '.join(node['summary']['detections']) or '–'}"
            + (" (what noticed the lost members, events: " + ", ".join(
                f"{k} {n}" for k, n in node["summary"]["detectors"].items()) + ")"
               if node["summary"].get("detectors") else "")
            + ". The crash (every process "
            f"of the node SIGKILLed, then the node removed from Ray) took "
            f"{_ms(node['summary']['strike_ms']['median'])} ms (median), "
            f"{_ms(node['summary']['strike_ms']['max'])} ms (max): detection counts from the "
            "first SIGKILL (the harness's read of Ray's actor table before it is not "
            "counted).", "",
            "| # | kind | node held | detection | total ms | gap ms | rows sent | lost | "
            "errors | twice | pairs with two outputs | diverged streams | digests equal |",
            "|---" * 13 + "|"]
        for e in node["events"]:
            lines.append(
                f"| {e['index']} | {e['kind']} | {', '.join(e['held']) or '–'} | "
                f"{', '.join(e.get('detectors') or e.get('detections', [])) or '–'} | "
                f"{_ms(e['failover']['total_ms'])} | {_ms(e['gap_ms'])} | {e['sent']} | "
                f"{e['lost']} | {e['errors']} | {e['duplicates']} | {e['conflicts']} | "
                f"{e['diverged_streams']} | {'yes' if e['digests_equal'] else '**no**'} |")
        lines.append("")
    for name in ("process", "node"):
        problems = ((kills.get(name) or {}).get("summary") or {}).get("problems") or {}
        lines += [f"- {name} event {i}: {'; '.join(p)}" for i, p in problems.items()]
    return [*lines, ""]


def _render_link(link: Mapping[str, Any]) -> list[str]:
    reps = len(link["rows"][0]["each_mean_ms"]) if link["rows"] else 0
    return render_stocks(link, "unix", "State link: TCP (CURVE) against the Unix socket", (
        "The stocks graph on the local launcher twice, `state_link: unix` and "
        "`state_link: tcp` (CURVE, on loopback), side by side; open-loop Poisson arrivals of "
        f"requests of B rows at {link['load_share']:.0%} of the Unix server's saturation "
        f"(rows/s: {{sat}}), {reps} interleaved repetitions of {link['seconds']:g} s a cell; "
        "latency from each request's intended send time. `paired`: the median over "
        "repetitions of each repetition's TCP mean over its Unix mean."))
