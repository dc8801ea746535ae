"""Readers for the shared datasets (MNIST, Fashion-MNIST, lossy CIFAR-10) and sklearn digits.

The data folder is never hard-coded: pass it explicitly or set ``PARITYSERVE_DATA``. Nothing
here downloads anything.
"""

from __future__ import annotations

import gzip
import os
import zipfile
import zlib
from pathlib import Path
from typing import Literal

import numpy as np

from parityserve.errors import DataError

__all__ = [
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "DATA_ENV",
    "load_cifar10",
    "load_digits_split",
    "load_mnist",
    "normalise_cifar10",
    "read_idx",
    "resolve_data_dir",
    "weights_file",
]

DATA_ENV = "PARITYSERVE_DATA"
CIFAR10_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
CIFAR10_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)

_MNIST_KINDS = ("mnist", "fashion-mnist")
_MNIST_PREFIX = {"train": "train", "test": "t10k"}
_CIFAR_FILES = {"test": "cifar10-test.npz", "train": "cifar10-train-20k.npz"}


def resolve_data_dir(explicit: str | Path | None = None) -> Path:
    """The data folder: ``explicit`` if given, else ``$PARITYSERVE_DATA``; it must exist."""
    raw = explicit if explicit is not None else os.environ.get(DATA_ENV)
    if not raw:
        raise DataError(
            f"no data folder given: pass data_dir or set {DATA_ENV} to the folder holding "
            "mnist/, fashion-mnist/, cifar10/ and weights/"
        )
    path = Path(raw).expanduser()
    if not path.is_dir():
        source = "data_dir" if explicit is not None else DATA_ENV
        raise DataError(f"data folder {path} (from {source}) does not exist or is not a folder")
    return path


def weights_file(name: str, data_dir: str | Path | None = None) -> Path:
    """The published weights file ``<data_dir>/weights/<name>`` (``.npz`` added if absent)."""
    folder = resolve_data_dir(data_dir) / "weights"
    path = folder / (name if Path(name).suffix else f"{name}.npz")
    if not path.is_file():
        have = sorted(p.name for p in folder.glob("*")) if folder.is_dir() else []
        raise DataError(f"weights file {path} not found; available: {have or 'none'}")
    return path


# --- MNIST / Fashion-MNIST ------------------------------------------------------------------


def load_mnist(
    split: Literal["train", "test"],
    *,
    kind: Literal["mnist", "fashion-mnist"] = "mnist",
    data_dir: str | Path | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Images as float32 (N, 784) in [0, 1] and labels as int64."""
    _check_choice("split", split, tuple(_MNIST_PREFIX))
    _check_choice("kind", kind, _MNIST_KINDS)
    folder = resolve_data_dir(data_dir) / kind
    prefix = _MNIST_PREFIX[split]
    images = read_idx(folder / f"{prefix}-images-idx3-ubyte.gz", ndim=3)
    labels = read_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", ndim=1)
    if len(images) != len(labels):
        raise DataError(f"{folder}: {len(images)} {split} images but {len(labels)} labels")
    x = images.reshape(len(images), -1).astype(np.float32) / 255.0
    return x, labels.astype(np.int64)


def read_idx(path: Path, *, ndim: int | None = None) -> np.ndarray:
    """Read a gzip-compressed IDX file of uint8 (the MNIST format), validating its header."""
    raw = _gunzip(path)
    dims = _idx_dims(raw, path, ndim)
    body = raw[4 + 4 * len(dims) :]
    expected = int(np.prod(dims, dtype=np.int64))
    if len(body) != expected:
        raise DataError(f"{path}: header promises {expected} bytes of data, file has {len(body)}")
    return np.frombuffer(body, dtype=np.uint8).reshape(dims)


def _gunzip(path: Path) -> bytes:
    if not path.is_file():
        raise DataError(f"dataset file {path} not found; is the data folder complete?")
    try:
        with gzip.open(path, "rb") as f:
            return f.read()
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path} is not a valid gzip file (corrupt or truncated): {exc}") from exc


def _idx_dims(raw: bytes, path: Path, ndim: int | None) -> tuple[int, ...]:
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataError(f"{path}: bad IDX magic number (expected two zero bytes first)")
    if raw[2] != 0x08:
        raise DataError(f"{path}: IDX type byte is 0x{raw[2]:02x}, expected 0x08 (uint8)")
    found = raw[3]
    if ndim is not None and found != ndim:
        raise DataError(f"{path}: IDX file has {found} dimensions, expected {ndim}")
    if len(raw) < 4 + 4 * found:
        raise DataError(f"{path}: IDX header is truncated")
    return tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=found, offset=4))


# --- CIFAR-10 -------------------------------------------------------------------------------


def load_cifar10(
    split: Literal["test", "train"],
    *,
    data_dir: str | Path | None = None,
    normalise: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """The lossy CIFAR-10 copy as float32 NCHW (normalised unless told not to) and int64 labels.

    ``train`` is the 20,000-image subset. With ``normalise=False`` pixels are in [0, 1].
    """
    _check_choice("split", split, tuple(_CIFAR_FILES))
    path = resolve_data_dir(data_dir) / "cifar10" / _CIFAR_FILES[split]
    images, labels = _read_cifar_npz(path)
    x = normalise_cifar10(images) if normalise else _to_unit_nchw(images)
    return x, labels.astype(np.int64)


def normalise_cifar10(images: np.ndarray) -> np.ndarray:
    """uint8 NHWC images -> float32 NCHW, scaled to [0, 1] then normalised per channel."""
    x = (images.astype(np.float32) / 255.0 - CIFAR10_MEAN) / CIFAR10_STD
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def _to_unit_nchw(images: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray((images.astype(np.float32) / 255.0).transpose(0, 3, 1, 2))


def _read_cifar_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    if not path.is_file():
        raise DataError(f"dataset file {path} not found; is the data folder complete?")
    try:
        with np.load(path, allow_pickle=False) as data:
            images, labels = data["x"], data["y"]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise DataError(f"{path}: not a CIFAR npz with arrays 'x' and 'y': {exc}") from exc
    if images.ndim != 4 or images.shape[1:] != (32, 32, 3) or len(images) != len(labels):
        raise DataError(f"{path}: expected x (N,32,32,3) and N labels, got {images.shape}")
    return images, labels


# --- scikit-learn digits --------------------------------------------------------------------


def load_digits_split(
    seed: int = 0, test_size: float = 0.25
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """sklearn's bundled 8x8 digits, stratified split: float32 pixels / 16, int64 labels."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = digits.data.astype(np.float32) / 16.0
    y = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=test_size, random_state=seed, stratify=y
    )
    return x_tr, y_tr, x_te, y_te


def _check_choice(what: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{what}={value!r}; use one of {list(choices)}")
