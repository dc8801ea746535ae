"""Admission control: how many queries a model may queue, and whether one more fits.

The rule (the default when ``server.max_queue`` is not set):

* Each replica's **service estimate** is an EWMA over its completed data batches of the
  batch's round-trip time and of its rows. The model's (``pooled``) is the mean of its
  replicas' rates, ``rows / batch_s``, and the median replica's batch time: ``c`` ready
  replicas complete ``c`` times the mean rate queries per second (``per_query_s`` is one over
  it). Pooling per replica, not one EWMA over every batch, is what keeps one straggler from
  passing for the whole model: a replica slowed to 3 s, whose batches ParM rebuilds in
  milliseconds, adds its small rate, where a shared EWMA took its 3 s batches for the model's
  batch time and shed queries the fast replicas would have answered in time.
* While some serving replica has **no measurement yet** (``complete=False``: ParM answered
  its first queries without it, it was just restarted, or a parallelism switch just let it
  serve), its rate is unknown, not zero: the bound is the larger of the measured one and the
  unmeasured default, and no wait is predicted from the measured replicas alone. The
  straggler measured alone once bounded a ParM model's queue at 4 beside an idle fast
  replica; the unmeasured default alone (4 batches each) shed queries the measured fast
  replicas had room for after a parallelism switch.
* Its **queue bound** is what those replicas can still finish within the SLO (the tightest
  SLO of the applications that use the model, else the deployment's ``timeout_ms``):
  ``bound = floor((slo_s - batch_s) * c / per_query_s)``, at least ``c`` (one query per
  replica can always wait). Before any batch has completed there is no measurement, and the
  bound is the conservative ``UNMEASURED_BATCHES`` full batches per replica.
* A query is **admitted** when the queue holds fewer than ``bound`` queries and, once measured,
  the expected wait (``depth * per_query_s / c``) plus one batch still ends before the query's
  own deadline. Otherwise it is shed with ``retry_after_s``: the time the queue needs to drain,
  in whole seconds, at least 1. A single query that finds the queue empty is admitted: it is
  the probe that keeps the measurement fresh, so one slow batch (a warm-up, a pause) cannot
  make the model refuse everything forever.
* A queued query is **not dispatched** when one batch (``batch_s``) can no longer finish before
  its deadline: it is answered at once (the default, or 504), not computed to be thrown away,
  unless nothing else waits (the same probe).

An explicit ``server.max_queue`` caps the queue on top of this (``DeadlineQueue``'s capacity).
Everything here is pure: the runtime passes in the clock's reading and the replica count.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["UNMEASURED_BATCHES", "Admission", "ServiceEstimate", "admit", "can_finish",
           "pooled", "queue_bound", "retry_after"]

UNMEASURED_BATCHES = 4  # queued full batches per replica allowed before any measurement
_ALPHA = 0.2  # EWMA weight of the newest batch


@dataclass(frozen=True, slots=True)
class ServiceEstimate:
    """EWMA of a model's batch round-trip time and batch rows; ``batches == 0``: unmeasured."""

    batch_s: float = 0.0
    rows: float = 0.0
    batches: int = 0

    @property
    def measured(self) -> bool:
        return self.batches > 0 and self.batch_s > 0 and self.rows > 0

    @property
    def per_query_s(self) -> float:
        return self.batch_s / self.rows if self.measured else 0.0

    def observe(self, batch_s: float, rows: int, alpha: float = _ALPHA) -> ServiceEstimate:
        """The estimate after one more completed batch of ``rows`` queries."""
        if rows < 1 or batch_s < 0 or not math.isfinite(batch_s):
            return self
        if self.batches == 0:
            return ServiceEstimate(batch_s, float(rows), 1)
        return ServiceEstimate(self.batch_s + alpha * (batch_s - self.batch_s),
                               self.rows + alpha * (rows - self.rows), self.batches + 1)


def pooled(estimates: Iterable[ServiceEstimate]) -> ServiceEstimate:
    """A model's estimate from its replicas' own (the measured ones): per query, one over the
    replicas' mean rate; per batch, the median replica's time (the lower of two middles, so
    that of two replicas the straggler is not the one that speaks for the model). One
    replica's is its own."""
    measured = [e for e in estimates if e.measured]
    if not measured:
        return ServiceEstimate()
    rate = math.fsum(e.rows / e.batch_s for e in measured) / len(measured)  # queries/s each
    batch_s = sorted(e.batch_s for e in measured)[(len(measured) - 1) // 2]
    return ServiceEstimate(batch_s, batch_s * rate, sum(e.batches for e in measured))


@dataclass(frozen=True, slots=True)
class Admission:
    """Whether a query is admitted; if not, why and when to retry."""

    admitted: bool
    bound: int
    retry_after_s: float = 0.0
    reason: str = ""


def queue_bound(estimate: ServiceEstimate, slo_s: float, replicas: int,
                max_batch_size: int, *, complete: bool = True) -> int:
    """How many queries may wait for this model (see the module docstring). ``complete``:
    every serving replica has a measurement."""
    c = max(1, replicas)
    unmeasured = UNMEASURED_BATCHES * max_batch_size * c
    if not estimate.measured:
        return unmeasured
    servable = (slo_s - estimate.batch_s) * c / estimate.per_query_s
    bound = max(c, math.floor(servable)) if math.isfinite(servable) else c
    return bound if complete else max(bound, unmeasured)


def _drain_s(estimate: ServiceEstimate, depth: int, replicas: int) -> float:
    return depth * estimate.per_query_s / max(1, replicas)


def retry_after(estimate: ServiceEstimate, depth: int, replicas: int) -> float:
    """Whole seconds until the queue has drained, at least 1 (the Retry-After header)."""
    return float(max(1, math.ceil(_drain_s(estimate, depth, replicas))))


def admit(estimate: ServiceEstimate, *, depth: int, count: int, now: float, deadline: float,
          slo_s: float, replicas: int, max_batch_size: int, complete: bool = True
          ) -> Admission:
    """May ``count`` more queries with ``deadline`` join a queue of ``depth``? ``complete``:
    every serving replica has a measurement (else no wait is predicted)."""
    bound = queue_bound(estimate, slo_s, replicas, max_batch_size, complete=complete)
    if depth + count > bound:
        return Admission(False, bound, retry_after(estimate, depth, replicas),
                         f"the queue holds {depth} of the {bound} it can serve in time")
    if complete and estimate.measured and (depth > 0 or count > 1):  # an empty queue: a probe
        # The last of the ``count`` waits behind everything queued, then rides one batch.
        finish = now + _drain_s(estimate, depth + count - 1, replicas) + estimate.batch_s
        if finish > deadline:
            return Admission(False, bound, retry_after(estimate, depth, replicas),
                             f"{depth} queued queries take {finish - now:.3f}s to serve, "
                             f"past the deadline in {deadline - now:.3f}s")
    return Admission(True, bound)


def can_finish(estimate: ServiceEstimate, now: float, deadline: float) -> bool:
    """Whether a query dispatched now can come back before its deadline (unmeasured: yes)."""
    return not estimate.measured or now + estimate.batch_s <= deadline
