"""SERF's latency model: the mean latency of a parallelism configuration at an arrival rate.

A configuration lets at most ``c`` requests run at once; the others wait in one FIFO queue.
Profiling gives ``mu[i-1]`` = μ_i, the *per-request* service rate when exactly ``i`` requests
run side by side (i = 1..c), so interference shows as μ_i falling with i. The model is the
one in SERF §IV-C as the digest (``../shared/papers/serf-hams-spec.md``, A2.3) writes it:

1. **M/M_interf/c** (Eq. 2-7). A birth-death chain on n, the requests in the system: arrivals
   at λ; departures at n·μ_n for n ≤ c and c·μ_c beyond. With ρ_i = λ/μ_i and
   ρ = λ/(c·μ_c): p_n = p0·Π_{i≤n} ρ_i / n! below c, p_n = p0·ρ^{n-c}·Π_{i≤c} ρ_i / c! from c
   on (Eq. 2), p0 = 1/H (Eq. 3, 4), and W_q = L_q/λ (Eq. 5-7).
2. **Cosmetatos' correction** (Eq. 8-11) turns that wait into M/D_interf/c's:
   W_q ≈ ½·(1 + f(c)·g(ρ))·W_q^{M/M_interf/c}, f(c) = (c-1)(√(4+5c) - 2)/(16c),
   g(ρ) = (1-ρ)/ρ.
3. **Service time by PASTA** (Eq. 12): an arrival that finds n < c requests runs with n+1 at
   once, one that finds n ≥ c runs with c, so S = Σ_{i=1..c} p_{i-1}/μ_i + (1/μ_c)·Σ_{n≥c} p_n.
   The paper's print drops the p0 in the closed form of the last sum; it is restored here
   (digest Part C, SERF item 1), so equal μ_i give S = 1/μ exactly.
4. **W = S + W_q** (Eq. 13), and ``math.inf`` when ρ ≥ 1.

Beside it, the ablations of SERF Fig. 9 (digest A4): M/M/c and M/D/c at the single-request
rate μ_1, and M/M_interf/c without the determinism correction.

How good it is: against a simulation of the same queue (deterministic service fixed by the
concurrency at the start, tests/unit/core/queue_des.py) Eq. 13 is within about 3 % of the mean
latency for interference profiles up to ρ = 0.8, where every ablation misses by 4-70 %. With
μ_1 ≥ ... ≥ μ_c (interference never speeds a request up) W grows with λ; a profile where
concurrency speeds requests up can make W fall with λ, and the model is less accurate there.

The configuration search (digest A2.4) predicts W for every (c, intra) of a profile and keeps
the argmin per load level. Everything here is pure arithmetic: no clock, no I/O. Rates and
times are in reciprocal units (requests per second gives seconds).
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

__all__ = ["Choice", "Config", "Prediction", "QueueModel", "TableRow", "best_config",
           "configurations", "md_c", "md_interf_c", "mm_c", "mm_interf_c", "predict_latency",
           "reference_table"]

QueueModel = Literal["md-interf", "mm-interf", "md", "mm"]
"""``md-interf``: SERF's Eq. 13. ``mm-interf``: the chain without Cosmetatos. ``md`` and
``mm``: the textbook M/D/c and M/M/c at μ_1, blind to interference."""

_MODELS: tuple[str, ...] = get_args(QueueModel)
# Relative gap under which two predicted latencies count as a tie: float noise, not a gain.
_TIE_RTOL = 1e-9


@dataclass(frozen=True, slots=True)
class Prediction:
    """The model's answer for one configuration at one arrival rate.

    ``latency`` = ``service`` + ``wait`` (Eq. 13). When ``stable`` is False (ρ ≥ 1) the queue
    grows without bound: ``latency`` and ``wait`` are ``math.inf``, ``p0`` and
    ``wait_probability`` their limits 0 and 1, and ``service`` its limit 1/μ_c.
    """

    latency: float
    wait: float
    service: float
    rho: float
    p0: float
    wait_probability: float  # Σ_{n≥c} p_n: an arrival finds every slot busy (PASTA)
    servers: int
    model: QueueModel
    stable: bool


# ---------------------------------------------------------------- input checks


def _check_rate(name: str, value: float, *, positive: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        need = "a finite number > 0" if positive else "a finite number >= 0"
        raise ValueError(f"{name} must be {need}, got {value!r}")


def _check_service_rates(service_rates: Sequence[float]) -> tuple[float, ...]:
    rates = tuple(service_rates)
    if not rates:
        raise ValueError("service_rates is empty: give μ_1..μ_c, one rate per concurrency")
    for i, rate in enumerate(rates, start=1):
        _check_rate(f"service_rates[{i - 1}] (μ_{i})", rate, positive=True)
    return rates


def _check_model(model: str) -> None:
    if model not in _MODELS:
        raise ValueError(f"unknown queueing model {model!r}; choose one of {list(_MODELS)}")


# ---------------------------------------------------------------- the chain (Eq. 2-4)


def _log_chain_terms(arrival_rate: float, rates: tuple[float, ...]) -> list[float]:
    """log(Π_{i≤n} ρ_i / n!) for n = 0..c: Eq. 2's unnormalised p_n below c and at c.

    Logs, because Π ρ_i / n! over- or underflows a float long before c = 64 at high load.
    """
    logs = [0.0]
    for n, rate in enumerate(rates, start=1):
        logs.append(logs[-1] + math.log(arrival_rate / rate) - math.log(n))
    return logs


def _chain_probabilities(arrival_rate: float, rates: tuple[float, ...],
                         rho: float) -> tuple[list[float], float]:
    """(p_0..p_{c-1}, Σ_{n≥c} p_n) of the M/M_interf/c chain, for 0 < ρ < 1 (Eq. 2-4).

    H (Eq. 3) sums the terms below c and the geometric tail Π_{i≤c} ρ_i / (c!·(1-ρ)). Each
    term is scaled by the largest before exponentiating, so H never overflows and p0 = 1/H
    (Eq. 4) keeps its precision even when it is tiny.
    """
    logs = _log_chain_terms(arrival_rate, rates)
    c = len(rates)
    logs[c] -= math.log1p(-rho)  # the tail: Σ_{k≥c} ρ^{k-c} = 1/(1-ρ)
    top = max(logs)
    scaled = [math.exp(term - top) for term in logs]
    h = math.fsum(scaled)
    return [term / h for term in scaled[:c]], scaled[c] / h


# ---------------------------------------------------------------- the three terms


def _mm_wait(wait_probability: float, last_rate: float, c: int, rho: float) -> float:
    """W_q of M/M_interf/c (Eq. 7), L_q/λ with L_q = p0·Π_{i≤c} ρ_i/c! · ρ/(1-ρ)² (Eq. 6).

    Written with Σ_{n≥c} p_n = p0·Π_{i≤c} ρ_i / (c!·(1-ρ)) and λ = ρ·c·μ_c, Eq. 7 is
    Σ_{n≥c} p_n / (c·μ_c·(1-ρ)): the Erlang-C form, which needs no division by λ.
    """
    return wait_probability / (c * last_rate * (1.0 - rho))


def _cosmetatos_factor(c: int, rho: float) -> float:
    """½·(1 + f(c)·g(ρ)) (Eq. 8-11); the paper's f(s) has s = c servers (digest Part C, 2)."""
    f = (c - 1) * (math.sqrt(4 + 5 * c) - 2) / (16 * c)  # Eq. 9; 0 for c = 1: M/D/1 exactly
    g = (1.0 - rho) / rho  # Eq. 10
    return 0.5 * (1.0 + f * g)


