"""PyTorch backend: state_dict loading, TorchScript files, and wrapping a module for serving.

Only imported when a torch or zoo model is loaded, so ``import parityserve`` stays light.
"""

from __future__ import annotations

import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from parityserve.errors import ModelLoadError, PredictError
from parityserve.models.base import Batch, LoadedModel

__all__ = [
    "load_module",
    "load_state_dict",
    "load_torchscript",
    "read_state_dict",
    "wrap_module",
]


def wrap_module(module: nn.Module, *, source: str, platform: str, threads: int) -> LoadedModel:
    """Put ``module`` in eval mode and serve it; specs come from its class attributes."""
    # One worker process serves one model, so the global thread setting is the model's.
    torch.set_num_threads(threads)
    module.eval()
    return LoadedModel(
        lambda batch: _run(module, batch),
        platform=platform,
        source=source,
        input_spec=getattr(module, "input_spec", None),
        output_spec=getattr(module, "output_spec", None),
    )


def _run(module: nn.Module, batch: Batch) -> np.ndarray:
    x = torch.from_numpy(_as_input_array(batch))
    with torch.inference_mode():
        out = module(x)
    if not isinstance(out, torch.Tensor):
        raise PredictError(
            f"the module returned {type(out).__name__}; serve a module whose forward returns "
            "one tensor"
        )
    return out.detach().cpu().numpy().astype(np.float32, copy=False)


def _as_input_array(batch: Batch) -> np.ndarray:
    arr = np.ascontiguousarray(np.asarray(batch))
    # numpy defaults to float64 but torch modules hold float32 weights; integers (e.g. token
    # ids) are left alone.
    if arr.dtype == np.float64:
        arr = arr.astype(np.float32)
    return arr


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Read a state_dict from an ``np.savez`` file (.npz) or a ``torch.save`` file (.pt)."""
    if not path.is_file():
        raise ModelLoadError(f"weights file {path} does not exist; check the `weights` path")
    if path.suffix == ".npz":
        return _read_npz(path)
    return _read_pt(path)


def _read_npz(path: Path) -> dict[str, torch.Tensor]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: torch.from_numpy(np.array(data[k])) for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ModelLoadError(f"cannot read weights {path} as an np.savez file: {exc}") from exc


def _read_pt(path: Path) -> dict[str, torch.Tensor]:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types here (pickle, zip, RuntimeError)
        raise ModelLoadError(
            f"cannot read weights {path} with torch.load(weights_only=True): {exc}; save a "
            "state_dict (torch.save(model.state_dict(), path)) or use an .npz file"
        ) from exc
    # Training checkpoints often wrap the weights as {"state_dict": ..., "epoch": ...}.
    if isinstance(obj, Mapping) and isinstance(obj.get("state_dict"), Mapping):
        obj = obj["state_dict"]
    if not isinstance(obj, Mapping):
        raise ModelLoadError(f"weights {path} hold a {type(obj).__name__}, not a state_dict")
    return dict(obj)


def load_state_dict(module: nn.Module, state: Mapping[str, Any], *, where: str) -> None:
    """Load ``state`` strictly, explaining missing, unexpected and mis-shaped keys."""
    problems = _state_dict_problems(module, state)
    if problems:
        raise ModelLoadError(f"weights {where} do not fit {type(module).__name__}: {problems}")
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ModelLoadError(f"weights {where} do not fit {type(module).__name__}: {exc}") from exc


def _state_dict_problems(module: nn.Module, state: Mapping[str, Any]) -> str:
    expected = module.state_dict()
    # Published BatchNorm weights often lack this counter; torch fills it in itself.
    wanted = {k for k in expected if not k.endswith("num_batches_tracked")}
    parts = []
    if missing := sorted(wanted - state.keys()):
        parts.append(f"missing keys {_few(missing)}")
    if unexpected := sorted(state.keys() - expected.keys()):
        parts.append(f"unexpected keys {_few(unexpected)}")
    shapes = [
        f"{k}: file {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in sorted(wanted & state.keys())
        if tuple(state[k].shape) != tuple(expected[k].shape)
    ]
    if shapes:
        parts.append(f"shape mismatches {_few(shapes)}")
    return "; ".join(parts)


def _few(items: list[str], limit: int = 5) -> str:
    more = f" (+{len(items) - limit} more)" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def load_torchscript(path: Path, *, source: str, threads: int) -> LoadedModel:
    """Load a TorchScript file saved with ``torch.jit.save``."""
    if not path.is_file():
        raise ModelLoadError(f"TorchScript file {path} does not exist; check the source path")
    try:
        with warnings.catch_warnings():
            # torch deprecates TorchScript, but a user who ships a TorchScript file cannot act
            # on that warning at serving time (and warnings are errors in our test suite).
            warnings.filterwarnings("ignore", message=r".*torch\.jit", category=DeprecationWarning)
            module = torch.jit.load(str(path), map_location="cpu")
    except Exception as exc:  # torch raises RuntimeError or its own C++ error types
        raise ModelLoadError(
            f"cannot load {path} as TorchScript: {exc}; save it with torch.jit.save"
        ) from exc
    return wrap_module(module, source=source, platform="torchscript", threads=threads)


def load_module(module: Any, weights: Path | None, *, source: str, threads: int) -> LoadedModel:
    """Serve an instantiated ``nn.Module``, after loading ``weights`` into it if given."""
    if not isinstance(module, nn.Module):
        raise ModelLoadError(
            f"{source} built a {type(module).__name__}, not a torch.nn.Module; use the "
            "python: scheme for other classes"
        )
    if weights is not None:
        load_state_dict(module, read_state_dict(weights), where=str(weights))
    return wrap_module(module, source=source, platform="pytorch", threads=threads)
