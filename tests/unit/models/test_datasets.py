"""Dataset readers: real files when PARITYSERVE_DATA is set, corrupt files made here."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from parityserve.errors import DataError
from parityserve.models.datasets import (
    load_cifar10,
    load_digits_split,
    load_mnist,
    read_idx,
    resolve_data_dir,
    weights_file,
)


def _idx(path: Path, data: np.ndarray, *, header: bytes | None = None) -> Path:
    if header is None:
        header = bytes([0, 0, 0x08, data.ndim]) + struct.pack(f">{data.ndim}I", *data.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + data.astype(np.uint8).tobytes())
    return path


# --- resolve_data_dir / weights_file --------------------------------------------------------


def test_explicit_data_dir_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARITYSERVE_DATA", "/nonexistent")
    assert resolve_data_dir(tmp_path) == tmp_path


def test_env_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARITYSERVE_DATA", str(tmp_path))
    assert resolve_data_dir() == tmp_path


def test_no_data_dir_explains_both_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PARITYSERVE_DATA", raising=False)
    with pytest.raises(DataError, match="pass data_dir or set PARITYSERVE_DATA"):
        resolve_data_dir()


def test_missing_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARITYSERVE_DATA", str(tmp_path / "gone"))
    with pytest.raises(DataError, match=r"gone \(from PARITYSERVE_DATA\) does not exist"):
        load_mnist("test")


def test_weights_file_adds_npz_and_lists_what_exists(tmp_path: Path) -> None:
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "a.npz").write_bytes(b"")
    assert weights_file("a", tmp_path) == tmp_path / "weights" / "a.npz"
    with pytest.raises(DataError, match=r"available: \['a.npz'\]"):
        weights_file("b.npz", tmp_path)


# --- IDX -----------------------------------------------------------------------------------


def test_read_idx_roundtrip(tmp_path: Path) -> None:
    data = np.arange(24).reshape(2, 3, 4)
    np.testing.assert_array_equal(read_idx(_idx(tmp_path / "a.gz", data), ndim=3), data)


@pytest.mark.parametrize(
    ("header", "match"),
    [
        (b"\x01\x00\x08\x01", "bad IDX magic"),
        (b"\x00\x00\x0d\x01", "type byte is 0x0d"),
        (b"\x00\x00\x08\x02", "has 2 dimensions, expected 1"),
        (b"\x00\x00", "bad IDX magic"),
    ],
)
def test_corrupt_idx_header(tmp_path: Path, header: bytes, match: str) -> None:
    path = _idx(tmp_path / "bad.gz", np.zeros(0), header=header)
    with pytest.raises(DataError, match=match):
        read_idx(path, ndim=1)


def test_truncated_idx_data(tmp_path: Path) -> None:
    header = bytes([0, 0, 8, 1]) + struct.pack(">I", 10)
    path = _idx(tmp_path / "short.gz", np.zeros(7), header=header)
    with pytest.raises(DataError, match="promises 10 bytes of data, file has 7"):
        read_idx(path)


def test_truncated_gzip(tmp_path: Path) -> None:
    full = _idx(tmp_path / "full.gz", np.arange(1000).reshape(10, 100)).read_bytes()
    (tmp_path / "cut.gz").write_bytes(full[: len(full) // 2])
    with pytest.raises(DataError, match="corrupt or truncated"):
        read_idx(tmp_path / "cut.gz")


def test_mnist_image_label_count_mismatch(tmp_path: Path) -> None:
    (tmp_path / "mnist").mkdir()
    _idx(tmp_path / "mnist" / "t10k-images-idx3-ubyte.gz", np.zeros((3, 28, 28)))
    _idx(tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz", np.zeros(2))
    with pytest.raises(DataError, match="3 test images but 2 labels"):
        load_mnist("test", data_dir=tmp_path)


def test_mnist_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="t10k-images-idx3-ubyte.gz not found"):
        load_mnist("test", kind="fashion-mnist", data_dir=tmp_path)


def test_bad_split_argument(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="split='val'"):
        load_mnist("val", data_dir=tmp_path)


# --- real data -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["mnist", "fashion-mnist"])
def test_real_mnist(data_dir: Path, kind: str) -> None:
    x, y = load_mnist("test", kind=kind, data_dir=data_dir)
    assert x.shape == (10_000, 784) and x.dtype == np.float32
    assert y.dtype == np.int64 and set(np.unique(y)) == set(range(10))
    assert x.min() >= 0.0 and x.max() <= 1.0


def test_real_cifar10(data_dir: Path) -> None:
    x, y = load_cifar10("test", data_dir=data_dir, normalise=False)
    assert x.shape == (10_000, 3, 32, 32) and x.dtype == np.float32 and y.dtype == np.int64
    assert x.min() >= 0.0 and x.max() <= 1.0
    xn, _ = load_cifar10("test", data_dir=data_dir)
    mean = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
    std = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]
    np.testing.assert_allclose(xn[:5], (x[:5] - mean) / std, rtol=1e-5, atol=1e-6)


def test_cifar_npz_without_expected_arrays(tmp_path: Path) -> None:
    (tmp_path / "cifar10").mkdir()
    np.savez(tmp_path / "cifar10" / "cifar10-test.npz", images=np.zeros(3))
    with pytest.raises(DataError, match="arrays 'x' and 'y'"):
        load_cifar10("test", data_dir=tmp_path)


# --- digits --------------------------------------------------------------------------------


def test_digits_split() -> None:
    x_tr, y_tr, x_te, y_te = load_digits_split(seed=0)
    assert len(x_tr) + len(x_te) == 1797 and x_tr.shape[1] == 64
    assert x_tr.dtype == np.float32 and x_tr.min() >= 0 and x_tr.max() <= 1
    assert y_te.dtype == np.int64 and abs(len(x_te) / 1797 - 0.25) < 0.01
    np.testing.assert_array_equal(load_digits_split(seed=0)[3], y_te)