def _pasta_service(below_c: list[float], wait_probability: float,
                   rates: tuple[float, ...]) -> float:
    """S (Eq. 12, with the p0 the print drops): an arrival finding i-1 < c requests runs with
    i at once, at μ_i; one finding c or more runs with c, at μ_c."""
    starts_at_once = math.fsum(p / rate for p, rate in zip(below_c, rates, strict=True))
    return starts_at_once + wait_probability / rates[-1]


# ---------------------------------------------------------------- predictions


def _model_rates(rates: tuple[float, ...], model: QueueModel) -> tuple[float, ...]:
    """The chain's μ_1..μ_c: as profiled, or every μ_i = μ_1 for the interference-blind
    textbook baselines."""
    return (rates[0],) * len(rates) if model in ("md", "mm") else rates


def _idle_prediction(rates: tuple[float, ...], model: QueueModel) -> Prediction:
    """λ = 0 (or too small to tell from 0): nobody waits, and a request runs alone."""
    return Prediction(latency=1.0 / rates[0], wait=0.0, service=1.0 / rates[0], rho=0.0,
                      p0=1.0, wait_probability=0.0, servers=len(rates), model=model,
                      stable=True)


def _unstable_prediction(rates: tuple[float, ...], rho: float,
                         model: QueueModel) -> Prediction:
    return Prediction(latency=math.inf, wait=math.inf, service=1.0 / rates[-1], rho=rho,
                      p0=0.0, wait_probability=1.0, servers=len(rates), model=model,
                      stable=False)


