"""``StreamLSTM``: an LSTM keeping each stream's (h, c) between batches (HAMS's per-stream
hidden state, decision H12), re-exported by ``parityserve.models.stateful``.

The state is a fixed set of pre-allocated tensors, so ``StateBuffer`` copies it by name and a
backup installs it in place: a slot table of ``max_streams`` rows.

- ``h``, ``c``: float32 [max_streams, hidden], the stream in each slot's (h, c);
- ``keys``: int64 [max_streams], the stream in each slot (``stream_key(name)``), 0 if free.

A slot, once taken, stays taken; a batch bringing a stream the full table has no room for
raises ``StreamTableFull`` from ``compute``, so nothing is written. Rows with stream ``""``
belong to no stream: each starts from zeros and is not kept. The LSTM cell and the output
layer are fixed weights drawn from ``seed``, not state: a backup built with the same seed
holds them already.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from parityserve.models._stateful_audit import audit_columns, entropy_seed
from parityserve.models._stateful_base import OperatorBatch, State

__all__ = ["StreamLSTM", "StreamTableFull", "stream_key"]

_KEY_BITS = 63


class StreamTableFull(RuntimeError):
    """A batch brings a new stream and every slot of the stream table is taken."""


def stream_key(name: str) -> int:
    """A stream's key in the slot table: a non-zero 63-bit blake2b hash of its name, the same
    in every process (unlike the salted ``hash()``)."""
    digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> (64 - _KEY_BITS) or 1


@dataclass(frozen=True)
class _Plan:
    """Where a batch's rows go. A "lane" is one stream of the batch, or one streamless row."""

    lane_of_row: list[int]
    slots: list[int]  # per lane: its slot, -1 for a streamless row
    keys: list[int]  # per lane: its stream's key, 0 for a streamless row
    known: list[bool]  # per lane: its slot already holds its (h, c)


@dataclass(frozen=True)
class _Writes:
    """What ``update`` writes: each lane kept in the table, its slot, key and final (h, c)."""

    slots: Tensor
    keys: Tensor
    h: Tensor
    c: Tensor


class StreamLSTM:
    """An LSTM cell stepping once per row, from and to the (h, c) of the row's stream; rows of
    one stream in a batch chain in row order. Outputs ``h_new @ W_out``, float32 [n, outputs].
    ``noise`` > 0 adds Gaussian noise to each new (h, c), drawn from a seed taken from OS
    entropy per batch: the injected non-determinism that makes a re-execution diverge
    (HAMS's S2, which CPU PyTorch lacks). ``audit`` appends ``AUDIT_COLUMNS`` to each row,
    making the outputs float64 [n, outputs + 3] (exact: the seed has 53 bits), so only an
    operator whose successors pass them through (not another LSTM) can audit."""

    def __init__(self, input_size: int = 8, hidden: int = 32, outputs: int = 1,
                 max_streams: int = 1024, noise: float = 0.0, seed: int = 0,
                 audit: bool = False) -> None:
        _check_sizes(input_size=input_size, hidden=hidden, outputs=outputs,
                     max_streams=max_streams)
        if isinstance(noise, bool) or not isinstance(noise, int | float) \
                or not math.isfinite(noise) or noise < 0:
            raise ValueError(f"noise must be a finite number >= 0, got {noise!r}")
        if not isinstance(audit, bool):
            raise ValueError(f"audit must be true or false, got {audit!r}")
        self.input_size, self.hidden, self.outputs = input_size, hidden, outputs
        self.max_streams, self.noise, self.audit = max_streams, float(noise), audit
        generator = torch.Generator().manual_seed(seed)
        with torch.random.fork_rng(devices=[]):  # the cell's own init draws the global RNG
            self.cell = nn.LSTMCell(input_size, hidden).requires_grad_(False)
        bound = hidden ** -0.5  # the range of nn.LSTMCell's own init
        for param in self.cell.parameters():
            param.uniform_(-bound, bound, generator=generator)
        self.w_out = torch.randn(hidden, outputs, generator=generator) * bound

    def initialize(self) -> State:
        slots, hidden = self.max_streams, self.hidden
        return {"h": torch.zeros(slots, hidden), "c": torch.zeros(slots, hidden),
                "keys": torch.zeros(slots, dtype=torch.int64)}

    def compute(self, batch: OperatorBatch, state: State) -> tuple[Tensor, _Writes | None]:
        """Reads the state only; raises ``StreamTableFull`` before anything is computed."""
        return self.compute_seeded(batch, state, entropy_seed() if self.noise else 0)

    def compute_seeded(self, batch: OperatorBatch, state: State, seed: int
                       ) -> tuple[Tensor, _Writes | None]:
        """``compute`` with the batch's noise seed given: what a replay runs."""
        x = self._inputs(batch)
        plan = _plan(batch.streams, state["keys"], self.max_streams)
        noise = torch.Generator().manual_seed(seed) if self.noise else None
        with torch.no_grad():
            h, c = _start(plan, state, self.hidden)
            h_rows = torch.empty(len(x), self.hidden)
            for rows in _waves(plan.lane_of_row):
                lanes = torch.tensor([plan.lane_of_row[r] for r in rows])
                at = torch.tensor(rows)
                h_new, c_new = self._step(x[at], h[lanes], c[lanes], noise)
                h[lanes], c[lanes], h_rows[at] = h_new, c_new, h_new
            outputs = h_rows @ self.w_out
        if self.audit:
            outputs = torch.cat([outputs.double(), audit_columns(len(x), seed).double()], 1)
        return outputs, _writes(plan, h, c)

    def update(self, state: State, pending: _Writes | None) -> None:
        if pending is None:
            return
        with torch.no_grad():
            state["h"].index_copy_(0, pending.slots, pending.h)
            state["c"].index_copy_(0, pending.slots, pending.c)
            state["keys"].index_copy_(0, pending.slots, pending.keys)

    def _inputs(self, batch: OperatorBatch) -> Tensor:
        if not isinstance(batch, OperatorBatch):
            raise TypeError(f"StreamLSTM.compute takes an OperatorBatch, got "
                            f"{type(batch).__name__}")
        x = batch.inputs
        flat = x.reshape(len(x), math.prod(x.shape[1:]))
        if flat.shape[1] != self.input_size:
            raise ValueError(f"StreamLSTM(input_size={self.input_size}) takes "
                             f"{self.input_size} features per row; got shape {list(x.shape)}")
        return flat

    def _step(self, x: Tensor, h: Tensor, c: Tensor, noise: torch.Generator | None
              ) -> tuple[Tensor, Tensor]:
        h_new, c_new = self.cell(x, (h, c))
        if noise is not None:
            h_new = h_new + self.noise * torch.randn(h_new.shape, generator=noise)
            c_new = c_new + self.noise * torch.randn(c_new.shape, generator=noise)
        return h_new, c_new


