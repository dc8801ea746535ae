"""A small discrete-event simulation of the M/D_interf/c queue, the ground truth that
tests/unit/core/test_queueing.py holds SERF's model (core/queueing.py) against.

Poisson arrivals; one FIFO queue; at most c requests in service. A request's service time is
deterministic, 1/μ_k, where k is the number in service once it starts, itself included. This
is the interference the digest's Eq. 12 reasons with (serf-hams-spec.md, A2.3): "an arrival
that finds n < c requests in the system runs with n+1 at once; one that finds n ≥ c runs at
concurrency c". The concurrency is fixed when the request starts; later arrivals or
departures do not stretch or shorten it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SimulatedLatency:
    mean: float
    stderr: float  # of ``mean``, by batch means (the latencies of a queue are correlated)
    served: int


def fifo_latencies(arrivals: np.ndarray, service_times: Sequence[float]) -> np.ndarray:
    """Each request's arrival-to-departure time, in arrival order (FIFO starts in order)."""
    c = len(service_times)
    in_service: list[float] = []  # departure times of the requests being served
    latencies = np.empty(len(arrivals))
    last_start = 0.0
    for j, arrival in enumerate(arrivals.tolist()):
        start = max(arrival, last_start)  # FIFO: never before the request ahead of it
        while in_service and in_service[0] <= start:
            heapq.heappop(in_service)
        if len(in_service) == c:  # every slot busy: start when the first one frees
            start = heapq.heappop(in_service)
            while in_service and in_service[0] <= start:
                heapq.heappop(in_service)
        departure = start + service_times[len(in_service)]  # k = len + 1 running at once
        heapq.heappush(in_service, departure)
        last_start = start
        latencies[j] = departure - arrival
    return latencies


def simulate_mean_latency(arrival_rate: float, service_rates: Sequence[float], *,
                          arrivals: int, seed: int, warmup_fraction: float = 0.1,
                          batches: int = 20) -> SimulatedLatency:
    """Mean latency over ``arrivals`` Poisson arrivals, the first ``warmup_fraction`` dropped
    (the queue starts empty), with its standard error from ``batches`` batch means."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0 / arrival_rate, arrivals))
    latencies = fifo_latencies(times, [1.0 / rate for rate in service_rates])
    kept = latencies[int(arrivals * warmup_fraction):]
    usable = len(kept) - len(kept) % batches
    batch_means = kept[:usable].reshape(batches, -1).mean(axis=1)
    stderr = float(batch_means.std(ddof=1) / np.sqrt(batches))
    return SimulatedLatency(float(kept.mean()), stderr, len(kept))


def fifo_latencies_idle(arrivals: np.ndarray, busy_times: Sequence[float],
                        extra: Callable[[float], float]) -> np.ndarray:
    """The same queue with idle penalties (core/idle_queueing.py): a request takes the
    lowest-numbered free slot (the scheduler's pull order), and its service time is
    ``busy_times[k-1]`` (k running at once, itself included) plus ``extra(gap)``, where gap
    is how long that slot had been free when it started (0 straight after a departure; every
    slot starts free since long ago)."""
    c = len(busy_times)
    free_at = [-1e9] * c  # when each slot last freed
    latencies = np.empty(len(arrivals))
    last_start = 0.0
    for j, arrival in enumerate(arrivals.tolist()):
        start = max(arrival, last_start, min(free_at))
        slot = next(i for i in range(c) if free_at[i] <= start)
        running = sum(1 for t in free_at if t > start)
        departure = start + busy_times[running] + extra(start - free_at[slot])
        free_at[slot] = departure
        last_start = start
        latencies[j] = departure - arrival
    return latencies
