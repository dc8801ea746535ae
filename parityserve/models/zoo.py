"""The model zoo: reference networks with published weights, plus tiny numpy models for tests.

``zoo:parm-mlp`` and ``zoo:resnetNN`` fall back to the published weights under
``<data_dir>/weights/`` when no ``weights`` are given. The torch classes (``ParMMLP``,
``LeNet5``, ``CifarResNet``, ``DigitsMLP``) live in ``nets`` and are imported from here only on
first use, so ``zoo:noop`` works without torch installed. ``zoo:digits-mlp`` (sklearn digits,
64 features) has no published weights; ``parityserve train-parity --dataset digits`` makes some.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from parityserve.config import TensorSpec
from parityserve.errors import DataError, ModelLoadError
from parityserve.models._python import serve_object
from parityserve.models.base import Batch, LoadedModel, Model
from parityserve.models.datasets import resolve_data_dir, weights_file

if TYPE_CHECKING:
    from parityserve.models.nets import CifarResNet, DigitsMLP, LeNet5, ParMMLP

__all__ = [
    "ZOO_NAMES",
    "CifarResNet",
    "DigitsMLP",
    "EchoModel",
    "LeNet5",
    "NoopModel",
    "ParMMLP",
    "SleepModel",
    "TORCH_ZOO_NAMES",
    "check_zoo",
    "load_zoo",
]

_TORCH_CLASSES = ("CifarResNet", "DigitsMLP", "LeNet5", "ParMMLP")
_MNIST_KINDS = ("mnist", "fashion-mnist")


def __getattr__(name: str) -> Any:
    # Lazy re-export: touching zoo.ParMMLP imports torch, importing zoo does not.
    if name in _TORCH_CLASSES:
        from parityserve.models import nets

        return getattr(nets, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class NoopModel(Model):
    """The cheapest possible model: a float32 zero per query, whatever the input."""

    output_spec: ClassVar[TensorSpec | None] = TensorSpec(name="output", datatype="FP32", shape=())

    def predict(self, batch: Batch) -> np.ndarray:
        return np.zeros(len(batch), dtype=np.float32)


class SleepModel(NoopModel):
    """Like ``NoopModel`` but takes ``sleep_ms`` per batch: a stand-in for a slow model."""

    def __init__(self, sleep_ms: float = 10.0) -> None:
        if not sleep_ms >= 0:
            raise ValueError(f"sleep_ms must be >= 0, got {sleep_ms!r}")
        self.sleep_s = float(sleep_ms) / 1000.0

    def predict(self, batch: Batch) -> np.ndarray:
        time.sleep(self.sleep_s)
        return super().predict(batch)


class EchoModel(Model):
    """Returns the batch unchanged: each query's output is its input."""

    def predict(self, batch: Batch) -> Batch:
        return batch


@dataclass(frozen=True)
class _Request:
    name: str
    weights: Path | None
    options: Mapping[str, Any]
    data_dir: Path | None
    threads: int

    @property
    def source(self) -> str:
        return f"zoo:{self.name}"


def load_zoo(
    name: str,
    *,
    weights: Path | None = None,
    options: Mapping[str, Any] | None = None,
    data_dir: Path | None = None,
    threads: int = 1,
) -> LoadedModel:
    """Build zoo model ``name`` (one of ``ZOO_NAMES``)."""
    entry = _entry(name)
    req = _Request(name, weights, dict(options or {}), data_dir, threads)
    entry.check(req)
    return entry.build(req)


def check_zoo(name: str, options: Mapping[str, Any] | None = None, *,
              weights: bool = False) -> None:
    """What ``load_zoo`` would refuse before it loads anything (``ModelLoadError``): an
    unknown name, unknown options or option values, weights where none are taken. Imports
    no framework and reads no file, so a frontend refuses a bad deploy before it is made."""
    req = _Request(name, Path("weights") if weights else None, dict(options or {}), None, 1)
    _entry(name).check(req)


@dataclass(frozen=True)
class _Entry:
    check: Callable[[_Request], None]  # the options and weights, before anything loads
    build: Callable[[_Request], LoadedModel]  # once they passed