def _check_sizes(**sizes: int) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def _plan(streams: Sequence[str], keys: Tensor, max_streams: int) -> _Plan:
    """Each row's lane, and each lane's slot: the one its stream holds, else the lowest free
    one. The table is read from ``keys`` every batch: it is the state, so a backup that
    installed the primary's bytes plans exactly as the primary would."""
    table = keys.tolist()
    held = {key: slot for slot, key in enumerate(table) if key}
    free = (slot for slot, key in enumerate(table) if not key)
    plan = _Plan([], [], [], [])
    lane_of_key: dict[int, int] = {}
    for name in streams:
        key = stream_key(name) if name else 0
        if key and key in lane_of_key:
            plan.lane_of_row.append(lane_of_key[key])
            continue
        slot = held.get(key, -1) if key else -1
        if key and slot < 0:
            slot = next(free, -1)
            if slot < 0:
                raise StreamTableFull(
                    f"stream table full: all max_streams={max_streams} slots hold a stream "
                    f"and stream {name!r} is new; nothing was written (raise max_streams)")
        if key:
            lane_of_key[key] = len(plan.slots)
        plan.lane_of_row.append(len(plan.slots))
        plan.slots.append(slot)
        plan.keys.append(key)
        plan.known.append(key in held)
    return plan


def _start(plan: _Plan, state: State, hidden: int) -> tuple[Tensor, Tensor]:
    """Each lane's (h, c) before the batch, in new tensors: zeros unless its stream is held."""
    h, c = torch.zeros(len(plan.slots), hidden), torch.zeros(len(plan.slots), hidden)
    lanes = [lane for lane, known in enumerate(plan.known) if known]
    if lanes:
        slots = torch.tensor([plan.slots[lane] for lane in lanes])
        h[lanes], c[lanes] = state["h"][slots], state["c"][slots]
    return h, c


def _waves(lane_of_row: list[int]) -> list[list[int]]:
    """The rows in steps: wave k holds each lane's k-th row, so a wave has one row per lane at
    most (one batched cell call) and a lane's rows run in row order."""
    waves: list[list[int]] = []
    seen: dict[int, int] = {}
    for row, lane in enumerate(lane_of_row):
        k = seen.get(lane, 0)
        seen[lane] = k + 1
        if k == len(waves):
            waves.append([])
        waves[k].append(row)
    return waves


def _writes(plan: _Plan, h: Tensor, c: Tensor) -> _Writes | None:
    kept = [lane for lane, slot in enumerate(plan.slots) if slot >= 0]
    if not kept:
        return None
    return _Writes(torch.tensor([plan.slots[lane] for lane in kept]),
                   torch.tensor([plan.keys[lane] for lane in kept], dtype=torch.int64),
                   h[kept], c[kept])
