"""Where a deployment's expected accuracy of rebuilt answers comes from (the I/O half of
``core/reconstruction.py``): its ``reconstruction:`` table, else, for ParM with trained parity
weights, the JSON sidecar ``parityserve train-parity`` wrote beside them."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from parityserve.config import Deployment
from parityserve.core.reconstruction import ExpectedAccuracy, parm_method

__all__ = ["expected_accuracy", "sidecar_path"]

log = logging.getLogger(__name__)


def expected_accuracy(dep: Deployment, base_dir: Path | None) -> ExpectedAccuracy | None:
    """The deployment's table, the parity model's sidecar, or None (nothing measured)."""
    if dep.reconstruction is not None:
        table = dep.reconstruction
        return ExpectedAccuracy(dict(table.expected_accuracy),
                                f"deployment {dep.name!r}: {table.source}")
    parity = dep.parity
    if dep.redundancy.mode != "parm" or parity is None or parity.weights is None:
        return None
    sidecar = sidecar_path(Path(parity.weight_files[0] or ""), parity.r, base_dir)
    return _from_sidecar(sidecar, parm_method(parity.r, parity.encoder))


def sidecar_path(weights: Path, r: int, base_dir: Path | None) -> Path:
    """``train-parity`` writes ``NAME.npz`` and ``NAME.json`` (r = 1), or ``NAME-p0.npz``..."""
    if not weights.is_absolute():
        weights = (base_dir or Path.cwd()) / weights
    stem = weights.stem.removesuffix("-p0") if r > 1 else weights.stem
    return weights.with_name(f"{stem}.json")


def _from_sidecar(sidecar: Path, method: str) -> ExpectedAccuracy | None:
    try:
        info = json.loads(sidecar.read_text())
        accuracy = float(info["accuracy_degraded"])
        where = (f"{sidecar} (train-parity: degraded-mode accuracy on the {info['dataset']} "
                 f"test set after {info['epochs']} epochs)")
        return ExpectedAccuracy({method: accuracy}, where)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring parity sidecar %s: %s", sidecar, exc)
        return None
