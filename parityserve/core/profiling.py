"""SERF's profiler, the pure parts: what to measure, μ_i from timed samples, the profile
document, and the exhaustive baseline it is compared with (SERF Table II).

Profiling (SERF §IV-B, digest A2.2) runs every tuple (i, intra): exactly i requests
outstanding in a closed loop, i at once on the server (c = i), each with ``intra`` intra-op
threads. After a warm-up, the mean service time of the timed requests gives μ_i = 1 / mean,
a per-request rate. Per intra, μ_1..μ_n is what ``core/queueing`` needs to predict every
configuration (c, intra) with c ≤ n at any load, so profiling costs one short run per tuple.

The exhaustive baseline measures the mean latency of every configuration at every load level
directly, with open-loop Poisson load: configurations x levels runs, each of many queries.

Faithful tuples keep i·intra ≤ cores (SERF, after Eq. 13); ``oversubscribe`` (a labelled
extension) allows i·intra ≤ 2·cores, e.g. c = 4 on 2 cores. No clock and no I/O here: the
runtime (``bench/profiler.py``) times the requests and hands the samples in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from parityserve.core.queueing import Config, TableRow, configurations
from parityserve.core.scheduling.settings import OVERSUBSCRIBE_FACTOR

__all__ = ["SCHEMA", "SERVICE_TIMES", "Cell", "Cost", "Measurement", "ProfileDocument",
           "best_with_overhead", "compare_costs", "exhaustive_plan", "load_levels", "measure",
           "measured_best", "overheads", "profile_plan", "profiles_from", "thread_budget"]

SCHEMA = "parityserve.profile/1"
SERVICE_TIMES = ("server", "client")


def _whole(name: str, value: Any, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be a whole number >= {least}, got {value!r}")
    return value


def thread_budget(cores: int, *, oversubscribe: bool = False) -> int:
    """Threads all running requests may use together: the cores, or twice them when
    oversubscribed (``core/scheduling/settings.check_cores`` enforces the same live)."""
    return _whole("cores", cores) * (OVERSUBSCRIBE_FACTOR if oversubscribe else 1)


def profile_plan(cores: int, *, oversubscribe: bool = False,
                 intras: Sequence[int] | None = None,
                 max_c: int | None = None) -> tuple[Config, ...]:
    """Every tuple (i requests at once, intra threads) to profile, grouped by intra (threads
    change once per group) and by i within it, so each intra gets μ_1..μ_n with no gap.

    ``intras`` defaults to every count the budget allows; ``max_c`` caps i (e.g. at the
    replicas a deployment has). Raises ValueError when an asked intra cannot run even alone.
    """
    budget = thread_budget(cores, oversubscribe=oversubscribe)
    cap = budget if max_c is None else min(budget, _whole("max_c", max_c))
    chosen = sorted(set(intras)) if intras is not None else list(range(1, budget + 1))
    if not chosen:
        raise ValueError("intras is empty: give at least one thread count")
    plan: list[Config] = []
    for intra in chosen:
        if _whole("intra", intra) > budget:
            raise ValueError(f"intra {intra} needs more than the {budget} threads this machine "
                             f"allows ({cores} cores{', oversubscribed' if oversubscribe else ''})")
        plan += [Config(i, intra) for i in range(1, min(cap, budget // intra) + 1)]
    return tuple(plan)


@dataclass(frozen=True, slots=True)
class Measurement:
    """One profiled tuple: ``n`` timed requests, i = ``c`` at once, ``intra`` threads each."""

    c: int
    intra: int
    n: int
    mean_s: float
    mu: float  # 1 / mean_s: requests per second, per request in service
    p50_s: float
    p99_s: float
    warmup: int
    samples_s: tuple[float, ...] = ()  # the timed service times, for the simulator's tails
    # Mean time of a request outside its service slot (client, HTTP, frontend): a latency
    # prediction is the queue's W plus this. 0 when the client round trip is the service.
    overhead_s: float = 0.0

    @property
    def config(self) -> Config:
        return Config(self.c, self.intra)


def _quantile(ordered: Sequence[float], q: float) -> float:
    """The sample at quantile ``q`` (the 'higher' rule, as ``bench/stats``)."""
    return ordered[min(len(ordered) - 1, math.ceil(q * (len(ordered) - 1)))]


def measure(config: Config, latencies_s: Sequence[float], ok: Sequence[bool], *,
            warmup: int, min_timed: int = 10, slot_mean_s: float | None = None
            ) -> Measurement:
    """μ_i from one closed-loop run's samples, in completion order: the first ``warmup`` are
    discarded, the rest are timed. Raises ValueError when a timed request failed (a failure
    has no service time, and leaving it out would flatter the rate), or when fewer than
    ``min_timed`` remain.

    ``slot_mean_s``: the server's own mean time per timed request in its service slot (send
    to worker -> result back). Then that is the service time, μ_i = 1 / it, and the rest of
    the client's round trip is ``overhead_s``, spent outside the queue; the samples keep
    their spread, shifted by that overhead."""
    if len(latencies_s) != len(ok):
        raise ValueError(f"{len(latencies_s)} latencies but {len(ok)} outcomes")
    _whole("warmup", warmup, 0)
    timed, timed_ok = list(latencies_s[warmup:]), list(ok[warmup:])
    if not all(timed_ok):
        raise ValueError(f"{timed_ok.count(False)} of {len(timed)} timed requests failed at "
                         f"c={config.c}, intra={config.intra}: no trustworthy service time")
    if len(timed) < _whole("min_timed", min_timed):
        raise ValueError(f"{len(timed)} timed requests at c={config.c}, "
                         f"intra={config.intra}; at least {min_timed} are needed")
    for value in timed:
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"a service time must be a finite number > 0, got {value!r}")
    mean = math.fsum(timed) / len(timed)
    overhead = 0.0
    if slot_mean_s is not None:
        if not (math.isfinite(slot_mean_s) and slot_mean_s > 0):
            raise ValueError(f"slot_mean_s must be a finite number > 0, got {slot_mean_s!r}")
        overhead = max(0.0, mean - slot_mean_s)
        timed = [max(value - overhead, slot_mean_s * 1e-3) for value in timed]
        mean = slot_mean_s
    ordered = sorted(timed)
    return Measurement(config.c, config.intra, len(timed), mean, 1.0 / mean,
                       _quantile(ordered, 0.5), _quantile(ordered, 0.99), warmup, tuple(timed),
                       overhead)


def profiles_from(measurements: Iterable[Measurement]) -> dict[int, list[float]]:
    """``{intra: [μ_1, ..., μ_n]}`` for ``core/queueing``; ValueError on a gap in i or a
    tuple measured twice."""
    by_intra: dict[int, dict[int, float]] = {}
    for m in measurements:
        seen = by_intra.setdefault(m.intra, {})
        if m.c in seen:
            raise ValueError(f"c={m.c}, intra={m.intra} was measured twice")
        seen[m.c] = m.mu
    profiles = {}
    for intra, rates in sorted(by_intra.items()):
        if sorted(rates) != list(range(1, len(rates) + 1)):
            raise ValueError(f"intra={intra}: measured i = {sorted(rates)}; the model needs "
                             "every i from 1 up, with no gap")
        profiles[intra] = [rates[i] for i in range(1, len(rates) + 1)]
    return profiles


def load_levels(profiles: Mapping[int, Sequence[float]], *, cores: int,
                oversubscribe: bool = False, count: int = 10) -> list[float]:
    """SERF Fig. 11's load levels λ_k = k·λ_max/(count+1), k = 1..count, where λ_max is the
    highest throughput any allowed configuration sustains (max c·μ_c)."""
    _whole("count", count)
    allowed = configurations(profiles, cores=cores, oversubscribe=oversubscribe)
    top = max(c.c * profiles[c.intra][c.c - 1] for c in allowed)
    return [k * top / (count + 1) for k in range(1, count + 1)]


# ---------------------------------------------------------------- the profile document


@dataclass(frozen=True, slots=True)
class ProfileDocument:
    """What ``parityserve profile`` writes (JSON) and the controller or a benchmark reads.

    ``service_time`` says what was timed, with i in flight and no queue (c = i): ``server``
    is the time a request holds its service slot as the frontend sees it (dispatch to a
    worker until its result is back), the rest of the client's round trip kept apart as each
    measurement's ``overhead_s``; ``client`` is the whole round trip (``overhead_s`` 0).
    """

    model: str
    cores: int
    oversubscribe: bool
    measurements: tuple[Measurement, ...]
    elapsed_s: float
    service_time: str = "client"
    schema: str = SCHEMA

    @property
    def profiles(self) -> dict[int, list[float]]:
        return profiles_from(self.measurements)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["measurements"] = [asdict(m) for m in self.measurements]
        doc["profiles"] = {str(k): v for k, v in self.profiles.items()}
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ProfileDocument:
        """Read a document back; ValueError naming what is wrong (``profiles`` is derived
        from the measurements, so a copy that disagrees with them is refused)."""
        if not isinstance(doc, Mapping) or doc.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} document")
        try:
            measurements = tuple(Measurement(**{**m, "samples_s": tuple(m.get("samples_s", ()))})
                                 for m in doc["measurements"])
            made = cls(str(doc["model"]), _whole("cores", doc["cores"]),
                       bool(doc["oversubscribe"]), measurements, float(doc["elapsed_s"]),
                       str(doc.get("service_time", "client")))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed profile document: {exc}") from None
        for m in measurements:
            _check_measurement(m)
        if made.service_time not in SERVICE_TIMES:
            raise ValueError(f"service_time must be one of {SERVICE_TIMES}, got "
                             f"{made.service_time!r}")
        given = doc.get("profiles")
        if given is not None and given != {str(k): v for k, v in made.profiles.items()}:
            raise ValueError("'profiles' disagrees with the measurements")
        return made


def _check_measurement(m: Measurement) -> None:
    _whole("c", m.c)
    _whole("intra", m.intra)
    _whole("n", m.n)
    for name in ("mean_s", "mu", "p50_s", "p99_s"):
        value = getattr(m, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not (
                math.isfinite(value) and value > 0):
            raise ValueError(f"measurement c={m.c}, intra={m.intra}: {name} must be a finite "
                             f"number > 0, got {value!r}")
    if not all(isinstance(s, int | float) and math.isfinite(s) and s > 0 for s in m.samples_s):
        raise ValueError(f"measurement c={m.c}, intra={m.intra}: samples_s must be finite "
                         "numbers > 0")
    if isinstance(m.overhead_s, bool) or not isinstance(m.overhead_s, int | float) or not (
            math.isfinite(m.overhead_s) and m.overhead_s >= 0):
        raise ValueError(f"measurement c={m.c}, intra={m.intra}: overhead_s must be a finite "
                         f"number >= 0, got {m.overhead_s!r}")
    if not math.isclose(m.mu * m.mean_s, 1.0, rel_tol=1e-9):
        raise ValueError(f"measurement c={m.c}, intra={m.intra}: mu is not 1 / mean_s")


# ---------------------------------------------------------------- the exhaustive baseline


@dataclass(frozen=True, slots=True)
class Cell:
    """One exhaustive run: ``config`` at Poisson rate ``rate`` (queries/s)."""

    config: Config
    rate: float
    n: int
    mean_s: float
    p50_s: float
    p99_s: float
    p999_s: float
    errors: int


def exhaustive_plan(configs: Sequence[Config], levels: Sequence[float]
                    ) -> tuple[tuple[Config, float], ...]:
    """Every (configuration, load level), grouped by configuration (one switch per group)."""
    return tuple((config, level) for config in configs for level in levels)


def overheads(measurements: Iterable[Measurement]) -> dict[Config, float]:
    """Per configuration (c, intra), the time outside the queue its requests add: that of
    the tuple profiled with c at once."""
    return {m.config: m.overhead_s for m in measurements}


def best_with_overhead(row: TableRow, overhead: Mapping[Config, float]
                       ) -> tuple[Config, float]:
    """A reference-table row's best configuration and predicted mean latency once each
    configuration's overhead is added to the queue's W (a tie goes to the fewest cores)."""
    totals = [(ch.prediction.latency + overhead.get(ch.config, 0.0), ch.config)
              for ch in row.candidates]
    lowest = min(total for total, _ in totals)
    if math.isinf(lowest):
        return row.best.config, math.inf
    tied = [(cfg.cores, total, cfg) for total, cfg in totals
            if total <= lowest * (1.0 + 1e-9)]
    _, total, config = min(tied)
    return config, total


def measured_best(cells: Iterable[Cell]) -> dict[float, Config]:
    """Per load level, the configuration with the lowest measured mean latency among runs
    with no errors (a tie goes to the fewest cores, as ``queueing._pick``)."""
    best: dict[float, Cell] = {}
    for cell in cells:
        if cell.errors or not math.isfinite(cell.mean_s):
            continue
        held = best.get(cell.rate)
        key = (cell.mean_s, cell.config.cores, cell.config)
        if held is None or key < (held.mean_s, held.config.cores, held.config):
            best[cell.rate] = cell
    return {rate: cell.config for rate, cell in best.items()}


@dataclass(frozen=True, slots=True)
class Cost:
    """What a search cost: wall-clock seconds, runs (one per configuration switch and
    measurement) and requests sent."""

    seconds: float
    runs: int
    requests: int


def compare_costs(profiling: Cost, exhaustive: Cost) -> dict[str, float]:
    """SERF Table II's ratios: how many times more the exhaustive search cost."""
    def ratio(a: float, b: float) -> float:
        return a / b if b > 0 else math.inf

    return {"time_ratio": ratio(exhaustive.seconds, profiling.seconds),
            "runs_ratio": ratio(exhaustive.runs, profiling.runs),
            "requests_ratio": ratio(exhaustive.requests, profiling.requests)}
