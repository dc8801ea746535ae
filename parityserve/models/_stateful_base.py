"""The stateful operator API's pieces (see ``parityserve.models.stateful``, which re-exports
them): the operator protocol, the compute/update gate, the state copy, and the write check."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Protocol

import torch
from torch import Tensor

__all__ = ["State", "StateBuffer", "StateCopyTimeout", "StatefulOperator", "run_batch",
           "writes_during_compute"]

State = dict[str, Tensor]


class StatefulOperator(Protocol):
    def initialize(self) -> State: ...

    def compute(self, batch: Any, state: State) -> tuple[Any, Any]: ...

    def update(self, state: State, pending: Any) -> None: ...


class StateCopyTimeout(RuntimeError):
    """The state manager never said the copy was done: the update must not run."""


def run_batch(op: StatefulOperator, batch: Any, state: State, may_update: threading.Event,
              timeout_s: float | None = None) -> Any:
    """Compute, wait until the previous state is copied, update; return the outputs (they
    may leave before the update: they do not depend on it)."""
    outputs, pending = op.compute(batch, state)
    if not may_update.wait(timeout_s):
        raise StateCopyTimeout(f"no copy-done signal within {timeout_s} s; state unchanged")
    op.update(state, pending)
    return outputs


class StateBuffer:
    """Pre-allocated CPU copies of a state. ``capture`` uses ``dst.copy_(src)``, which
    releases the GIL, so a state-manager thread overlaps the next compute (H11)."""

    def __init__(self, state: Mapping[str, Tensor]) -> None:
        self.tensors = {k: torch.empty_like(v, device="cpu") for k, v in state.items()}

    def capture(self, state: Mapping[str, Tensor]) -> None:
        for name, tensor in state.items():
            self.tensors[name].copy_(tensor)

    def install(self, state: Mapping[str, Tensor]) -> None:
        """The backup's apply: overwrite the live state with these bytes, in place."""
        with torch.no_grad():
            for name, tensor in state.items():
                tensor.copy_(self.tensors[name])


def writes_during_compute(op: StatefulOperator, batch: Any, state: State) -> list[str]:
    """The state tensors ``compute`` changed (it must change none): a BatchNorm left in train
    mode shows up here."""
    before = {k: v.detach().clone() for k, v in state.items()}
    op.compute(batch, state)
    return sorted(k for k, v in state.items() if not torch.equal(before[k], v))
