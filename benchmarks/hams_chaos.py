"""The pure rules of ``benchmarks.hams``'s chaos part (issue 39): each stream's history
replayed through fresh LSTMs, the longest reply gap around each kill event, and the
tables. No I/O, so they have table tests (``tests/unit/benchmarks/test_hams_chaos_checker.py``).

**The replay check.** The chaos load runs the README's ``stocks`` graph without noise, so
every reply can be recomputed: each stream's steps, in the order its client sent them
(a client sends a stream's next step only after the last one's answer), through two
fresh LSTMs. A step answered with an output must match the replay; a step answered with
an error must have left no state behind: the next answered step of its stream matches
the replay *without* it. One that matches only *with* it was applied and then answered
with an error (a client that retries would apply it twice); one that matches neither is
a divergence (a state lost or applied twice). A stream is checked up to its first
divergence.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["KINDS", "Outcome", "ReplayVerdict", "StreamReplay", "event_gaps", "gap_table",
           "replay_streams", "render_chaos", "render_stocks"]

# event kinds, in the order the tables list them
KINDS = ("primary", "both primaries", "chain", "primary + spare", "backup",
         "stateless replica", "SIGSTOP 1 s")
_MAX_PENDING = 3  # consecutive errors of one stream tried both ways (2^3 branches)


@dataclass(frozen=True)
class Outcome:
    """One step of a stream: its input row, and the output answered (None: an error)."""

    x: tuple[float, ...]
    output: tuple[float, ...] | None
    error: str = ""  # the error's kind when ``output`` is None ("HTTP 503", "timeout")


# (h1, c1, h2, c2) -> (output, next state): one step through both LSTMs
Step = Callable[[tuple[Any, ...], Sequence[float]], tuple[tuple[float, ...], tuple[Any, ...]]]


@dataclass
class ReplayVerdict:
    streams: int = 0
    steps: int = 0
    answered: int = 0
    errors: int = 0
    matched: int = 0
    errors_after_applied: int = 0
    diverged_streams: int = 0
    unchecked: int = 0  # answered steps after a stream's divergence
    examples: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


@dataclass
class StreamReplay:
    """One stream's check, step by step: the states that agree with what it saw so far
    (more than one while errors are pending: applied or not, both are possible)."""

    step: Step
    start: tuple[Any, ...]
    atol: float = 1e-4
    rtol: float = 1e-3

    def run(self, name: str, history: Sequence[Outcome], verdict: ReplayVerdict) -> None:
        verdict.streams += 1
        # each candidate: (state, how many pending errors it applied)
        candidates: list[tuple[tuple[Any, ...], int]] = [(self.start, 0)]
        pending = 0
        for i, outcome in enumerate(history):
            verdict.steps += 1
            if outcome.output is None:
                verdict.errors += 1
                pending += 1
                if pending > _MAX_PENDING:  # too many unknowns in a row: assume none applied
                    candidates = [(s, a) for s, a in candidates if a == 0][:1] or candidates[:1]
                    pending = 1
                stepped = [(self.step(s, outcome.x)[1], a + 1) for s, a in candidates]
                candidates = candidates + stepped
                continue
            verdict.answered += 1
            found = [(s, a) for s, a in candidates if self._agrees(s, outcome)]
            if not found:
                verdict.diverged_streams += 1
                verdict.unchecked += sum(1 for o in history[i + 1:] if o.output is not None)
                if len(verdict.examples) < 5:
                    verdict.examples.append(f"{name} step {i}: {outcome.output} differs from "
                                            "every replay")
                return
            state, applied = min(found, key=lambda c: c[1])  # the fewest errors applied
            if applied and len(verdict.examples) < 5:
                verdict.examples.append(f"{name} step {i}: {applied} error(s) before it had "
                                        "been applied")
            verdict.errors_after_applied += applied
            verdict.matched += 1
            candidates, pending = [(self.step(state, outcome.x)[1], 0)], 0

    def _agrees(self, state: tuple[Any, ...], outcome: Outcome) -> bool:
        got = self.step(state, outcome.x)[0]
        assert outcome.output is not None
        return bool(np.allclose(got, outcome.output, atol=self.atol, rtol=self.rtol))


def replay_streams(histories: Mapping[str, Sequence[Outcome]], step: Step,
                   start: tuple[Any, ...]) -> ReplayVerdict:
    verdict = ReplayVerdict()
    for name, history in sorted(histories.items()):
        StreamReplay(step, start).run(name, history, verdict)
    return verdict


def event_gaps(replies_at: Sequence[float], events: Sequence[Mapping[str, Any]],
               end: float) -> list[float]:
    """For each event (``at``: when its first signal went), the longest time without a
    successful reply from it until the next event (or ``end``), in ms: from the event to
    the first reply after it, between consecutive replies, and from the last one to the
    next event (the load never pauses, so a silence there is the event's too)."""
    times = np.sort(np.asarray(replies_at, dtype=np.float64))
    gaps = []
    for event, nxt in zip(events, [*events[1:], None], strict=True):
        start, stop = float(event["at"]), float(nxt["at"]) if nxt else end
        inside = times[(times > start) & (times < stop)]
        points = np.concatenate([[start], inside, [stop]])
        gaps.append(float(np.diff(points).max()) * 1e3)
    return gaps


def gap_table(events: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per event kind: how many, and the median and max of their longest reply gaps."""
    out: dict[str, dict[str, Any]] = {}
    by_kind = {k: list(v) for k, v in itertools.groupby(
        sorted(events, key=lambda e: e["kind"]), key=lambda e: e["kind"])}
    for kind in [*KINDS, *sorted(set(by_kind) - set(KINDS))]:
        gaps = [e["gap_ms"] for e in by_kind.get(kind, []) if e.get("gap_ms") is not None]
        if gaps:
            out[kind] = {"events": len(gaps), "median_gap_ms": float(np.median(gaps)),
                         "max_gap_ms": float(max(gaps))}
    return out


def render_stocks(part: Mapping[str, Any], base: str = "bare",
                  heading: str = "Normal-case overhead on the README's stocks graph",
                  intro: str | None = None) -> list[str]:
    """The overhead table on the stocks graph, paired ratios (to ``base``) first; ``intro``
    says how it was measured ({sat}: ``base``'s saturation per request size)."""
    rows = part.get("rows") or []
    if not rows:
        return []
    sat = ", ".join(f"{rate:.0f} at {b} rows" for b, rate in sorted(
        part[f"{base}_saturation_rows_per_s"].items(), key=lambda x: int(x[0])))
    intro = intro or (
        "Open-loop Poisson arrivals of requests of B rows (B streams each) at "
        f"{part['load_share']:.0%} of `bare`'s saturation (rows/s: {{sat}}); the three "
        "modes' servers run side by side, measured in rotating order in each "
        f"repetition ({part.get('seconds', 0):g} s a cell); latency from each "
        "request's intended send time. `paired`: the median over repetitions of each "
        "repetition's hams (or remus) mean over bare's.")
    lines = [f"## {heading}", "", intro.format(sat=sat), "",
             "| mode | rows per request | mean ms | p50 ms | p99 ms | p99.9 ms | requests "
             f"(median) | errors | mean vs {base} (paired) | mean ms per rep |",
             "|---" * 10 + "|"]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['batch']} | {r['mean_ms']:.2f} | {r['p50_ms']:.2f} | "
            f"{r['p99_ms']:.2f} | {r['p999_ms']:.2f} | {r['n']:.0f} | {r.get('errors', 0):.0f} | "
            f"{_ratio(r.get(f'mean_vs_{base}_paired'))} | "
            f"{' / '.join(f'{m:.2f}' for m in r.get('each_mean_ms', []))} |")
    verdicts = part.get("targets") or {}
    if verdicts:
        lines += ["", "Targets: " + "; ".join(f"{k}: {'met' if v else '**not met**'}"
                                             for k, v in verdicts.items())]
    return [*lines, ""]


def render_chaos(part: Mapping[str, Any]) -> list[str]:
    lines = ["## Chaos on the README's stocks graph (kill events under load)", ""]
    for mode, run in part.items():
        if not isinstance(run, Mapping) or "events" not in run:
            continue
        v = run["replay"]
        calm = run.get("calm") or {}
        lines += [f"**{mode}**: {run['events_done']} events ({_counts(run['events'])}) in "
                  f"{run['elapsed_s'] / 60:.1f} min; {run['clients']} closed-loop clients, "
                  f"{run['streams']} streams, noise off.", "",
                  f"- requests sent: {run['sent']}, answered: {v['answered']}, lost (no "
                  f"answer, or 504): {run['lost']}, answered with an error: {v['errors']} "
                  f"({_counts_map(run['error_kinds'])})",
                  f"- answered with an error after their state was applied: "
                  f"{v['errors_after_applied']}; streams diverging from their replay: "
                  f"{v['diverged_streams']} (of {v['streams']}; {v['matched']} replies "
                  "checked)",
                  f"- (operator, sequence) pairs with two outputs: {run['conflicts']} (of "
                  f"{run['pairs']}); requests answered twice: {run['duplicates']}",
                  f"- permanent outages: {run['outages']}; failovers: {run['failovers']}; "
                  f"members lost by timeout not frozen by the benchmark: "
                  f"{run['false_timeouts']}",
                  f"- calm window before the kills ({calm.get('seconds', 0):g} s, "
                  f"{calm.get('hogs', 0)} CPU hogs): members lost "
                  f"{calm.get('losses', '–')}, of them by timeout {calm.get('timeouts', '–')}",
                  "", "| event | events | longest reply gap ms, median | max |",
                  "|---|---|---|---|"]
        for kind, row in run["gaps"].items():
            lines.append(f"| {kind} | {row['events']} | {row['median_gap_ms']:.0f} | "
                         f"{row['max_gap_ms']:.0f} |")
        lines += ["", *[f"- {e}" for e in v.get("examples", [])], ""]
    return lines


def _counts(events: Iterable[Mapping[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for e in events:
        counts[e["kind"]] = counts.get(e["kind"], 0) + 1
    return ", ".join(f"{k} {counts[k]}" for k in [*KINDS, *sorted(set(counts) - set(KINDS))]
                     if k in counts)


def _counts_map(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k}: {n}" for k, n in sorted(counts.items())) or "none"


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}x"
