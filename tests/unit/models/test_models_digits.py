"""The demo's digits classifier: accurate, cached, and servable through the sklearn backend."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from parityserve.models import load_model
from parityserve.models.datasets import load_digits_split
from parityserve.models.digits import train_digits_classifier


def test_train_then_reuse_then_serve(tmp_path: Path) -> None:
    path = train_digits_classifier(tmp_path / "cache")
    info = json.loads(path.with_suffix(".json").read_text())
    assert info["test_accuracy"] >= 0.95

    stamp = path.stat().st_mtime_ns
    assert train_digits_classifier(tmp_path / "cache") == path
    assert path.stat().st_mtime_ns == stamp  # reused, not retrained

    _, _, x_te, y_te = load_digits_split()
    model = load_model(f"sklearn:{path}")
    assert (np.asarray(model.predict(x_te)) == y_te).mean() >= 0.95


def test_corrupt_cache_is_retrained(tmp_path: Path) -> None:
    path = tmp_path / "digits-logreg-seed0.joblib"
    path.write_bytes(b"garbage")
    assert train_digits_classifier(tmp_path) == path
    assert json.loads(path.with_suffix(".json").read_text())["seed"] == 0
