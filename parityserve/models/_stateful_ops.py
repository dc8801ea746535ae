"""Stateful operators shipped with parityserve (re-exported by ``parityserve.models.stateful``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from parityserve.models._stateful_audit import audit_columns, entropy_seed
from parityserve.models._stateful_base import OperatorBatch, State

__all__ = ["OnlineMLP"]


@dataclass(frozen=True)
class _Step:
    """What ``update`` applies: the gradients and the batch's noise seed."""

    grads: tuple[Tensor, ...]
    seed: int


class OnlineMLP:
    """784-200-100-10 MLP learning online from ``OperatorBatch`` (or ``(images, labels)``)
    batches, images as [n, 784] or [n, 1, 28, 28]; labels of -1 mean "predict only". It
    outputs the predicted class (int64 [n]). ``noise`` > 0 adds Gaussian noise to each step,
    drawn from a seed taken from OS entropy per batch: the injected non-determinism that
    makes a re-execution diverge. ``audit`` appends ``AUDIT_COLUMNS`` (row in the batch,
    batch size, noise seed) to each output row (int64 [n, 4]), so the batches and seeds
    that reached clients can be replayed exactly (``replay_state``)."""

    def __init__(self, lr: float = 0.05, momentum: float = 0.9, noise: float = 0.0,
                 init: Mapping[str, Tensor] | None = None, seed: int = 0,
                 audit: bool = False) -> None:
        if not isinstance(audit, bool):
            raise ValueError(f"audit must be true or false, got {audit!r}")
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(784, 200), nn.ReLU(), nn.Linear(200, 100),
                                 nn.ReLU(), nn.Linear(100, 10))
        if init is not None:
            self.net.load_state_dict({k.removeprefix("nn."): v for k, v in init.items()})
        self.lr, self.momentum, self.noise, self.audit = lr, momentum, noise, audit

    def initialize(self) -> State:
        params = dict(self.net.named_parameters())
        momenta = {f"momentum.{k}": torch.zeros_like(v) for k, v in params.items()}
        return {**{k: v.data for k, v in params.items()}, **momenta}

    def compute(self, batch: OperatorBatch | tuple[Tensor, Tensor],
                state: State) -> tuple[Tensor, _Step | None]:
        return self.compute_seeded(batch, state, entropy_seed() if self.noise else 0)

    def compute_seeded(self, batch: OperatorBatch | tuple[Tensor, Tensor], state: State,
                       seed: int) -> tuple[Tensor, _Step | None]:
        """``compute`` with the batch's noise seed given: what a replay runs."""
        images, labels = _images_and_labels(batch)
        params = [p for _, p in self.net.named_parameters()]
        logits = self.net(images)
        predicted = logits.detach().argmax(1)
        outputs = torch.cat([predicted[:, None], audit_columns(len(predicted), seed)], 1) \
            if self.audit else predicted
        known = labels >= 0
        if not bool(known.any()):
            return outputs, None
        loss = nn.functional.cross_entropy(logits[known], labels[known])
        grads = torch.autograd.grad(loss, params)  # reads the parameters, writes nothing
        return outputs, _Step(grads, seed)

    def update(self, state: State, pending: _Step | None) -> None:
        if pending is None:
            return
        noise = torch.Generator().manual_seed(pending.seed) if self.noise else None
        with torch.no_grad():
            for (name, param), grad in zip(self.net.named_parameters(), pending.grads,
                                           strict=True):
                buf = state[f"momentum.{name}"]
                buf.mul_(self.momentum).add_(grad)
                step = buf if noise is None else \
                    buf + self.noise * torch.randn(buf.shape, generator=noise)
                param.sub_(self.lr * step)


def _images_and_labels(batch: OperatorBatch | tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    images, labels = (batch.inputs, batch.labels) if isinstance(batch, OperatorBatch) else batch
    flat = images.reshape(len(images), math.prod(images.shape[1:]))
    if flat.shape[1] != 784:
        raise ValueError(f"OnlineMLP takes 784 features per row ([n, 784] or [n, 1, 28, 28]); "
                         f"got shape {list(images.shape)}")
    if labels.numel() and int(labels.max()) >= 10:
        raise ValueError(f"OnlineMLP labels are classes 0-9 (-1: no label); got "
                         f"{int(labels.max())}")
    return _aligned(flat), labels


def _aligned(images: Tensor) -> Tensor:
    """The images in a 64-byte aligned buffer. MKL's matrix product picks its kernel by the
    operand's address: measured here, inputs 4 or 8 bytes off a 16-byte boundary change
    the result's last bits, and a replay could not match the primary bit for bit. Torch's own
    allocations are 64-byte aligned; numpy's are only 16."""
    return images if images.data_ptr() % 64 == 0 else images.clone()
