"""``StreamLSTM``: an LSTM keeping each stream's (h, c) between batches (HAMS's per-stream
hidden state, decision H12), re-exported by ``parityserve.models.stateful``.

The state is a slot table of ``max_streams`` rows (``_stream_slots``):

- ``h``, ``c``: float32 [max_streams, hidden], the stream in each slot's (h, c);
- ``keys``: int64 [max_streams], the stream in each slot (``stream_key(name)``), 0 if free;
- ``used``: float64 [max_streams], when each slot's stream last brought a row.

A new stream takes a free slot, else an idle stream's (unused for ``stream_idle_s``);
a batch bringing a stream the full table has no room for raises ``StreamTableFull`` from
``compute``, naming its rows, so nothing is written. Rows with stream ``""`` belong to no
stream: each starts from zeros and is not kept. The LSTM cell and the output layer are
fixed weights drawn from ``seed``, not state: a backup built with the same seed
holds them already.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from parityserve.models._stateful_audit import audit_columns, entropy_seed
from parityserve.models._stateful_base import OperatorBatch, State
from parityserve.models._stream_slots import (
    DEFAULT_IDLE_S,
    SlotPlan,
    SlotWrites,
    check_idle,
    check_noise,
    check_sizes,
    flat_inputs,
    plan_slots,
    slot_table,
)

__all__ = ["StreamLSTM"]


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
                 audit: bool = False, stream_idle_s: float = DEFAULT_IDLE_S) -> None:
        check_sizes(input_size=input_size, hidden=hidden, outputs=outputs,
                    max_streams=max_streams)
        if not isinstance(audit, bool):
            raise ValueError(f"audit must be true or false, got {audit!r}")
        self.input_size, self.hidden, self.outputs = input_size, hidden, outputs
        self.max_streams, self.noise, self.audit = max_streams, check_noise(noise), audit
        self.stream_idle_s = check_idle(stream_idle_s)
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
                **slot_table(slots)}

    def compute(self, batch: OperatorBatch, state: State) -> tuple[Tensor, SlotWrites | None]:
        """Reads the state only; raises ``StreamTableFull`` before anything is computed."""
        return self.compute_seeded(batch, state, entropy_seed() if self.noise else 0)

    def compute_seeded(self, batch: OperatorBatch, state: State, seed: int
                       ) -> tuple[Tensor, SlotWrites | None]:
        """``compute`` with the batch's noise seed given: what a replay runs."""
        x = flat_inputs(batch, self.input_size, "StreamLSTM.compute", "input_size")
        plan = plan_slots(batch, state, self.max_streams, self.stream_idle_s)
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
        return outputs, SlotWrites.of(plan, h=h, c=c)

    def update(self, state: State, pending: SlotWrites | None) -> None:
        if pending is not None:
            pending.store(state)

    def _step(self, x: Tensor, h: Tensor, c: Tensor, noise: torch.Generator | None
              ) -> tuple[Tensor, Tensor]:
        h_new, c_new = self.cell(x, (h, c))
        if noise is not None:
            h_new = h_new + self.noise * torch.randn(h_new.shape, generator=noise)
            c_new = c_new + self.noise * torch.randn(c_new.shape, generator=noise)
        return h_new, c_new


def _start(plan: SlotPlan, state: State, hidden: int) -> tuple[Tensor, Tensor]:
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

