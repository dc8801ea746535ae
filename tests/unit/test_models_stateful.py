"""The stateful operator API on a real model: the MNIST MLP learning online."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from torch import Tensor

torch = pytest.importorskip("torch")

from parityserve.models.datasets import load_mnist  # noqa: E402
from parityserve.models.stateful import (  # noqa: E402
    OnlineMLP,
    StateBuffer,
    StateCopyTimeout,
    run_batch,
    writes_during_compute,
)


def mnist(data_dir: Path, split: str, n: int) -> tuple[Tensor, Tensor]:
    x, y = load_mnist("train" if split == "train" else "test", data_dir=data_dir)
    return torch.from_numpy(x[:n]), torch.from_numpy(y[:n])


def go() -> threading.Event:
    event = threading.Event()
    event.set()
    return event


def test_online_learning_on_mnist_feedback_learns(data_dir: Path) -> None:
    """200 feedback batches of 32 from a random start: measured 76% on 2,000 test images
    (lr 0.05, momentum 0.9, seed 1); chance is 10%."""
    op = OnlineMLP(seed=1)
    state = op.initialize()
    x, y = mnist(data_dir, "train", 6400)
    tx, ty = mnist(data_dir, "test", 2000)
    unlabelled = (tx, torch.full_like(ty, -1))
    untrained = (run_batch(op, unlabelled, state, go()) == ty).float().mean().item()
    for i in range(0, 6400, 32):
        run_batch(op, (x[i:i + 32], y[i:i + 32]), state, go())
    trained = (run_batch(op, unlabelled, state, go()) == ty).float().mean().item()
    assert untrained < 0.3 and trained > 0.7


def test_compute_writes_no_state_and_batchnorm_in_train_mode_does(data_dir: Path) -> None:
    op = OnlineMLP(seed=2)
    state = op.initialize()
    batch = mnist(data_dir, "train", 16)
    assert writes_during_compute(op, batch, state) == []
    op.net.insert(1, torch.nn.BatchNorm1d(200))  # the pitfall: train-mode BN
    state = {**state, **{f"bn.{k}": v for k, v in op.net[1].named_buffers()}}
    assert "bn.running_mean" in writes_during_compute(op, batch, state)


def test_update_waits_for_the_copy_signal(data_dir: Path) -> None:
    op = OnlineMLP(seed=3)
    state = op.initialize()
    before = {k: v.clone() for k, v in state.items()}
    with pytest.raises(StateCopyTimeout):
        run_batch(op, mnist(data_dir, "train", 8), state, threading.Event(), timeout_s=0)
    assert all(torch.equal(before[k], v) for k, v in state.items())


def test_backup_installs_the_primary_bytes_even_when_noise_makes_replay_diverge(
        data_dir: Path) -> None:
    batch = mnist(data_dir, "train", 32)
    primary, replay = OnlineMLP(noise=1e-3, seed=4), OnlineMLP(noise=1e-3, seed=4)
    p_state, r_state = primary.initialize(), replay.initialize()
    run_batch(primary, batch, p_state, go())
    run_batch(replay, batch, r_state, go())
    assert not torch.equal(p_state["0.weight"], r_state["0.weight"])  # replay diverges
    buffer = StateBuffer(p_state)
    buffer.capture(p_state)
    backup = OnlineMLP(seed=5)
    b_state = backup.initialize()
    buffer.install(b_state)
    assert all(torch.equal(p_state[k], b_state[k]) for k in p_state)
    assert torch.equal(backup.net[0].weight, primary.net[0].weight)  # live model updated


def test_without_noise_the_step_is_deterministic(data_dir: Path) -> None:
    batch = mnist(data_dir, "train", 32)
    a, b = OnlineMLP(seed=6), OnlineMLP(seed=6)
    sa, sb = a.initialize(), b.initialize()
    run_batch(a, batch, sa, go())
    run_batch(b, batch, sb, go())
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
