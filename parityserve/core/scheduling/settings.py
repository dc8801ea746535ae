"""The settings a serving path schedules by: plain frozen records, built by each driver from
its own configuration (``config.Deployment`` in the runtime, ``SimConfig`` in the simulator)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["MODES", "OVERSUBSCRIBE_FACTOR", "PARALLELISM_MODES", "Batching", "ModeSettings",
           "ParitySettings", "check_cores", "check_parallelism"]

MODES = ("none", "equal-resources", "replication", "reactive", "parm", "berrut",
         "systematic-berrut")

# The modes a service-parallelism limit (issue 18's knob c) applies to. The others run one
# batch's copies (replication, reactive) or a group's coded tasks (berrut, systematic-berrut)
# side by side on data replicas: a limit below the group would serialise what the mode exists
# to run at once, so it is refused rather than half-honoured. ParM is allowed because its
# redundancy runs in parity pools of their own, which the limit does not count.
PARALLELISM_MODES = frozenset({"none", "equal-resources", "parm"})


def check_parallelism(parallelism: int | None, mode: str) -> None:
    """Raise ValueError unless ``parallelism`` (None: unlimited) may be used with ``mode``."""
    if parallelism is None:
        return
    if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
        raise ValueError(f"parallelism must be a whole number >= 1 (or null for unlimited), "
                         f"got {parallelism!r}")
    if mode not in PARALLELISM_MODES:
        raise ValueError(f"parallelism cannot be limited under redundancy {mode!r}: it runs "
                         "a batch's copies or a group's coded tasks side by side on data "
                         f"replicas; use one of {', '.join(sorted(PARALLELISM_MODES))}")


# Oversubscription (a labelled extension beyond SERF's faithful setting): up to this many
# threads per core in all, e.g. c = 4 single-threaded requests at once on 2 cores. It makes
# interference over caches and memory bandwidth visible; it is never the default.
OVERSUBSCRIBE_FACTOR = 2


def check_cores(parallelism: int, threads: int, cores: int, *,
                oversubscribe: bool = False) -> None:
    """Raise ValueError unless ``parallelism`` requests at once with ``threads`` intra-op
    threads each fit on ``cores`` cores: c x intra <= cores in SERF's faithful setting, or
    c x intra <= OVERSUBSCRIBE_FACTOR x cores when the deployment opts into oversubscription."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a whole number >= 1, got {threads!r}")
    budget = cores * (OVERSUBSCRIBE_FACTOR if oversubscribe else 1)
    if parallelism * threads > budget:
        hint = ("" if oversubscribe else "; set oversubscribe: true on the deployment to allow "
                f"up to {OVERSUBSCRIBE_FACTOR * cores} (a labelled extension)")
        raise ValueError(f"{parallelism} requests at once x {threads} threads each = "
                         f"{parallelism * threads} threads, more than the {budget} this machine "
                         f"allows ({cores} cores{', oversubscribed' if oversubscribe else ''})"
                         f"{hint}")


@dataclass(frozen=True, slots=True)
class Batching:
    """The batch ceiling, delayed batching's wait for a partial batch, and how long a partial
    batch may wait while the frontend is saturated (``Scheduler.saturated``)."""

    max_batch_size: int
    max_delay_s: float = 0.0
    busy_delay_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ParitySettings:
    """ParM: k batches per group, r parity models, how parities are encoded and waited for."""

    k: int = 2
    r: int = 1
    coefficients: Sequence[Sequence[float]] | None = None  # None: the default code
    encoder: Literal["addition", "concat"] = "addition"
    grace_s: float | None = None  # wait this long for a late batch before rebuilding it
    group_wait_s: float = 0.005  # close a group that has not filled after this long


@dataclass(frozen=True, slots=True)
class ModeSettings:
    """One redundancy mode and its parameters (the others are ignored)."""

    mode: str = "none"
    copies: int = 2  # replication: d
    reissue_after_s: float | None = None  # reactive
    parity: ParitySettings | None = None  # parm
    K: int = 2  # berrut, systematic-berrut
    S: int = 1
    E: int = 0
    workers: int | None = None  # berrut: coded tasks per group (None: the minimum)
    decoder: str = "interpolate"  # systematic-berrut: interpolate or subtract
    # berrut modes: a partial group waits up to this long (from its oldest query) for more
    # queries before it is coded; 0 forms it at once (see ``Redundancy.form_wait_s``)
    group_wait_s: float = 0.0
