"""The online parallelism controller, the pure part: estimate the load, choose a configuration,
and hold back switches that would not pay (issue 18, items 4 and 5).

Each period the runtime (``runtime/fleet/parallelism.py``) hands in what it saw: the arrival times
of the queries the model took since the last tick, their answered latencies, and how many are
queued or running. ``Controller.tick`` returns a ``Decision``: the configuration to run from
now on, and why. Three policies share one interface:

* ``serf``: the arrival rate over a sliding window (``ArrivalMonitor``) goes into SERF's
  queueing model (``core/queueing``) over the profiled μ_i of every (c, intra); the argmin of
  predicted mean latency is the target. A switch needs ``Hysteresis``: the predicted gain
  (W_current - W_target) / W_current above a threshold, for the same target, two periods in a
  row. Switching back then needs the gain the other way, so there is a dead band around each
  boundary and a load that holds still never flaps.
* ``fixed``: one configuration, applied at once (an operator's statement, not an estimate).
* ``queue-length``: Ray Serve's autoscaler (``core/autoscale``) with c as its replica count
  and intra fixed; its upscale/downscale delays are its own hysteresis.

Pure: every time is an argument; nothing reads a clock or does I/O.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from parityserve.core.autoscale import (
    Observation,
    QueueLengthConfig,
    QueueLengthState,
    initial_state,
    observe,
)
from parityserve.core.queueing import Config, Prediction, configurations, predict_latency

__all__ = ["ArrivalMonitor", "Controller", "Decision", "FixedPolicy", "Hysteresis",
           "LatencyWindow", "Policy", "Proposal", "QueueLengthPolicy", "SerfPolicy",
           "PROFILE_SCHEMA", "SerfProfile", "Snapshot", "read_profile"]

PROFILE_SCHEMA = "parityserve.profile/1"  # what `parityserve profile` writes


# ---------------------------------------------------------------- what was seen


# Both windows keep counts per slice of window_s / _SLICES, not one entry per query: memory
# stays bounded at any rate, and an arrival's time is rounded up to its slice's end (an
# error of at most 1/_SLICES of the window, at its two edges).
_SLICES = 200


def _slice(time_s: float, width: float) -> int:
    """The slice ((k-1)·width, k·width] that ``time_s`` falls in; the rounding keeps a time
    on a boundary (5.0 / 0.025) out of the next slice despite float noise."""
    return math.ceil(round(time_s / width, 9))


class ArrivalMonitor:
    """Arrival rate over the last ``window_s`` seconds (or since ``start_s``, while the window
    is not yet full: dividing a young window by its full width would read low)."""

    def __init__(self, window_s: float, start_s: float) -> None:
        if not (math.isfinite(window_s) and window_s > 0):
            raise ValueError(f"window_s must be a finite number > 0, got {window_s!r}")
        self.window_s = window_s
        self.start_s = start_s
        self.width = window_s / _SLICES
        self._slices: deque[list[int]] = deque()  # [slice, arrivals], oldest first

    def record(self, times: Iterable[float]) -> None:
        """Arrival timestamps, oldest first (an older one than the last counts with it)."""
        for t in times:
            key = _slice(t, self.width)
            if self._slices and key <= self._slices[-1][0]:
                self._slices[-1][1] += 1
            else:
                self._slices.append([key, 1])

    def rate(self, now: float) -> float:
        """Arrivals per second in (now - window_s, now]."""
        opens = _slice(now - self.window_s, self.width)
        while self._slices and self._slices[0][0] <= opens:
            self._slices.popleft()
        width = min(self.window_s, now - self.start_s)
        if width <= 0:
            return 0.0
        last = _slice(now, self.width)
        return sum(n for key, n in self._slices if key <= last) / width


class LatencyWindow:
    """Mean answered latency over the last ``window_s`` seconds (None: nothing answered)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.width = window_s / _SLICES
        self._slices: deque[list[float]] = deque()  # [slice, latency sum, answers]

    def record(self, samples: Iterable[tuple[float, float]]) -> None:
        """(answered at, latency) pairs, oldest first."""
        for done, latency in samples:
            key = _slice(done, self.width)
            if self._slices and key <= self._slices[-1][0]:
                self._slices[-1][1] += latency
                self._slices[-1][2] += 1
            else:
                self._slices.append([key, latency, 1])

    def mean(self, now: float) -> float | None:
        opens = _slice(now - self.window_s, self.width)
        while self._slices and self._slices[0][0] <= opens:
            self._slices.popleft()
        count = sum(n for _, _, n in self._slices)
        return math.fsum(total for _, total, _ in self._slices) / count if count else None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One tick's inputs to a policy."""

    time_s: float
    arrival_rate: float  # the monitor's estimate, per second
    ongoing: int  # queued plus running, for the queue-length policy
    current: Config