def _solve(arrival_rate: float, rates: tuple[float, ...], model: QueueModel) -> Prediction:
    """Eq. 2-13 for already-checked inputs; ``rates`` are the chain's μ_1..μ_c."""
    c = len(rates)
    rho = arrival_rate / (c * rates[-1])
    if rho >= 1.0:
        return _unstable_prediction(rates, rho, model)
    if rho < sys.float_info.min:  # g(ρ) = (1-ρ)/ρ would overflow; the limit is idle
        return _idle_prediction(rates, model)
    below_c, wait_probability = _chain_probabilities(arrival_rate, rates, rho)
    wait = _mm_wait(wait_probability, rates[-1], c, rho)
    if model in ("md-interf", "md"):
        wait *= _cosmetatos_factor(c, rho)
    service = _pasta_service(below_c, wait_probability, rates)
    return Prediction(latency=service + wait, wait=wait, service=service, rho=rho,
                      p0=below_c[0], wait_probability=wait_probability, servers=c,
                      model=model, stable=True)


def predict_latency(arrival_rate: float, service_rates: Sequence[float],
                    model: QueueModel = "md-interf") -> Prediction:
    """Mean latency of a configuration with c = ``len(service_rates)`` at Poisson rate λ.

    ``service_rates[i-1]`` is μ_i, the per-request rate with i requests running at once.
    ``md-interf`` (default) is SERF's Eq. 13; ``mm-interf`` drops the Cosmetatos correction;
    ``md`` and ``mm`` are the textbook M/D/c and M/M/c at μ_1 (they ignore μ_2..μ_c).
    Raises ValueError for a negative or non-finite λ, an empty rate list, a rate ≤ 0 or an
    unknown model.
    """
    _check_rate("arrival_rate", arrival_rate, positive=False)
    rates = _check_service_rates(service_rates)
    _check_model(model)
    return _solve(arrival_rate, _model_rates(rates, model), model)


def md_interf_c(arrival_rate: float, service_rates: Sequence[float]) -> Prediction:
    """SERF's M/D_interf/c (Eq. 13)."""
    return predict_latency(arrival_rate, service_rates, "md-interf")


def mm_interf_c(arrival_rate: float, service_rates: Sequence[float]) -> Prediction:
    """Ablation: M/M_interf/c, the chain's wait (Eq. 7) plus Eq. 12, with no correction."""
    return predict_latency(arrival_rate, service_rates, "mm-interf")


def _single_rate(service_rate: float, servers: int) -> list[float]:
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
        raise ValueError(f"servers must be an integer >= 1, got {servers!r}")
    return [service_rate] * servers


def md_c(arrival_rate: float, service_rate: float, servers: int) -> Prediction:
    """Ablation: M/D/c by Cosmetatos' approximation (Eq. 8-10), no interference."""
    return predict_latency(arrival_rate, _single_rate(service_rate, servers), "md")


def mm_c(arrival_rate: float, service_rate: float, servers: int) -> Prediction:
    """Ablation: M/M/c (Erlang C), no interference."""
    return predict_latency(arrival_rate, _single_rate(service_rate, servers), "mm")


# ---------------------------------------------------------------- configuration search


@dataclass(frozen=True, slots=True, order=True)
class Config:
    """A parallelism configuration: at most ``c`` requests at once, ``intra`` threads each."""

    c: int
    intra: int

    @property
    def cores(self) -> int:
        """Cores busy when every slot runs: the resource the tie-break saves."""
        return self.c * self.intra


@dataclass(frozen=True, slots=True)
class Choice:
    config: Config
    prediction: Prediction


@dataclass(frozen=True, slots=True)
class TableRow:
    """One load level of the reference table: the chosen configuration and every candidate
    (in ``configurations`` order), so a benchmark can compare each one with a measurement."""

    arrival_rate: float
    best: Choice
    candidates: tuple[Choice, ...]


