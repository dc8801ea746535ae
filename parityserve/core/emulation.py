"""Emulated accelerators: how long a worker holds a batch, drawn from a service-time profile.

An *emulated-accelerator* worker computes the real model's output (so every answer, and every
decoded answer, is the real one) and then holds the batch until a service time drawn here has
passed, sleeping meanwhile, as a host thread waits on a GPU. The frontend, queues, coding,
transport and fault injection stay real; only the model's compute time is replaced. That lets
ParM's cluster sizes (12 + 6 instances and more) run on a small machine with its CPU left to
the frontend. Anything measured this way is an emulation, and says so (``label``).

A profile gives a batch of n queries the mean service time ``base_ms + per_query_ms * n``,
and draws each batch's time around that mean: ``constant`` (always the mean) or ``lognormal``
with coefficient of variation ``cv`` (mean preserved). The draw is pure: the caller passes
its random generator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from parityserve.errors import ConfigError

__all__ = ["PROFILES", "ServiceProfile", "draw_service_s", "profile_named"]

Distribution = Literal["constant", "lognormal"]


@dataclass(frozen=True, slots=True)
class ServiceProfile:
    """Per-batch service time of an emulated accelerator, and where the numbers come from."""

    name: str
    base_ms: float
    per_query_ms: float
    source: str
    distribution: Distribution = "lognormal"
    cv: float = 0.0

    def __post_init__(self) -> None:
        for field, value in (("base_ms", self.base_ms), ("per_query_ms", self.per_query_ms),
                             ("cv", self.cv)):
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"emulation {field} must be a finite number >= 0, got {value}")
        if self.base_ms + self.per_query_ms <= 0:
            raise ConfigError("emulation needs base_ms + per_query_ms > 0 (a batch of one "
                              "must take some time)")
        if self.distribution not in ("constant", "lognormal"):
            raise ConfigError(f"emulation distribution must be constant or lognormal, got "
                              f"{self.distribution!r}")
        if not self.source.strip():
            raise ConfigError("emulation needs a source: where its service times come from")

    def mean_ms(self, batch_size: int) -> float:
        return self.base_ms + self.per_query_ms * max(1, batch_size)

    @property
    def sigma(self) -> float:
        """The spread of the lognormal factor around the mean (0: constant). The factor is
        exp(N(-sigma^2/2, sigma^2)), whose mean is 1, so ``mean_ms`` is kept."""
        if self.distribution == "constant":
            return 0.0
        return math.sqrt(math.log1p(self.cv ** 2))

    @property
    def label(self) -> str:
        """What every result measured on this profile must carry in its title."""
        spread = "constant" if self.distribution == "constant" or self.cv == 0 else \
            f"lognormal cv {self.cv:g}"
        return (f"EMULATED accelerator '{self.name}': {self.base_ms:g} ms + "
                f"{self.per_query_ms:g} ms/query, {spread} (source: {self.source})")


def draw_service_s(profile: ServiceProfile, batch_size: int, rng: np.random.Generator) -> float:
    """One batch's service time in seconds: the profile's mean for ``batch_size`` queries,
    spread by its distribution (the lognormal keeps the mean)."""
    mean, sigma = profile.mean_ms(batch_size), profile.sigma
    if sigma == 0:
        return mean / 1000
    return float(mean * rng.lognormal(-sigma * sigma / 2, sigma)) / 1000


_PARM_SOURCE = (
    "ParM (Kosaian et al., SOSP'19) section 6: ResNet-18 on one K80 GPU per instance, 12 "
    "instances serve 300 q/s at batch 1, 460 at batch 2, 584 at batch 4 (same utilisation); "
    "the batch-size scaling gives base 0.65 + 0.35 n of the batch-1 time, and 30 ms at batch 1 "
    "is our assumption (75% utilisation at 300 q/s; the paper says only 'tens of "
    "milliseconds'); cv 0.05 is assumed too (the tail comes from background load, not the GPU)")

PROFILES: dict[str, ServiceProfile] = {
    p.name: p for p in (
        ServiceProfile("parm-gpu-resnet18", base_ms=19.5, per_query_ms=10.5, cv=0.05,
                       source=_PARM_SOURCE),
    )
}


def profile_named(name: str) -> ServiceProfile:
    """A built-in profile, or ConfigError listing the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigError(f"unknown emulation profile {name!r}; built in: "
                          f"{', '.join(sorted(PROFILES))} (or give base_ms, per_query_ms and "
                          "source)") from None
