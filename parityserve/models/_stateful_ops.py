"""Stateful operators shipped with parityserve (re-exported by ``parityserve.models.stateful``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from parityserve.models._stateful_base import OperatorBatch, State

__all__ = ["OnlineMLP"]


class OnlineMLP:
    """784-200-100-10 MLP learning online from ``OperatorBatch`` (or ``(images, labels)``)
    batches, images as [n, 784] or [n, 1, 28, 28]; labels of -1 mean "predict only". It
    outputs the predicted class (int64 [n]). ``noise`` > 0 adds unseeded Gaussian noise to
    each step: the injected non-determinism that makes a replay diverge."""

    def __init__(self, lr: float = 0.05, momentum: float = 0.9, noise: float = 0.0,
                 init: Mapping[str, Tensor] | None = None, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(784, 200), nn.ReLU(), nn.Linear(200, 100),
                                 nn.ReLU(), nn.Linear(100, 10))
        if init is not None:
            self.net.load_state_dict({k.removeprefix("nn."): v for k, v in init.items()})
        self.lr, self.momentum, self.noise = lr, momentum, noise
        self._rng = torch.Generator()
        self._rng.seed()  # from OS entropy: deliberately not reproducible

    def initialize(self) -> State:
        params = dict(self.net.named_parameters())
        momenta = {f"momentum.{k}": torch.zeros_like(v) for k, v in params.items()}
        return {**{k: v.data for k, v in params.items()}, **momenta}

    def compute(self, batch: OperatorBatch | tuple[Tensor, Tensor],
                state: State) -> tuple[Tensor, Any]:
        images, labels = _images_and_labels(batch)
        params = [p for _, p in self.net.named_parameters()]
        logits = self.net(images)
        known = labels >= 0
        if not bool(known.any()):
            return logits.detach().argmax(1), None
        loss = nn.functional.cross_entropy(logits[known], labels[known])
        grads = torch.autograd.grad(loss, params)  # reads the parameters, writes nothing
        return logits.detach().argmax(1), grads

    def update(self, state: State, pending: Any) -> None:
        if pending is None:
            return
        with torch.no_grad():
            for (name, param), grad in zip(self.net.named_parameters(), pending, strict=True):
                buf = state[f"momentum.{name}"]
                buf.mul_(self.momentum).add_(grad)
                step = buf if self.noise == 0 else \
                    buf + self.noise * torch.randn(buf.shape, generator=self._rng)
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
    return flat, labels
