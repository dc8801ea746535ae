"""A stateful operator's full state as one flat byte buffer: copied in, sent as one frame.

The primary's state manager copies every state tensor into views of one buffer (numpy's
copy releases the GIL, so the copy overlaps the next batch's compute, H11), and the buffer
leaves as a single ZeroMQ frame without a second copy; the backup installs straight from
the frame it received. The backup
checks the layout against its own state before installing anything: a primary and backup
built from different operator options must not silently mix tensors.

Hand-written because the layout is ours: torch.save would pickle (and a pickle from a peer
runs code), and safetensors would add a serialisation copy on every batch.

``FlatDelta`` is the same for the rows a batch changed (``core.hams.deltas``): those rows of
the named tensors, in one buffer, with their row numbers in a second frame. The backup
writes them over its state; the primary folds them into the full copy it retains.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import Tensor

from parityserve.errors import ProtocolError

__all__ = ["FlatDelta", "FlatState", "Layout", "layout_of"]

_ALIGN = 64  # every tensor starts on a 64-byte boundary, so any dtype view is aligned

# (name, dtype as numpy's str, shape, byte offset)
Layout = tuple[tuple[str, str, tuple[int, ...], int], ...]


def layout_of(state: Mapping[str, Tensor]) -> tuple[Layout, int]:
    """Where each tensor goes in the flat buffer, in the state's own order, and its size."""
    entries, offset = [], 0
    for name, tensor in state.items():
        dtype = np.dtype(str(tensor.dtype).removeprefix("torch.")).str
        entries.append((name, dtype, tuple(tensor.shape), offset))
        nbytes = tensor.numel() * tensor.element_size()
        offset += -(-nbytes // _ALIGN) * _ALIGN
    return tuple(entries), offset


@dataclass
class FlatState:
    """One copy of a state: ``seq`` says after which request it was taken."""

    seq: int
    layout: Layout
    buffer: np.ndarray  # uint8, the bytes that travel

    @classmethod
    def capture(cls, seq: int, state: Mapping[str, Tensor]) -> FlatState:
        layout, size = layout_of(state)
        flat = cls(seq, layout, np.empty(size, dtype=np.uint8))
        arrays = flat.arrays()
        for name, tensor in state.items():
            arrays[name][...] = tensor.detach().numpy()
        return flat

    @classmethod
    def received(cls, seq: int, layout: Any, frame: Any) -> FlatState:
        """A peer's state: the layout is checked for shape only here; ``install`` checks it
        against the live state."""
        data = np.frombuffer(frame.buffer if hasattr(frame, "buffer") else frame, np.uint8)
        try:
            entries = tuple((str(n), str(d), tuple(int(x) for x in s), int(o))
                            for n, d, s, o in layout)
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"bad state layout: {exc}") from exc
        return cls(seq, entries, data)

    def arrays(self) -> dict[str, np.ndarray]:
        """A numpy view of each tensor in the buffer (no copy, read-only when the buffer is
        a received frame)."""
        out = {}
        for name, dtype, shape, offset in self.layout:
            kind = _number_dtype(dtype)
            nbytes = math.prod(shape) * kind.itemsize  # (np.prod: ~10 us a call)
            if offset + nbytes > self.buffer.nbytes:
                raise ProtocolError(f"state tensor {name} runs past the end of the buffer")
            out[name] = self.buffer[offset:offset + nbytes].view(kind).reshape(shape)
        return out

    def install(self, state: Mapping[str, Tensor]) -> None:
        """Overwrite the live state with these bytes, in place (the backup's apply), straight
        from the received frame."""
        expected, _ = layout_of(state)
        if expected != self.layout:
            raise ProtocolError("the state's layout differs from this operator's: were the "
                                "primary and backup built with the same options?")
        arrays = self.arrays()
        for name, tensor in state.items():
            np.copyto(tensor.detach().numpy(), arrays[name])

    def frame(self) -> memoryview:
        return self.buffer.data

    @property
    def nbytes(self) -> int:
        return int(self.buffer.nbytes)


