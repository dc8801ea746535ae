"""Auditing a stateful operator's history (re-exported by ``parityserve.models.stateful``).

HAMS's third consistency property is that the final state equals a replay of the durable
history. Injected noise must stay non-reproducible by a re-execution (that is what makes
checkpoint-replay diverge), so an auditable operator draws a fresh seed for each batch from
OS entropy (``entropy_seed``) and, with ``audit`` on, reports it in every output row
beside the row's place in its batch (``audit_columns``). A client's replies then name the
batches that became durable and their seeds, and ``replay_state`` runs them again offline
through ``compute_seeded``; ``state_digest`` compares the result with the server's state.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from parityserve.models._stateful_base import OperatorBatch, State

__all__ = ["AUDIT_COLUMNS", "SeededOperator", "audit_columns", "entropy_seed",
           "replay_state", "state_digest"]

AUDIT_COLUMNS = ("row", "batch_size", "noise_seed")  # appended, in this order, to each row
_SEED_BITS = 53  # exact in a float64 too, so a seed survives any JSON client unchanged


@runtime_checkable
class SeededOperator(Protocol):
    """A stateful operator whose only randomness is one seed per batch."""

    def initialize(self) -> State: ...

    def compute_seeded(self, batch: Any, state: State, seed: int) -> tuple[Any, Any]: ...

    def update(self, state: State, pending: Any) -> None: ...


def entropy_seed() -> int:
    """A noise seed from OS entropy: a re-execution of the batch draws another one."""
    return int.from_bytes(os.urandom(8), "big") >> (64 - _SEED_BITS)


def audit_columns(n: int, seed: int) -> Tensor:
    """int64 [n, 3]: each row's place in its batch, the batch's size, and its noise seed. With
    the row's sequence number (which the reply carries) they name the batch: it started at
    ``seq - row``."""
    rows = torch.arange(n, dtype=torch.int64)
    return torch.stack([rows, torch.full_like(rows, n), torch.full_like(rows, seed)], 1)


def state_digest(state: Mapping[str, Tensor]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order: two states
    have the same digest exactly when they are bitwise equal."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}\n".encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


def replay_state(op: SeededOperator, batches: Iterable[tuple[OperatorBatch, int]]) -> State:
    """The state after these batches, each with its recorded seed, run in order from
    ``op.initialize()`` on one thread, as the operator processes run them."""
    state = op.initialize()
    with _one_thread():
        for batch, seed in batches:
            _, pending = op.compute_seeded(batch, state, seed)
            op.update(state, pending)
    return state


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Operator processes run torch on one thread. A kernel split over more threads adds its
    partial sums in another order: measured, the same batches and seeds on 2 threads end in
    another state."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