def _entry(name: str) -> _Entry:
    entry = _ZOO.get(name)
    if entry is None:
        raise ModelLoadError(f"unknown zoo model {name!r}; choose one of: {', '.join(ZOO_NAMES)}")
    return entry


def _check_options(req: _Request, allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(req.options) - set(allowed))
    if unknown:
        takes = f"it takes {list(allowed)}" if allowed else "it takes none"
        raise ModelLoadError(f"{req.source}: unknown options {unknown}; {takes}")


def _no_options(req: _Request) -> None:
    _check_options(req, ())


def _builtin(cls: type[Model], allowed: tuple[str, ...]) -> _Entry:
    def make(req: _Request) -> Model:
        try:
            return cls(**req.options)
        except (TypeError, ValueError) as exc:
            raise ModelLoadError(f"{req.source}: bad options {dict(req.options)}: {exc}") from exc

    def check(req: _Request) -> None:
        _check_options(req, allowed)
        if req.weights is not None:
            raise ModelLoadError(f"{req.source} takes no weights; remove `weights`")
        make(req)  # a numpy model: its constructor checks the values, and costs nothing

    return _Entry(check, lambda req: serve_object(make(req), source=req.source))


def _check_parm_mlp(req: _Request) -> None:
    _check_options(req, ("dataset",))
    dataset = req.options.get("dataset", "mnist")
    if dataset not in _MNIST_KINDS:
        raise ModelLoadError(f"{req.source}: dataset={dataset!r}; use one of {list(_MNIST_KINDS)}")


def _parm_mlp(req: _Request) -> LoadedModel:
    dataset = req.options.get("dataset", "mnist")
    return _torch_model(req, "ParMMLP", {}, f"parm-{dataset}-base-mlp.npz")


def _lenet5(req: _Request) -> LoadedModel:
    return _torch_model(req, "LeNet5", {}, None)


def _digits_mlp(req: _Request) -> LoadedModel:
    # No published weights: without a file this is the seed-0 initialisation (like lenet5).
    return _torch_model(req, "DigitsMLP", {}, None)


def _resnet(depth: int) -> _Entry:
    def build(req: _Request) -> LoadedModel:
        return _torch_model(req, "CifarResNet", {"depth": depth}, f"cifar10-resnet{depth}.npz")

    return _Entry(_no_options, build)


def _torch_model(
    req: _Request, cls_name: str, kwargs: dict[str, Any], published: str | None
) -> LoadedModel:
    import torch

    from parityserve.models import _torch, nets

    weights = req.weights
    if weights is None and published is not None:
        weights = _published_weights(req, published)
    # A fixed seed makes untrained weights (e.g. LeNet5 without a file) identical in every
    # replica process, which coded redundancy relies on.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        module = getattr(nets, cls_name)(**kwargs)
    return _torch.load_module(module, weights, source=req.source, threads=req.threads)


def _published_weights(req: _Request, filename: str) -> Path:
    try:
        data_dir = resolve_data_dir(req.data_dir)
    except DataError as exc:
        raise ModelLoadError(
            f"{req.source} needs weights: pass `weights` or set PARITYSERVE_DATA to the data "
            f"folder holding weights/{filename} ({exc})"
        ) from exc
    try:
        return weights_file(filename, data_dir)
    except DataError as exc:
        raise ModelLoadError(f"{req.source}: {exc}; or pass `weights` explicitly") from exc


_ZOO: dict[str, _Entry] = {
    "parm-mlp": _Entry(_check_parm_mlp, _parm_mlp),
    "lenet5": _Entry(_no_options, _lenet5),
    **{f"resnet{d}": _resnet(d) for d in (20, 32, 44, 56)},
    "digits-mlp": _Entry(_no_options, _digits_mlp),
    "noop": _builtin(NoopModel, ()),
    "sleep": _builtin(SleepModel, ("sleep_ms",)),
    "echo": _builtin(EchoModel, ()),
}

ZOO_NAMES: tuple[str, ...] = tuple(_ZOO)
# The zoo models built with torch (``_torch_model``); the rest are numpy and serve without it.
TORCH_ZOO_NAMES: tuple[str, ...] = ("parm-mlp", "lenet5", "digits-mlp",
                                    *(f"resnet{d}" for d in (20, 32, 44, 56)))
