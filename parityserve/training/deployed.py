"""The deployed model that a parity model learns from: a zoo net with its weights.

``zoo:parm-mlp`` and ``zoo:resnetNN`` default to the published weights in the data folder.
``zoo:digits-mlp`` has none: a DigitsMLP is trained on sklearn digits in about a second and
cached under ``<cache_dir>/digits-mlp-seed<S>.npz``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from parityserve.errors import ConfigError, DataError
from parityserve.training.data import DatasetInfo, Split

__all__ = ["ZOO_NETS", "build_net", "deployed_outputs", "frozen_net", "load_deployed",
           "parse_model"]

ZOO_NETS: dict[str, tuple[str, dict[str, int]]] = {
    "parm-mlp": ("ParMMLP", {}),
    "lenet5": ("LeNet5", {}),
    **{f"resnet{d}": ("CifarResNet", {"depth": d}) for d in (20, 32, 44, 56)},
    "digits-mlp": ("DigitsMLP", {}),
}


def parse_model(spec: str | None, info: DatasetInfo) -> str:
    """``zoo:NAME`` (or ``NAME``, or None for the dataset's default) -> a checked zoo name."""
    name = info.default_model if spec is None else spec.removeprefix("zoo:")
    if name not in ZOO_NETS:
        raise ConfigError(
            f"--model {spec!r}: train-parity takes a zoo net, one of "
            f"{', '.join('zoo:' + n for n in ZOO_NETS)}"
        )
    if name not in info.models:
        fits = ", ".join("zoo:" + m for m in info.models)
        raise ConfigError(f"zoo:{name} does not take {info.name} inputs; use {fits}")
    return name


def build_net(name: str, *, seed: int = 0) -> nn.Module:
    """A fresh ``name`` net with the seeded initialisation (global RNG left untouched)."""
    from parityserve.models import nets

    cls_name, kwargs = ZOO_NETS[name]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module: nn.Module = getattr(nets, cls_name)(**kwargs)
    return module


def load_deployed(
    name: str,
    info: DatasetInfo,
    *,
    weights: str | Path | None,
    data_dir: str | Path | None,
    cache_dir: Path,
    split: Split,
) -> tuple[nn.Module, Path]:
    """The frozen deployed model (eval mode) and the weights file it was loaded from."""
    path = Path(weights) if weights is not None else None
    if path is None:
        path = _default_weights(name, info, data_dir, cache_dir, split)
    return frozen_net(name, path), path


def frozen_net(name: str, weights: Path) -> nn.Module:
    """The zoo net ``name`` with the weights in ``weights`` (.npz or .pt), in eval mode and
    without gradients; a clear error names the file when the weights do not fit the net."""
    from parityserve.models import _torch

    module = build_net(name)
    _torch.load_state_dict(module, _torch.read_state_dict(weights), where=str(weights))
    return module.eval().requires_grad_(False)


def _default_weights(
    name: str, info: DatasetInfo, data_dir: str | Path | None, cache_dir: Path, split: Split
) -> Path:
    from parityserve.models.datasets import weights_file

    if name == "digits-mlp":
        return train_digits_mlp(split, cache_dir / "digits-mlp-seed0.npz")
    published = {"parm-mlp": f"parm-{info.name}-base-mlp.npz"}.get(name)
    if name.startswith("resnet"):
        published = f"cifar10-{name}.npz"
    if published is None:
        raise ConfigError(f"zoo:{name} has no published weights; pass --weights FILE")
    try:
        return weights_file(published, data_dir)
    except DataError as exc:
        raise DataError(f"zoo:{name}: {exc}; pass --weights or --data-dir") from exc


def train_digits_mlp(split: Split, path: Path, *, epochs: int = 20) -> Path:
    """Train (or reuse) the deployed DigitsMLP on the digits training split."""
    if path.is_file():
        return path
    model = build_net("digits-mlp")
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        for idx in torch.randperm(len(split.x_train), generator=generator).split(64):
            loss = nn.functional.cross_entropy(model(split.x_train[idx]), split.y_train[idx])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    save_npz(model.state_dict(), path)
    return path


def save_npz(state: dict[str, torch.Tensor], path: Path) -> None:
    """Write a state_dict as ``np.savez`` arrays (what ``zoo:`` loaders read), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Any, not ndarray: numpy's stub would match ``**arrays`` against ``allow_pickle: bool``.
    arrays: dict[str, Any] = {k: v.detach().cpu().numpy() for k, v in state.items()}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def deployed_outputs(
    module: nn.Module, x: torch.Tensor, device: torch.device, *, batch: int = 1024
) -> torch.Tensor:
    """The frozen model's outputs on every row of ``x`` (kept on the CPU)."""
    module.to(device)
    with torch.no_grad():  # not inference_mode: these tensors become training targets
        parts = [module(chunk.to(device)).float().cpu() for chunk in x.split(batch)]
    return torch.cat(parts)
