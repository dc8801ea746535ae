"""The checkpoint-replay baseline's request log (Lineage Stash's way), kept by the frontend.

Every batch sent to a stateful operator is logged with its inputs; a checkpoint of the
operator's state after request ``seq`` drops the log up to it. After a failure a fresh
process restores the checkpoint and the log runs again, in order, under the original
sequence numbers. The outputs the first run gave are kept too, so a replay that computes a
different value for a number a client already saw is counted: with non-determinism that
happens, and it is exactly the inconsistency HAMS exists to prevent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from parityserve.core.hams import Executed

__all__ = ["ReplayLog"]


class ReplayLog:
    def __init__(self) -> None:
        self._batches: list[tuple[int, dict[str, Any], list[bytes]]] = []  # (last seq, ...)
        self._outputs: dict[int, np.ndarray] = {}
        self.checkpoint = 0
        self.replayed_batches = 0

    @property
    def since_checkpoint(self) -> int:
        """Batches logged after the last checkpoint: what a failure now would replay."""
        return len(self._batches)

    @property
    def answered_since_checkpoint(self) -> int:
        """Outputs clients were given after the last checkpoint: what a replay now would
        compute again, and could contradict."""
        return len(self._outputs)

    def logged(self, header: dict[str, Any], frames: Sequence[Any]) -> None:
        self._batches.append((int(header["seqs"][-1]), dict(header),
                              [bytes(f) for f in frames]))

    def answered(self, batch: Sequence[Executed[np.ndarray]], outputs: np.ndarray) -> None:
        for entry, row in zip(batch, outputs, strict=True):
            self.answered_one(entry.seq, row)

    def answered_one(self, seq: int, row: Any) -> None:
        self._outputs[seq] = np.array(row, copy=True)

    def checkpointed(self, seq: int) -> None:
        """The operator's state after ``seq`` is in storage: the log before it can go."""
        self.checkpoint = max(self.checkpoint, seq)
        self._batches = [b for b in self._batches if b[0] > self.checkpoint]
        self._outputs = {s: o for s, o in self._outputs.items() if s > self.checkpoint}

    def after(self, seq: int) -> list[tuple[dict[str, Any], list[bytes]]]:
        """The batches to run again on a process restored to ``seq``, in their order."""
        todo = [(header, frames) for last, header, frames in self._batches if last > seq]
        self.replayed_batches = len(todo)
        return todo

    def conflicts_with(self, seq: int, row: Any) -> bool:
        """A replayed output differs from the one answered for the same number."""
        first = self._outputs.get(seq)
        return first is not None and not np.array_equal(first, np.asarray(row))