@dataclass
class FlatDelta:
    """Rows ``rows`` of some state tensors after request ``seq``, to write over the state
    after request ``base`` (a declared delta)."""

    seq: int
    base: int
    rows: np.ndarray  # int64 [k], the row of each tensor's first dimension
    layout: Layout  # each tensor's [k, ...] block in ``buffer``
    buffer: np.ndarray  # uint8

    @classmethod
    def capture(cls, seq: int, base: int, state: Mapping[str, Tensor], rows: Sequence[int],
                names: Sequence[str]) -> FlatDelta:
        """Gather the rows straight into one buffer (one copy, no intermediate tensor)."""
        index = np.asarray(rows, dtype=np.int64)
        sources = {name: state[name].detach().numpy() for name in names}
        layout, size = _block_layout(sources, len(index))
        delta = cls(seq, base, index, layout, np.empty(size, dtype=np.uint8))
        for name, block in delta.arrays().items():
            np.take(sources[name], index, axis=0, out=block)
        return delta

    @classmethod
    def received(cls, seq: int, base: int, layout: Any, frame: Any, rows_frame: Any
                 ) -> FlatDelta:
        """A peer's delta; its layout is checked against the live state by ``install``."""
        flat = FlatState.received(seq, layout, frame)
        try:
            rows = np.frombuffer(_bytes(rows_frame), dtype=np.int64)
        except ValueError as exc:
            raise ProtocolError(f"bad delta rows: {exc}") from exc
        return cls(seq, int(base), rows, flat.layout, flat.buffer)

    def arrays(self) -> dict[str, np.ndarray]:
        return FlatState(self.seq, self.layout, self.buffer).arrays()

    def frames(self) -> list[memoryview]:
        return [self.buffer.data, self.rows.data]

    def install(self, state: Mapping[str, Tensor]) -> None:
        """Write the rows over the live state (the backup's apply, in chain order)."""
        self._write({name: t.detach().numpy() for name, t in state.items()})

    def apply_to(self, full: FlatState) -> None:
        """Fold into a full copy of the state after ``base``: it is then the one after
        ``seq`` (the primary's retained copy, once the backup applied this delta)."""
        if full.seq != self.base:
            raise ProtocolError(f"a delta from {self.base} folded into the state after "
                                f"{full.seq}")
        self._write(full.arrays())
        full.seq = self.seq

    def _write(self, targets: Mapping[str, np.ndarray]) -> None:
        """Check every block against its target (name, dtype, row shape, row range) before
        writing any: a bad delta changes nothing."""
        blocks = self.arrays()
        low, high = (int(self.rows.min()), int(self.rows.max())) if len(self.rows) else (0, -1)
        for name, block in blocks.items():
            target = targets.get(name)
            if target is None or target.dtype != block.dtype \
                    or target.shape[1:] != block.shape[1:] or len(block) != len(self.rows):
                raise ProtocolError(f"delta tensor {name!r} does not fit this operator's "
                                    "state: were the primary and backup built with the same "
                                    "options?")
            if low < 0 or high >= len(target):
                raise ProtocolError(f"delta rows of {name!r} run past its {len(target)} rows")
        for name, block in blocks.items():
            targets[name][self.rows] = block

    @property
    def nbytes(self) -> int:
        return int(self.buffer.nbytes + self.rows.nbytes)


def _block_layout(sources: Mapping[str, np.ndarray], k: int) -> tuple[Layout, int]:
    entries, offset = [], 0
    for name, array in sources.items():
        shape = (k, *array.shape[1:])
        entries.append((name, array.dtype.str, shape, offset))
        nbytes = math.prod(shape) * array.dtype.itemsize
        offset += -(-nbytes // _ALIGN) * _ALIGN
    return tuple(entries), offset


def _bytes(frame: Any) -> Any:
    return frame.buffer if hasattr(frame, "buffer") else frame


def _number_dtype(text: str) -> np.dtype[Any]:
    try:
        kind = np.dtype(text)
    except TypeError as exc:
        raise ProtocolError(f"state tensor dtype {text!r} is not a number type") from exc
    if kind.kind not in "biuf":
        raise ProtocolError(f"state tensor dtype {text!r} is not a number type")
    return kind
