"""A small scikit-learn digits classifier for the default demo (needs no shared data)."""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import joblib

from parityserve.models.datasets import load_digits_split

__all__ = ["train_digits_classifier"]


def train_digits_classifier(cache_dir: Path, *, seed: int = 0) -> Path:
    """Train (or reuse) a logistic-regression digits model; returns its joblib file.

    A ``.json`` next to it records the test accuracy. A cached file is reused only if it
    loads cleanly, so a file from another scikit-learn version is simply retrained.
    """
    cache_dir = Path(cache_dir)
    path = cache_dir / f"digits-logreg-seed{seed}.joblib"
    if _loads(path):
        return path
    model, accuracy = _train(seed)
    cache_dir.mkdir(parents=True, exist_ok=True)
    _atomic_write(path, lambda f: joblib.dump(model, f))
    info = {"model": "LogisticRegression", "seed": seed, "test_accuracy": accuracy}
    _atomic_write(path.with_suffix(".json"), lambda f: f.write(json.dumps(info).encode()))
    return path


def _loads(path: Path) -> bool:
    if not path.is_file():
        return False
    try:
        # Version-mismatch warnings mean "retrain", so they are turned into errors here.
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            return hasattr(joblib.load(path), "predict")
    except Exception:  # any unreadable cache is rebuilt, never fatal
        return False


def _train(seed: int) -> tuple[Any, float]:
    from sklearn.linear_model import LogisticRegression

    x_tr, y_tr, x_te, y_te = load_digits_split(seed=seed)
    model = LogisticRegression(C=1.0, max_iter=2000).fit(x_tr, y_tr)
    return model, float(model.score(x_te, y_te))


def _atomic_write(path: Path, write: Any) -> None:
    # Write-then-rename so a concurrent reader (another worker, `make demo`) never sees half.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
