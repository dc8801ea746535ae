"""The SERF benchmark's tail-aware part (issue 18, "tail-aware mode"): at a p99 SLO, the
cores the tail-aware controller keeps busy and the SLO it attains, against Ray Serve's
queue-length autoscaler, through the dynamic-load phases (moderate, low, moderate).

The tail-aware policy (``core/tail_policy``) reads a table of simulated p99s per load level
and configuration. The benchmark builds that table from the model's committed profile
(``parityserve profile``'s samples, ``core/tail_choice.tail_table``: what
``parityserve profile --slo-p99-ms`` writes), on a grid of 20 load levels so the policy's
rounding up of the load costs little, and keeps the profile with that table beside the
profile (``serf-profile-MODEL-tail.json``). While each run goes, ``/admin/state`` is polled every
0.2 s for c·intra, so cores are time-weighted per phase. Policies are interleaved within
each repetition; each run starts at c = 1, one thread.

``benchmarks/serf.py`` calls this part (``--parts ...,tail``); its pure rules are in
``serf_tail_analysis``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.report import markdown_table
from benchmarks.serf import MODEL_NAME, WARMUP, _apply_policy, _Runs, _switches
from benchmarks.serf_analysis import phased_schedule
from benchmarks.serf_tail_analysis import (
    auto_slo_ms,
    cores_by_phase,
    tail_phase_row,
    tail_summary,
)
from parityserve.bench.loadgen import HttpSender, json_sender, run_event_loop, run_open_loop
from parityserve.core.profiling import ProfileDocument, load_levels
from parityserve.core.tail_choice import tail_table

__all__ = ["TABLE_LEVELS", "tail_markdown", "tail_part"]

TABLE_LEVELS = 20  # load levels in the tail table (the profile's reference table has 10)
SAMPLE_S = 0.2  # how often the configuration is read during a run
POLICIES = ("serf-tail", "queue-length")


def tail_part(url: str, model: str, profile_file: Path, rates: list[float],
              bodies: list[bytes], args: argparse.Namespace, saved: _Runs) -> dict[str, Any]:
    doc = json.loads(profile_file.read_text())
    slo_ms, table = _table(doc, rates[0], args, saved)
    # The profile with the table the controller reads, kept beside the profile as a result.
    tail_file = profile_file.with_name(f"{profile_file.stem}-tail.json")
    tail_file.write_text(json.dumps({**doc, "tail_aware": table}, indent=1))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in POLICIES}
    for rep in range(args.dynamic_repeats):
        for name in POLICIES:
            key = f"tail-{name}-{rep}-slo{slo_ms:.6g}-lead{args.lead_in_seconds:g}"
            if saved.get(key) is None:
                saved.put(key, _run(url, name, tail_file, slo_ms, rates, bodies, args, rep))
            runs[name].append(saved.rows[key])
    return {"slo_ms": slo_ms, "slo_rule": "given" if args.tail_slo_ms else "auto",
            "rates": rates, "phase_seconds": args.phase_seconds,
            "lead_in_seconds": args.lead_in_seconds, "table_levels": len(table["levels"]),
            "runs": runs, "summary": tail_summary(runs)}


def _table(doc: dict[str, Any], moderate: float, args: argparse.Namespace, saved: _Runs
           ) -> tuple[float, dict[str, Any]]:
    """The SLO (given, or the automatic rule at the moderate phase's rate) and the table."""
    profile = ProfileDocument.from_dict(doc)
    measured = profile.measurements
    levels = load_levels(profile.profiles, cores=profile.cores,
                         oversubscribe=profile.oversubscribe, count=TABLE_LEVELS)
    slo_ms = args.tail_slo_ms
    if slo_ms is None:
        probe = tail_table(measured, [min((v for v in levels if v >= moderate),
                                          default=levels[-1])], 1.0, cores=profile.cores,
                           oversubscribe=profile.oversubscribe, seed=args.seed)
        slo_ms = auto_slo_ms(probe, moderate)
    key = f"tail-table-slo{slo_ms:.6g}"
    found = saved.get(key)
    if found is None:
        started = time.monotonic()
        found = tail_table(measured, levels, slo_ms / 1000, cores=profile.cores,
                           oversubscribe=profile.oversubscribe, seed=args.seed)
        found["simulated_s"] = time.monotonic() - started
        saved.put(key, found)
    print(f"tail-aware: p99 SLO {slo_ms:.3g} ms, table of {len(found['levels'])} load levels",
          flush=True)
    return float(slo_ms), found


def _run(url: str, name: str, tail_file: Path, slo_ms: float, rates: list[float],
         bodies: list[bytes], args: argparse.Namespace, rep: int) -> dict[str, Any]:
    policy, slo = ("serf", slo_ms) if name == "serf-tail" else ("queue-length", None)
    before = _apply_policy(url, policy, tail_file, slo)
    schedule, phase_of = phased_schedule(rates, args.phase_seconds,
                                         np.random.default_rng([args.seed, 11, rep]),
                                         lead_in_s=args.lead_in_seconds)
    result, samples = run_event_loop(_load(url, bodies, schedule, f"tail {name} #{rep + 1}"))
    starts = [args.lead_in_seconds + i * args.phase_seconds for i in range(len(rates))]
    cores = cores_by_phase(samples, starts, args.phase_seconds)
    phases = []
    for i, rate in enumerate(rates):
        mask = phase_of == i
        lat = result.latencies_s[mask & result.ok]
        row = tail_phase_row(lat, int((mask & ~result.ok).sum()), slo_ms, cores[i])
        phases.append({"phase": i, "rate": rate, **row})
    return {"policy": name, "rep": rep, "phases": phases,
            "switches": _switches(url) - before, "samples": len(samples)}


async def _load(url: str, bodies: list[bytes], schedule: np.ndarray, label: str
                ) -> tuple[Any, list[tuple[float, int]]]:
    """The open-loop run, with the configuration read every ``SAMPLE_S`` beside it (times
    from the schedule's start)."""
    from parityserve.client import Client

    samples: list[tuple[float, int]] = []
    async with HttpSender(url, limit=512) as http:
        send = json_sender(http, f"/{MODEL_NAME}/predict", bodies)
        for i in range(WARMUP):
            await send(i)
        start = time.perf_counter()

        async def sample() -> None:
            with Client(url, timeout=30.0) as client:
                while True:
                    state = await asyncio.to_thread(client.state)
                    model = next(m for m in state["models"] if m["name"] == MODEL_NAME)
                    samples.append((time.perf_counter() - start,
                                    int(model["parallelism"]) * int(model["threads"])))
                    await asyncio.sleep(SAMPLE_S)

        watcher = asyncio.create_task(sample())
        try:
            result = await run_open_loop(send, schedule, progress=label,
                                         rate_qps=schedule.size / max(float(schedule[-1]), 1e-9),
                                         max_in_flight=10_000, timeout_s=120)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
    return result, samples


def tail_markdown(tail: dict[str, Any]) -> str:
    columns: list[Any] = [("policy", "policy", "s"), ("switches", "switches", ".0f")]
    for i, rate in enumerate(tail["rates"]):
        columns += [(f"phase{i}_mean_cores", f"phase {i + 1} ({rate:.0f}/s) cores", ".2f"),
                    (f"phase{i}_attainment", "met SLO", ".1%"),
                    (f"phase{i}_p50_ms", "p50 ms", ".2f"), (f"phase{i}_p99_ms", "p99 ms", ".2f"),
                    (f"phase{i}_p999_ms", "p99.9 ms", ".2f"), (f"phase{i}_n", "n", "d")]
    columns += [("overall_cores", "whole run cores", ".2f"),
                ("overall_attainment", "whole run met SLO", ".1%")]
    rule = ("given" if tail["slo_rule"] == "given" else
            "automatic: 1.5x the lowest simulated p99 at the moderate rate")
    return "\n".join([
        f"Tail-aware mode (beyond SERF): p99 SLO {tail['slo_ms']:.2f} ms ({rule}); the "
        f"policy reads a table of simulated p99s at {tail['table_levels']} load levels. "
        "Cores are c x intra, time-weighted per phase; 'met SLO' is the share of queries "
        f"answered within it. {tail['phase_seconds']:.0f} s phases after an unmeasured "
        f"{tail['lead_in_seconds']:.0f} s lead-in, medians over "
        f"{max((r['repeats'] for r in tail['summary']), default=0)} repetitions, policies "
        "interleaved:", "", markdown_table(tail["summary"], columns), ""])
