"""When the supervisor relaunches a replica slot that keeps failing, and when it gives up.

A slot's failures are counted in a row while it never becomes ready; a ready replica resets
the count. The first failure relaunches at once (a crash is usually a one-off), later ones
back off exponentially, and after ``give_up_after`` of them the model is marked failed: a
model that cannot load must not spin, nor run a load-time payload again and again.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RestartPolicy", "restart_delay"]


@dataclass(frozen=True)
class RestartPolicy:
    first_delay_s: float = 0.25
    max_delay_s: float = 4.0
    give_up_after: int = 5


def restart_delay(failures: int, policy: RestartPolicy = RestartPolicy()) -> float | None:
    """Seconds to wait before relaunching after ``failures`` failures in a row (>= 1), or
    None: stop relaunching until an operator asks again."""
    if failures >= policy.give_up_after:
        return None
    if failures <= 1:
        return 0.0
    return min(policy.max_delay_s, policy.first_delay_s * 2.0 ** (failures - 2))
