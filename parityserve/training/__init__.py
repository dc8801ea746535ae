"""Parity-model training (ParM): ``parityserve train-parity`` and ``train_parity``.

Importing this package imports torch.
"""

from __future__ import annotations

from parityserve.training.codes import default_coefficients
from parityserve.training.parity import EpochReport, TrainConfig, TrainResult, train_parity

__all__ = ["EpochReport", "TrainConfig", "TrainResult", "default_coefficients", "train_parity"]