@dataclass(frozen=True, slots=True)
class Proposal:
    """A policy's answer: the configuration it wants, and for SERF the predicted mean latency
    of the current and of the wanted one (None where the policy has no model). ``gated``:
    the switch must pass ``Hysteresis`` (SERF); the others decide their own timing."""

    target: Config
    reason: str
    predicted_current_s: float | None = None
    predicted_target_s: float | None = None
    gain: float = 0.0  # relative predicted gain of target over current; 0 if none
    gated: bool = False


class Policy(Protocol):
    @property
    def name(self) -> str: ...

    def propose(self, seen: Snapshot) -> Proposal: ...


# ---------------------------------------------------------------- the profile


@dataclass(frozen=True, slots=True)
class SerfProfile:
    """The part of a profile document the controller reads: μ_1..μ_n per intra threads, and
    per configuration the mean time its requests spend outside the queue (``overhead_s`` of
    the tuple profiled with c at once: HTTP, the frontend, the ZeroMQ hop). That time is
    added to the queue's W before configurations are ranked, as the profiler's own
    reference table does (``profiling.best_with_overhead``): a configuration that crowds the
    frontend's core pays for it there."""

    model: str
    cores: int
    oversubscribe: bool
    profiles: Mapping[int, tuple[float, ...]]
    overheads: Mapping[Config, float] = field(default_factory=dict)


def _derive(measurements: Any) -> dict[int, tuple[float, ...]]:
    by_intra: dict[int, dict[int, float]] = {}
    for m in measurements:
        by_intra.setdefault(int(m["intra"]), {})[int(m["c"])] = float(m["mu"])
    out = {}
    for intra, rates in by_intra.items():
        if sorted(rates) != list(range(1, len(rates) + 1)):
            raise ValueError(f"intra={intra}: measured c = {sorted(rates)}, need 1..n with no gap")
        out[intra] = tuple(rates[i] for i in range(1, len(rates) + 1))
    return out


def read_profile(doc: Any, *, model: str) -> SerfProfile:
    """Check a parsed profile document (``parityserve profile`` writes it) against ``model``;
    ValueError naming what is wrong."""
    if not isinstance(doc, dict) or doc.get("schema") != PROFILE_SCHEMA:
        raise ValueError(f"not a {PROFILE_SCHEMA} document (write one with `parityserve "
                         "profile`)")
    if doc.get("model") != model:
        raise ValueError(f"the profile is of model {doc.get('model')!r}, not {model!r}")
    try:
        given = doc.get("profiles")
        profiles = ({int(k): tuple(float(r) for r in v) for k, v in given.items()}
                    if given else _derive(doc["measurements"]))
        cores, over = int(doc["cores"]), bool(doc.get("oversubscribe", False))
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed profile document: {exc!r}") from None
    configurations(profiles, cores=cores, oversubscribe=over)  # raises on bad rates
    return SerfProfile(model, cores, over, profiles, _overheads(doc.get("measurements")))


