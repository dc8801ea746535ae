"""Datasets as torch tensors for parity training, and which zoo nets fit which dataset.

Both splits are shuffled with a generator seeded by ``seed``: the CIFAR-10 files are sorted by
class, and ``--train-limit`` / ``--val-limit`` must take a representative subset.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from parityserve.errors import ConfigError

__all__ = ["DATASETS", "DatasetInfo", "Split", "dataset_info", "load_split"]


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    image_shape: tuple[int, int, int]  # (channels, height, width), for the concat encoder
    num_classes: int
    default_model: str
    models: tuple[str, ...]  # zoo nets that take this dataset's inputs


_RESNETS = ("resnet20", "resnet32", "resnet44", "resnet56")
DATASETS: dict[str, DatasetInfo] = {
    "mnist": DatasetInfo("mnist", (1, 28, 28), 10, "parm-mlp", ("parm-mlp", "lenet5")),
    "fashion-mnist": DatasetInfo(
        "fashion-mnist", (1, 28, 28), 10, "parm-mlp", ("parm-mlp", "lenet5")
    ),
    "cifar10": DatasetInfo("cifar10", (3, 32, 32), 10, "resnet20", _RESNETS),
    "digits": DatasetInfo("digits", (1, 8, 8), 10, "digits-mlp", ("digits-mlp",)),
}


@dataclass(frozen=True)
class Split:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def dataset_info(name: str) -> DatasetInfo:
    info = DATASETS.get(name)
    if info is None:
        raise ConfigError(f"--dataset {name!r}: use one of {list(DATASETS)}")
    return info


def load_split(
    name: str,
    *,
    data_dir: str | Path | None = None,
    seed: int = 0,
    train_limit: int | None = None,
    val_limit: int | None = None,
) -> Split:
    """Load ``name``; DataError (from the readers) when its files are missing."""
    x_tr, y_tr, x_te, y_te = _read(dataset_info(name).name, data_dir)
    rng = np.random.default_rng(seed)
    x_tr, y_tr = _shuffle(x_tr, y_tr, rng, train_limit)
    x_te, y_te = _shuffle(x_te, y_te, rng, val_limit)
    return Split(*(torch.from_numpy(np.ascontiguousarray(a)) for a in (x_tr, y_tr, x_te, y_te)))


def _read(
    name: str, data_dir: str | Path | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from parityserve.models import datasets

    if name == "digits":
        # The demo's fixed split, so the deployed model's accuracy is comparable across runs.
        return datasets.load_digits_split(seed=0)
    if name == "cifar10":
        x_tr, y_tr = datasets.load_cifar10("train", data_dir=data_dir)
        x_te, y_te = datasets.load_cifar10("test", data_dir=data_dir)
        return x_tr, y_tr, x_te, y_te
    kind: Literal["mnist", "fashion-mnist"] = "mnist" if name == "mnist" else "fashion-mnist"
    x_tr, y_tr = datasets.load_mnist("train", kind=kind, data_dir=data_dir)
    x_te, y_te = datasets.load_mnist("test", kind=kind, data_dir=data_dir)
    return x_tr, y_tr, x_te, y_te


def _shuffle(
    x: np.ndarray, y: np.ndarray, rng: np.random.Generator, limit: int | None
) -> tuple[np.ndarray, np.ndarray]:
    order = rng.permutation(len(x))[:limit]
    return x[order].astype(np.float32, copy=False), y[order].astype(np.int64, copy=False)
