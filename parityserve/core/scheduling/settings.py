"""The settings a serving path schedules by: plain frozen records, built by each driver from
its own configuration (``config.Deployment`` in the runtime, ``SimConfig`` in the simulator)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["MODES", "Batching", "ModeSettings", "ParitySettings"]

MODES = ("none", "equal-resources", "replication", "reactive", "parm", "berrut",
         "systematic-berrut")


@dataclass(frozen=True, slots=True)
class Batching:
    """The batch ceiling and delayed batching's wait for a partial batch."""

    max_batch_size: int
    max_delay_s: float = 0.0


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
