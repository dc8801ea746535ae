"""The supervisor's memory of failing replica slots: failures in a row, slots given up on,
and relaunches waiting out their back-off. The delays themselves are ``core/restarts.py``.

A slot is (model, version, slot name): a new version starts with a clean record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parityserve.core.restarts import RestartPolicy, restart_delay
from parityserve.runtime.modelpath.dispatch import ModelPath

__all__ = ["Restart", "RestartTracker", "Slot"]

Slot = tuple[str, int, str]


@dataclass(frozen=True)
class Restart:
    """A relaunch of slot ``index`` of ``pool`` due at ``at``."""

    at: float
    path: ModelPath
    index: int
    faults: dict[str, Any]
    pool: str


class RestartTracker:
    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self.failures: dict[Slot, int] = {}  # failures in a row, while never ready
        self.gave_up: set[Slot] = set()  # not relaunched until an operator asks again
        self._waiting: list[Restart] = []

    def failed(self, slot: Slot) -> tuple[int, float | None]:
        """Count one more failure of ``slot``: (failures in a row, seconds until its relaunch,
        or None when it is given up on)."""
        failures = self.failures[slot] = self.failures.get(slot, 0) + 1
        delay = restart_delay(failures, self.policy)
        if delay is None:
            self.gave_up.add(slot)
        return failures, delay

    def ready(self, slot: Slot) -> None:
        """The slot's replica said hello: its record is clean again."""
        self.failures.pop(slot, None)

    def wait(self, restart: Restart) -> None:
        self._waiting.append(restart)

    def due(self, now: float) -> list[Restart]:
        """The relaunches whose back-off is over, in the order they were asked for."""
        due = [r for r in self._waiting if r.at <= now]
        self._waiting = [r for r in self._waiting if r.at > now]
        return due

    def forgive(self, model: str, version: int) -> None:
        """An operator asked again: slots given up on get their full number of tries."""
        for slot in [s for s in self.failures if s[:2] == (model, version)]:
            del self.failures[slot]
        self.gave_up = {s for s in self.gave_up if s[:2] != (model, version)}

    def gave_up_on(self, model: str, version: int) -> bool:
        return any(s[:2] == (model, version) for s in self.gave_up)
