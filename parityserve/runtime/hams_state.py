"""A stateful operator's full state as one flat byte buffer: copied in, sent as one frame.

The primary's state manager copies every state tensor into views of one buffer (numpy's
copy releases the GIL, so the copy overlaps the next batch's compute, H11), and the buffer
leaves as a single ZeroMQ frame without a second copy; the backup installs straight from
the frame it received. The backup
checks the layout against its own state before installing anything: a primary and backup
built from different operator options must not silently mix tensors.

Hand-written because the layout is ours: torch.save would pickle (and a pickle from a peer
runs code), and safetensors would add a serialisation copy on every batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import Tensor

from parityserve.errors import ProtocolError

__all__ = ["FlatState", "Layout", "layout_of"]

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
            nbytes = int(np.prod(shape, dtype=np.int64)) * kind.itemsize
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


def _number_dtype(text: str) -> np.dtype[Any]:
    try:
        kind = np.dtype(text)
    except TypeError as exc:
        raise ProtocolError(f"state tensor dtype {text!r} is not a number type") from exc
    if kind.kind not in "biuf":
        raise ProtocolError(f"state tensor dtype {text!r} is not a number type")
    return kind
