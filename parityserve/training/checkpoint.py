"""Training checkpoints (for ``--resume``) and the deployable output: .npz weights + JSON.

A checkpoint is one ``torch.save`` file holding plain types and tensors only, so it loads with
``torch.load(weights_only=True)``::

    {"format": "parityserve-parity-checkpoint", "version": 1, "epoch": completed epochs,
     "config": {...}, "coefficients": [[...]], "models": [state_dict per parity model],
     "optimizers": [optimizer state per parity model], "best_accuracy_degraded": float,
     "history": [per-epoch report dicts]}
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from parityserve.errors import ConfigError, DataError
from parityserve.training.deployed import save_npz

__all__ = [
    "CHECKPOINT_FORMAT",
    "MUST_MATCH",
    "check_resumable",
    "export_weights",
    "load_checkpoint",
    "save_checkpoint",
    "weights_paths",
    "write_sidecar",
]

CHECKPOINT_FORMAT = "parityserve-parity-checkpoint"
# Settings a resumed run must share with the checkpoint; the rest (epochs, device) may change.
MUST_MATCH = ("model", "dataset", "k", "r", "encoder")


def save_checkpoint(path: Path, state: Mapping[str, Any]) -> None:
    """Write ``state`` atomically: a crash mid-write leaves the previous checkpoint intact."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        torch.save({"format": CHECKPOINT_FORMAT, "version": 1, **state}, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"--resume: no checkpoint at {path}; run without --resume first")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises pickle, zip and runtime errors here
        raise DataError(f"checkpoint {path} is unreadable: {exc}") from exc
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise DataError(f"{path} is not a parityserve parity-training checkpoint")
    return state


def check_resumable(state: Mapping[str, Any], config: Mapping[str, Any], path: Path) -> None:
    """ConfigError when the checkpoint was trained for a different model, dataset or code."""
    saved = state["config"]
    diffs = [
        f"{key}: checkpoint {saved.get(key)!r}, now {config[key]!r}"
        for key in MUST_MATCH
        if saved.get(key) != config[key]
    ]
    if diffs:
        raise ConfigError(f"cannot resume from {path}: {'; '.join(diffs)}")


def weights_paths(checkpoint: Path, r: int) -> list[Path]:
    """Where the parity weights go: ``<stem>.npz``, or ``<stem>-p<j>.npz`` for r > 1."""
    if r == 1:
        return [checkpoint.with_suffix(".npz")]
    return [checkpoint.with_name(f"{checkpoint.stem}-p{j}.npz") for j in range(r)]


def export_weights(states: list[dict[str, torch.Tensor]], checkpoint: Path) -> list[Path]:
    paths = weights_paths(checkpoint, len(states))
    for state, path in zip(states, paths, strict=True):
        save_npz(state, path)
    return paths


def write_sidecar(path: Path, info: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info, indent=2) + "\n")