def _check_profiles(profiles: Mapping[int, Sequence[float]]) -> dict[int, tuple[float, ...]]:
    if not profiles:
        raise ValueError("profiles is empty: give {intra: [μ_1, ..., μ_n]}")
    checked: dict[int, tuple[float, ...]] = {}
    for intra, rates in profiles.items():
        if isinstance(intra, bool) or not isinstance(intra, int) or intra < 1:
            raise ValueError(f"profile key (intra threads) must be an integer >= 1, got "
                             f"{intra!r}")
        try:
            checked[intra] = _check_service_rates(rates)
        except ValueError as exc:
            raise ValueError(f"profile for intra={intra}: {exc}") from exc
    return checked


def _fits(config: Config, cores: int, oversubscribe: bool) -> bool:
    # Faithful mode keeps c·intra ≤ F (SERF, after Eq. 13; digest Part C, SERF item 7).
    return oversubscribe or config.cores <= cores


def configurations(profiles: Mapping[int, Sequence[float]], *, cores: int,
                   oversubscribe: bool = False) -> tuple[Config, ...]:
    """Every (c, intra) the profiles can predict: c = 1..len(μ) for each intra's μ list
    (a configuration with c slots needs μ_1..μ_c, digest A2.4), sorted, restricted to
    c·intra ≤ ``cores`` unless ``oversubscribe`` (a labelled extension, digest A4)."""
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ValueError(f"cores must be an integer >= 1, got {cores!r}")
    checked = _check_profiles(profiles)
    found = sorted(Config(c, intra) for intra, rates in checked.items()
                   for c in range(1, len(rates) + 1))
    allowed = tuple(config for config in found if _fits(config, cores, oversubscribe))
    if not allowed:
        raise ValueError(f"no profiled configuration fits c*intra <= {cores} cores; pass "
                         "oversubscribe=True to allow oversubscribed ones")
    return allowed


def _pick(candidates: tuple[Choice, ...]) -> Choice:
    """The argmin of predicted latency; a tie (within float noise) goes to the fewest cores.

    [decision] When no configuration is stable, each one's latency is infinite; the one that
    drains fastest (largest c·μ_c, then fewest cores) is the least bad, and its prediction
    says ``stable=False``. At one λ the largest c·μ_c is the smallest ρ = λ/(c·μ_c).
    """
    lowest = min(choice.prediction.latency for choice in candidates)
    if math.isinf(lowest):
        return min(candidates, key=lambda ch: (ch.prediction.rho, ch.config.cores, ch.config))
    tied = [ch for ch in candidates if ch.prediction.latency <= lowest * (1.0 + _TIE_RTOL)]
    return min(tied, key=lambda ch: (ch.config.cores, ch.prediction.latency, ch.config))


def _row(arrival_rate: float, profiles: dict[int, tuple[float, ...]],
         configs: tuple[Config, ...], model: QueueModel) -> TableRow:
    candidates = tuple(
        Choice(config, _solve(arrival_rate, _model_rates(profiles[config.intra][:config.c],
                                                         model), model))
        for config in configs)
    return TableRow(arrival_rate, _pick(candidates), candidates)


def reference_table(levels: Sequence[float], profiles: Mapping[int, Sequence[float]], *,
                    cores: int, oversubscribe: bool = False,
                    model: QueueModel = "md-interf") -> tuple[TableRow, ...]:
    """SERF's configuration reference table (digest A2.4): for each load level λ_k, every
    configuration's predicted latency and the best one.

    ``profiles`` maps intra threads to [μ_1, ..., μ_n] measured with that many threads.
    """
    for k, level in enumerate(levels):
        _check_rate(f"levels[{k}]", level, positive=False)
    _check_model(model)
    configs = configurations(profiles, cores=cores, oversubscribe=oversubscribe)
    checked = _check_profiles(profiles)
    return tuple(_row(level, checked, configs, model) for level in levels)


def best_config(arrival_rate: float, profiles: Mapping[int, Sequence[float]], *,
                cores: int, oversubscribe: bool = False,
                model: QueueModel = "md-interf") -> Choice:
    """The configuration with the lowest predicted mean latency at ``arrival_rate``; a tie
    goes to the fewest cores busy (c·intra). See ``reference_table`` for ``profiles``."""
    (row,) = reference_table([arrival_rate], profiles, cores=cores,
                             oversubscribe=oversubscribe, model=model)
    return row.best
