"""A stateful operator's full state as one flat byte buffer: copied in, sent as one frame.

The primary's state manager copies every state tensor into views of one pre-allocated
buffer (``dst.copy_(src)`` releases the GIL, so the copy overlaps the next batch's compute,
H11), and the buffer leaves as a single ZeroMQ frame without a second copy. The backup
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
import torch
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
        views = flat.views()
        with torch.no_grad():
            for name, tensor in state.items():
                views[name].copy_(tensor.detach())
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

    def views(self) -> dict[str, Tensor]:
        out = {}
        whole = torch.from_numpy(self.buffer) if self.buffer.flags.writeable else \
            torch.from_numpy(self.buffer.copy())
        for name, dtype, shape, offset in self.layout:
            torch_dtype = _torch_dtype(dtype)
            count = int(np.prod(shape, dtype=np.int64))
            nbytes = count * torch.empty((), dtype=torch_dtype).element_size()
            if offset + nbytes > whole.numel():
                raise ProtocolError(f"state tensor {name} runs past the end of the buffer")
            out[name] = whole[offset:offset + nbytes].view(torch_dtype).view(shape)
        return out

    def install(self, state: Mapping[str, Tensor]) -> None:
        """Overwrite the live state with these bytes, in place (the backup's apply)."""
        expected, _ = layout_of(state)
        if expected != self.layout:
            raise ProtocolError("the state's layout differs from this operator's: were the "
                                "primary and backup built with the same options?")
        views = self.views()
        with torch.no_grad():
            for name, tensor in state.items():
                tensor.copy_(views[name])

    def frame(self) -> memoryview:
        return self.buffer.data

    @property
    def nbytes(self) -> int:
        return int(self.buffer.nbytes)


def _torch_dtype(text: str) -> torch.dtype:
    try:
        kind = np.dtype(text)
    except TypeError as exc:
        raise ProtocolError(f"state tensor dtype {text!r} is not a number type") from exc
    if kind.kind not in "biuf":
        raise ProtocolError(f"state tensor dtype {text!r} is not a number type")
    return torch.from_numpy(np.empty(0, dtype=kind)).dtype
