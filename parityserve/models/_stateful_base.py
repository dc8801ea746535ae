"""The stateful operator API's pieces (see ``parityserve.models.stateful``, which re-exports
them): the three-method operator protocol, the batch it takes, the state copy, and the write
check. The run form and the driver of both forms are in ``_stateful_run``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

__all__ = ["OperatorBatch", "State", "StateBuffer", "StateCopyTimeout", "StatefulOperator",
           "changed_since", "snapshot", "state_nbytes", "writes_during_compute"]

State = dict[str, Tensor]


class StatefulOperator(Protocol):
    def initialize(self) -> State: ...

    def compute(self, batch: Any, state: State) -> tuple[Any, Any]: ...

    def update(self, state: State, pending: Any) -> None: ...


@dataclass(frozen=True)
class OperatorBatch:
    """One batch for a stateful operator, one entry per row: ``inputs`` (float32 [n, ...]),
    ``streams`` (the row's stream or session key, ``""`` when it has none) and ``labels``
    (int64 [n], -1 meaning no label). ``at`` is when the frontend formed the batch, in
    seconds on its clock: the operator's notion of now (a stream table's idle time), the
    same when a logged batch is replayed. Invalid fields raise ``ValueError``."""

    inputs: Tensor
    streams: tuple[str, ...]
    labels: Tensor
    at: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.at, bool) or not isinstance(self.at, int | float) \
                or not math.isfinite(self.at):
            raise ValueError(f"at must be a finite number of seconds; got {self.at!r}")
        if not isinstance(self.inputs, Tensor) or self.inputs.dtype != torch.float32 \
                or self.inputs.dim() < 1:
            raise ValueError(f"inputs must be a float32 tensor of shape [n, ...]; got "
                             f"{_describe(self.inputs)}")
        _check_streams(self.streams, len(self.inputs))
        object.__setattr__(self, "streams", tuple(str(s) for s in self.streams))
        if not isinstance(self.labels, Tensor) or self.labels.dtype != torch.int64:
            raise ValueError(f"labels must be an int64 tensor; got {_describe(self.labels)}")
        _check_labels(self.labels.shape, len(self.inputs),
                      int(self.labels.min()) if self.labels.numel() else -1)

    def __len__(self) -> int:
        return len(self.streams)

    def rows(self, rows: Sequence[int]) -> OperatorBatch:
        """The batch of these rows only, in this order (a part of a batch the server
        retries without the rows an operator refused)."""
        at = torch.tensor(list(rows), dtype=torch.int64)
        return OperatorBatch(self.inputs[at], tuple(self.streams[r] for r in rows),
                             self.labels[at], self.at)

    @classmethod
    def from_numpy(cls, inputs: np.ndarray, streams: Sequence[str],
                   labels: Sequence[int] | np.ndarray | None = None,
                   at: float = 0.0) -> OperatorBatch:
        """The batch from numpy frames: ``inputs`` of any real numeric dtype (cast to float32),
        one ``str`` per row in ``streams``, and integer ``labels`` (``None``: all -1)."""
        x = np.asarray(inputs)
        if x.dtype.kind not in "fiu" or x.ndim < 1:
            raise ValueError(f"inputs must be a real numeric array of shape [n, ...]; got "
                             f"dtype {x.dtype} with shape {x.shape}")
        n = x.shape[0]
        _check_streams(streams, n)
        y = np.full(n, -1, np.int64) if labels is None else _labels_array(labels, n)
        # Writeable, C-ordered float32: torch shares the buffer and never warns about it.
        x = np.require(x, np.float32, ["C", "W"])
        return cls(torch.from_numpy(x), tuple(streams), torch.from_numpy(y), at)


def _check_streams(streams: Sequence[str], n: int) -> None:
    if isinstance(streams, str | bytes) or not isinstance(streams, Sequence | np.ndarray):
        raise ValueError(f"streams must be a sequence of str, one per row; got "
                         f"{type(streams).__name__}")
    if len(streams) != n:
        raise ValueError(f"streams must hold one key per row: got {len(streams)} for {n} rows")
    for i, key in enumerate(streams):
        if not isinstance(key, str):
            raise ValueError(f"streams[{i}] must be a str (\"\" for no stream); got "
                             f"{type(key).__name__}")


def _labels_array(labels: Sequence[int] | np.ndarray, n: int) -> np.ndarray:
    y = np.asarray(labels)
    if y.size == 0 and y.ndim == 1:
        y = y.astype(np.int64)  # [] comes out of asarray as float64
    if y.dtype.kind not in "iu" or not np.can_cast(y.dtype, np.int64):
        raise ValueError(f"labels must be integers (class indices, -1 for none); got dtype "
                         f"{y.dtype}")
    _check_labels(y.shape, n, int(y.min()) if y.size else -1)
    return np.require(y, np.int64, ["C", "W"])


def _check_labels(shape: Sequence[int], n: int, smallest: int) -> None:
    if tuple(shape) != (n,):
        raise ValueError(f"labels must have shape [{n}], one per row; got {list(shape)}")
    if smallest < -1:
        raise ValueError(f"labels must be class indices >= 0, or -1 for no label; got "
                         f"{smallest}")


def _describe(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"{value.dtype} tensor of shape {list(value.shape)}"
    return type(value).__name__


def state_nbytes(state: Mapping[str, Tensor]) -> int:
    """Total bytes of the state tensors: what one state copy moves to the backup."""
    return sum(t.numel() * t.element_size() for t in state.values())


class StateCopyTimeout(RuntimeError):
    """The state manager never said the copy was done: the update must not run."""


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
    before = snapshot(state)
    op.compute(batch, state)
    return changed_since(before, state)


def snapshot(state: Mapping[str, Tensor]) -> State:
    """A detached copy of every state tensor, for ``changed_since``."""
    return {k: v.detach().clone() for k, v in state.items()}


def changed_since(before: Mapping[str, Tensor], state: Mapping[str, Tensor]) -> list[str]:
    """The names of the state tensors that differ from ``before``, sorted."""
    return sorted(k for k, v in state.items() if not torch.equal(before[k], v))
