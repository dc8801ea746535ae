"""``StreamMean``: each stream's running mean of its rows, the shipped example of the run form
(``run(batch, state, event)``, see ``_stateful_run``), re-exported by
``parityserve.models.stateful``.

The state is a slot table of ``max_streams`` rows (``_stream_slots``):

- ``sum``: float64 [max_streams, features], the sum of the rows each slot's stream brought
  (float64: a long stream's sum must not lose the small late rows);
- ``count``: int64 [max_streams], how many rows that is;
- ``keys``: int64 [max_streams], the stream in each slot (``stream_key(name)``), 0 if free;
- ``used``: float64 [max_streams], when each slot's stream last brought a row.

The sum, not the mean, is kept: the mean after the next row is then one addition and one
division, with no rounding carried from a stored mean.
"""

from __future__ import annotations

import torch
from torch import Tensor

from parityserve.models._stateful_base import OperatorBatch, State
from parityserve.models._stateful_run import CopyDone
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

__all__ = ["StreamMean"]


class StreamMean:
    """Outputs, per row, the mean of every row its stream has brought so far, this one
    included: float32 [n, features]. Rows of one stream in a batch count in row order; a row
    with stream ``""`` belongs to no stream, outputs itself and is not kept. A new stream
    takes a free slot, else an idle stream's (unused for ``stream_idle_s``); a batch
    bringing a new stream to a full table raises ``StreamTableFull`` before anything is
    written.
    ``noise`` > 0 adds unseeded Gaussian noise to each new sum (outputs and the sum kept): the
    injected non-determinism that makes a replay diverge."""

    def __init__(self, features: int = 4, max_streams: int = 1024, noise: float = 0.0,
                 stream_idle_s: float = DEFAULT_IDLE_S) -> None:
        check_sizes(features=features, max_streams=max_streams)
        self.features, self.max_streams, self.noise = features, max_streams, check_noise(noise)
        self.stream_idle_s = check_idle(stream_idle_s)
        self._rng = torch.Generator()
        self._rng.seed()  # from OS entropy: deliberately not reproducible

    def initialize(self) -> State:
        slots = self.max_streams
        return {"sum": torch.zeros(slots, self.features, dtype=torch.float64),
                "count": torch.zeros(slots, dtype=torch.int64), **slot_table(slots)}

    def run(self, batch: OperatorBatch, state: State, event: CopyDone) -> Tensor:
        """Reads the state, waits on ``event`` (the previous state's copy), then writes."""
        x = flat_inputs(batch, self.features, "StreamMean.run", "features").double()
        plan = plan_slots(batch, state, self.max_streams, self.stream_idle_s)
        sums, seen, writes = self._running_sums(x, plan, state)
        event.wait()  # from here on the state may change: the copy has what it needs
        if writes is not None:
            writes.store(state)
        return (sums / seen[:, None]).float()

    def _running_sums(self, x: Tensor, plan: SlotPlan,
                      state: State) -> tuple[Tensor, Tensor, SlotWrites | None]:
        """Each row's running sum and count (its stream's, up to this row), and the writes:
        each stream's last sum and count. Reads the state only."""
        sums = torch.empty_like(x)
        seen = torch.empty(len(x), dtype=torch.float64)
        lanes = plan.rows_of_lanes()
        last_sum = torch.empty(len(lanes), self.features, dtype=torch.float64)
        last_count = torch.empty(len(lanes), dtype=torch.int64)
        for lane, rows in enumerate(lanes):
            slot, known = plan.slots[lane], plan.known[lane]
            start = state["sum"][slot] if known else torch.zeros(self.features,
                                                                  dtype=torch.float64)
            before = int(state["count"][slot]) if known else 0
            lane_sums = start + x[rows].cumsum(0)
            if self.noise:
                lane_sums += self.noise * torch.randn(lane_sums.shape, generator=self._rng,
                                                      dtype=torch.float64)
            sums[rows] = lane_sums
            seen[rows] = torch.arange(before + 1, before + len(rows) + 1, dtype=torch.float64)
            last_sum[lane], last_count[lane] = lane_sums[-1], before + len(rows)
        return sums, seen, SlotWrites.of(plan, sum=last_sum, count=last_count)
