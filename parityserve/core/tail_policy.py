"""The tail-aware controller policy (issue 18, "tail-aware mode"; beyond SERF): at the
estimated load, run the cheapest configuration whose p99 meets the SLO.

SERF predicts mean latency only, and a mean says little about a p99 SLO. The p99 of every
configuration at every load level is too slow to simulate inside a control loop, so it is
simulated once, offline, by ``parityserve profile --slo-p99-ms`` (``core/tail_choice``: the
discrete-event simulator driving the real scheduler on the profiled service times) and kept
in the profile document as a table: per load level, each configuration's simulated p99. The
policy reads the table, rounding the estimated load *up* to the next level (the
conservative side: a configuration that meets the SLO at a higher load meets it at a lower
one), and takes the fewest cores busy (c·intra) among the allowed configurations that meet
the SLO there. Above the table's last level, or where none meets the SLO, it falls back to
SERF's lowest mean latency, the best a missed SLO can get. A switch to more cores is made at
once: the SLO is being missed, and a queue built while waiting drains slowly (measured:
ResNet-20 going from 15% to 60% of λ_max reached a 2.5 s median when the scale-up waited).
A switch to fewer cores passes the same hysteresis as SERF's (the same target two periods
in a row), so a load near a level's edge does not flap.

Pure: the table is data, every time is an argument.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from parityserve.core.parallelism_control import Proposal, SerfPolicy, Snapshot
from parityserve.core.queueing import Config

__all__ = ["TailAwarePolicy", "TailRow", "TailTable", "read_tail_table"]


@dataclass(frozen=True, slots=True)
class TailRow:
    """One load level: each configuration's simulated p99 (``math.inf``: unstable there)."""

    rate: float
    p99_s: Mapping[Config, float]


@dataclass(frozen=True, slots=True)
class TailTable:
    slo_p99_s: float
    rows: tuple[TailRow, ...]  # by rate, ascending

    def level_for(self, rate: float) -> TailRow | None:
        """The lowest level at or above ``rate`` (None beyond the last)."""
        return next((row for row in self.rows if row.rate >= rate), None)


def _p99(candidate: Mapping[str, Any]) -> tuple[Config, float]:
    value = candidate.get("p99_s")
    config = Config(int(candidate["c"]), int(candidate["intra"]))
    return config, math.inf if value is None else float(value)


def read_tail_table(doc: Mapping[str, Any], *, slo_p99_ms: float) -> TailTable:
    """The ``tail_aware`` section of a profile document, for an SLO of ``slo_p99_ms``;
    ValueError naming what is wrong (no table, a table for another SLO, a malformed row)."""
    section = doc.get("tail_aware")
    rerun = (f"write one with `parityserve profile -c CONFIG --model M --slo-p99-ms "
             f"{slo_p99_ms:g}`")
    if not isinstance(section, Mapping):
        raise ValueError(f"the profile has no tail-aware table ({rerun})")
    try:
        made_for = float(section["slo_p99_ms"])
        rows = [TailRow(float(level["rate"]), dict(_p99(c) for c in level["candidates"]))
                for level in section["levels"]]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"malformed tail-aware table in the profile: {exc!r}") from None
    if not math.isclose(made_for, slo_p99_ms, rel_tol=1e-9):
        raise ValueError(f"the profile's tail-aware table is for p99 <= {made_for:g} ms, not "
                         f"{slo_p99_ms:g} ms ({rerun})")
    if not rows:
        raise ValueError(f"the profile's tail-aware table has no load levels ({rerun})")
    return TailTable(slo_p99_ms / 1000.0, tuple(sorted(rows, key=lambda r: r.rate)))


@dataclass(frozen=True, slots=True)
class TailAwarePolicy:
    """The cheapest allowed configuration that meets the p99 SLO at the estimated load,
    from ``table``; ``serf`` says which configurations are allowed and is the fallback."""

    serf: SerfPolicy
    table: TailTable
    name: str = "serf-tail"

    def _cheapest(self, row: TailRow) -> tuple[Config, float] | None:
        meeting = [(cfg.cores, p99, cfg) for cfg, p99 in row.p99_s.items()
                   if self.serf.allows(cfg) and p99 <= self.table.slo_p99_s]
        if not meeting:
            return None
        _, p99, config = min(meeting)
        return config, p99

    def propose(self, seen: Snapshot) -> Proposal:
        slo_ms = self.table.slo_p99_s * 1000
        row = self.table.level_for(seen.arrival_rate)
        found = None if row is None else self._cheapest(row)
        if row is None or found is None:
            fallback = self.serf.propose(seen)
            where = ("above the table's last load level" if row is None else
                     f"no allowed configuration meets p99 <= {slo_ms:g} ms at {row.rate:.3g}/s")
            return Proposal(fallback.target, f"{where}: lowest mean latency, "
                            f"{fallback.reason}", fallback.predicted_current_s,
                            fallback.predicted_target_s, fallback.gain, gated=True)
        target, p99 = found
        now = self.serf.predict(seen.arrival_rate, seen.current)
        then = self.serf.predict(seen.arrival_rate, target)
        why = (f"fewest cores meeting p99 <= {slo_ms:g} ms at up to {row.rate:.3g}/s: "
               f"c={target.c}, intra={target.intra} (simulated p99 {p99 * 1000:.3g} ms)")
        # Fast up, slow down: more cores go in at once (the SLO is being missed now, and a
        # queue built while waiting drains only slowly); fewer wait out the hysteresis.
        return Proposal(target, why, None if now is None else now.latency,
                        None if then is None else then.latency,
                        gain=0.0 if target == seen.current else 1.0,
                        gated=target.cores <= seen.current.cores)
