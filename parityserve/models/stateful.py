"""The stateful operator API (HAMS §V): a model whose work on a batch splits in two stages.

```python
class MyOperator:
    def initialize(self) -> dict[str, Tensor]: ...            # the state tensors, by name
    def compute(self, batch, state) -> tuple[outputs, pending]  # reads the state only
    def update(self, state, pending) -> None                    # writes the state only
```

Between the two stages the primary's state manager copies the *previous* state to send to
the backup, so ``compute`` must not write anything the copy reads, and ``update`` must not
start before the copy is done: ``run_batch`` waits on an event for that (decision H2).

**What counts as state** (H12): everything a later batch reads that an earlier one wrote.
Parameters and optimiser buffers of an online learner; BatchNorm running statistics; for a
sequence model, each stream's (h, c); the RNG state if the update draws random numbers
you want reproduced on the backup (injected noise here is deliberately *not* state: the
backup installs the primary's bytes, it never re-executes).

**The BatchNorm pitfall.** In train mode BatchNorm writes its running mean and variance
during the forward pass, i.e. in ``compute``. The copy could then catch a half-updated
state. Freeze BN (``eval()``) while fine-tuning online, or compute the new statistics into
``pending`` and write them in ``update``. ``writes_during_compute`` finds such writes.

``OnlineMLP`` is the example: an MNIST MLP fine-tuned by SGD with momentum on labelled
feedback, one optimiser step per batch.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Protocol

import torch
from torch import Tensor, nn

__all__ = ["OnlineMLP", "StateBuffer", "StateCopyTimeout", "StatefulOperator", "run_batch",
           "writes_during_compute"]

State = dict[str, Tensor]


class StatefulOperator(Protocol):
    def initialize(self) -> State: ...

    def compute(self, batch: Any, state: State) -> tuple[Any, Any]: ...

    def update(self, state: State, pending: Any) -> None: ...


class StateCopyTimeout(RuntimeError):
    """The state manager never said the copy was done: the update must not run."""


def run_batch(op: StatefulOperator, batch: Any, state: State, may_update: threading.Event,
              timeout_s: float | None = None) -> Any:
    """Compute, wait until the previous state is copied, update; return the outputs (they
    may leave before the update: they do not depend on it)."""
    outputs, pending = op.compute(batch, state)
    if not may_update.wait(timeout_s):
        raise StateCopyTimeout(f"no copy-done signal within {timeout_s} s; state unchanged")
    op.update(state, pending)
    return outputs


class StateBuffer:
    """Pre-allocated CPU copies of a state. ``capture`` uses ``dst.copy_(src)``, which
    releases the GIL, so a state-manager thread overlaps the next compute (H11)."""

    def __init__(self, state: Mapping[str, Tensor]) -> None:
        self.tensors = {k: torch.empty_like(v, device="cpu") for k, v in state.items()}

    def capture(self, state: Mapping[str, Tensor]) -> None:
        for name, tensor in state.items():
            self.tensors[name].copy_(tensor)

    def install(self, state: Mapping[str, Tensor]) -> None:
        """The backup's apply: overwrite the live state with these bytes, in place."""
        with torch.no_grad():
            for name, tensor in state.items():
                tensor.copy_(self.tensors[name])


def writes_during_compute(op: StatefulOperator, batch: Any, state: State) -> list[str]:
    """The state tensors ``compute`` changed (it must change none): a BatchNorm left in train
    mode shows up here."""
    before = {k: v.detach().clone() for k, v in state.items()}
    op.compute(batch, state)
    return sorted(k for k, v in state.items() if not torch.equal(before[k], v))


class OnlineMLP:
    """784-200-100-10 MLP learning online from ``(images, labels)`` batches; labels of -1
    mean "predict only". ``noise`` > 0 adds unseeded Gaussian noise to each step: the
    injected non-determinism that makes a replay diverge."""

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

    def compute(self, batch: tuple[Tensor, Tensor], state: State) -> tuple[Tensor, Any]:
        images, labels = batch
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