def _overheads(measurements: Any) -> dict[Config, float]:
    """``overhead_s`` per profiled (c, intra); none in an older document: all 0."""
    out = {}
    for m in measurements or ():
        try:
            value = float(m.get("overhead_s", 0.0))
            config = Config(int(m["c"]), int(m["intra"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed profile measurement {m!r}: {exc!r}") from None
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"overhead_s must be a finite number >= 0, got {value!r} at "
                             f"c={config.c}, intra={config.intra}")
        out[config] = value
    return out


# ---------------------------------------------------------------- policies


@dataclass(frozen=True, slots=True)
class FixedPolicy:
    """Always ``config``."""

    config: Config
    name: str = "fixed"

    def propose(self, seen: Snapshot) -> Proposal:
        return Proposal(self.config, f"fixed at c={self.config.c}, intra={self.config.intra}")


def _gain(current: Prediction | None, target: Prediction, cap_cur: float,
          cap_target: float) -> float:
    """Relative predicted gain of target over current. Both unstable: the gain in throughput
    c·μ_c (the queue that drains faster is less bad); current unknown or unstable: 1."""
    if current is None or (not current.stable and target.stable):
        return 1.0
    if not current.stable:
        return max(0.0, (cap_target - cap_cur) / cap_target)
    return max(0.0, (current.latency - target.latency) / current.latency)


@dataclass(frozen=True, slots=True)
class SerfPolicy:
    """SERF: the configuration with the lowest predicted mean latency at the estimated λ
    (a tie goes to the fewest cores), among the profiled ones with c ≤ ``max_c`` (the
    replicas) and c·intra ≤ ``max_threads`` (what the server lets run; None: no limit)."""

    profile: SerfProfile
    max_c: int
    max_threads: int | None = None
    name: str = "serf"
    _configs: tuple[Config, ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        found = configurations(self.profile.profiles, cores=self.profile.cores,
                               oversubscribe=self.profile.oversubscribe)
        top = self.max_threads
        allowed = tuple(cfg for cfg in found
                        if cfg.c <= self.max_c and (top is None or cfg.cores <= top))
        if not allowed:
            raise ValueError(f"no profiled configuration has c <= {self.max_c} (the replicas)"
                             + ("" if top is None else f" and c x intra <= {top} threads"))
        object.__setattr__(self, "_configs", allowed)

    def allows(self, config: Config) -> bool:
        """Profiled, and within the replicas and the threads the server lets run."""
        return config in self._configs

    def predict(self, rate: float, config: Config) -> Prediction | None:
        """The queue's W plus the configuration's overhead outside it (stable only)."""
        if config not in self._configs:
            return None
        found = predict_latency(rate, self.profile.profiles[config.intra][:config.c])
        extra = self.profile.overheads.get(config, 0.0)
        return replace(found, latency=found.latency + extra) if found.stable else found

    def _capacity(self, config: Config) -> float:
        return config.c * self.profile.profiles[config.intra][config.c - 1]

    def _best(self, rate: float) -> tuple[Config, Prediction]:
        scored = [(cfg, p) for cfg in self._configs if (p := self.predict(rate, cfg))]
        low = min(p.latency for _, p in scored)
        if math.isinf(low):
            return min(scored, key=lambda s: (s[1].rho, s[0].cores, s[0]))
        tied = [s for s in scored if s[1].latency <= low * (1 + 1e-9)]
        return min(tied, key=lambda s: (s[0].cores, s[1].latency, s[0]))

    def propose(self, seen: Snapshot) -> Proposal:
        target, best = self._best(seen.arrival_rate)
        now = self.predict(seen.arrival_rate, seen.current)
        cap_cur = self._capacity(seen.current) if now is not None else 0.0
        gain = 0.0 if target == seen.current else _gain(now, best, cap_cur,
                                                         self._capacity(target))
        why = (f"best c={target.c}, intra={target.intra}"
               + ("" if now is not None else "; current configuration not profiled"))
        return Proposal(target, why, None if now is None else now.latency, best.latency,
                        gain, gated=True)


class QueueLengthPolicy:
    """Ray Serve's queue-length autoscaler driving c (its replica count); intra stays fixed."""

    name = "queue-length"

    def __init__(self, config: QueueLengthConfig, intra: int) -> None:
        self.config = config
        self.intra = intra
        self.state: QueueLengthState = initial_state(config)

    def propose(self, seen: Snapshot) -> Proposal:
        self.state = observe(self.config, self.state, Observation(seen.time_s, seen.ongoing))
        s = self.state
        why = (f"ongoing {s.average:.3g} averaged, target "
               f"{self.config.target_ongoing_requests:g}/replica: desired c={s.desired}"
               + (f", waiting out the {'up' if s.pending > 0 else 'down'}scale delay"
                  if s.pending else ""))
        return Proposal(Config(s.replicas, self.intra), why)


# ---------------------------------------------------------------- hysteresis and the loop


@dataclass(slots=True)
class Hysteresis:
    """Pass a switch only when the gain exceeds ``threshold`` for ``periods`` ticks in a row,
    each wanting the same target from the same current configuration."""

    threshold: float
    periods: int = 2
    _streak: int = 0
    _wanted: tuple[Config, Config] | None = None

    def __post_init__(self) -> None:
        if not (0 <= self.threshold < 1):
            raise ValueError(f"gain threshold must lie in [0, 1), got {self.threshold!r}")
        if self.periods < 1:
            raise ValueError(f"periods must be >= 1, got {self.periods!r}")

    def admit(self, current: Config, proposal: Proposal) -> tuple[bool, str]:
        """(switch now?, why)."""
        wanted = (current, proposal.target)
        if proposal.target == current or proposal.gain <= self.threshold:
            self._streak, self._wanted = 0, None
            return False, "" if proposal.target == current else (
                f"gain {proposal.gain:.1%} <= threshold {self.threshold:.0%}")
        self._streak = self._streak + 1 if wanted == self._wanted else 1
        self._wanted = wanted
        if self._streak < self.periods:
            return False, f"gain {proposal.gain:.1%}, period {self._streak} of {self.periods}"
        self._streak, self._wanted = 0, None
        return True, f"gain {proposal.gain:.1%} for {self.periods} periods"


@dataclass(frozen=True, slots=True)
class Decision:
    """One tick: what was estimated, what was running, what runs from now on, and why."""

    time_s: float
    policy: str
    arrival_rate: float
    current: Config
    chosen: Config
    switched: bool
    reason: str
    predicted_current_s: float | None
    predicted_chosen_s: float | None
    observed_s: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"time_s": self.time_s, "policy": self.policy,
                "arrival_rate": self.arrival_rate,
                "current": {"c": self.current.c, "intra": self.current.intra},
                "chosen": {"c": self.chosen.c, "intra": self.chosen.intra},
                "switched": self.switched, "reason": self.reason,
                "predicted_current_ms": _ms(self.predicted_current_s),
                "predicted_chosen_ms": _ms(self.predicted_chosen_s),
                "observed_ms": _ms(self.observed_s)}


def _ms(seconds: float | None) -> float | None:
    # JSON has no infinity: an unstable prediction shows as null, and the reason says why.
    return None if seconds is None or not math.isfinite(seconds) else seconds * 1000


class Controller:
    """One model's controller: a monitor, a policy, the hysteresis gate, and the record."""

    def __init__(self, policy: Policy, *, window_s: float, gain_threshold: float,
                 start_s: float) -> None:
        self.monitor = ArrivalMonitor(window_s, start_s)
        self.latency = LatencyWindow(window_s)
        self.policy = policy
        self.gate = Hysteresis(gain_threshold)
        self.switches = 0
        self.last: Decision | None = None

    def set_policy(self, policy: Policy, gain_threshold: float, *, window_s: float,
                   now: float) -> None:
        """A new policy starts with no streak; the load seen so far is kept, unless the
        window changes width (then the estimate starts afresh at ``now``)."""
        self.policy = policy
        self.gate = Hysteresis(gain_threshold)
        if window_s != self.monitor.window_s:
            self.monitor = ArrivalMonitor(window_s, now)
            self.latency = LatencyWindow(window_s)

    def tick(self, now: float, current: Config, ongoing: int,
             arrivals: Sequence[float] = (),
             answered: Sequence[tuple[float, float]] = ()) -> Decision:
        self.monitor.record(arrivals)
        self.latency.record(answered)
        seen = Snapshot(now, self.monitor.rate(now), ongoing, current)
        proposal = self.policy.propose(seen)
        switched, why = self._judge(current, proposal)
        chosen = proposal.target if switched else current
        self.switches += switched
        predicted = proposal.predicted_target_s if chosen == proposal.target else (
            proposal.predicted_current_s)
        self.last = Decision(now, self.policy.name, seen.arrival_rate, current, chosen,
                             switched, "; ".join(x for x in (proposal.reason, why) if x),
                             proposal.predicted_current_s, predicted, self.latency.mean(now))
        return self.last

    def _judge(self, current: Config, proposal: Proposal) -> tuple[bool, str]:
        if not proposal.gated:
            return proposal.target != current, ""
        return self.gate.admit(current, proposal)
