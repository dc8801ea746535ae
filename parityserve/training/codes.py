"""Torch-side parity codes for training: encoders, coefficient rows, targets and decoders.

They match the serving-side numpy codes in ``parityserve.core.coding.parity``
(``AdditionEncoder``, ``ConcatEncoder``, ``LinearCode``, ``SubtractionDecoder``), batched:

- ``addition``: the parity query is the sum of the k queries. With ``r > 1`` parity models,
  parity model ``j`` gets the linear combination ``sum_l C[j, l] * x_l`` with the coefficient
  matrix of ``default_coefficients`` (row 0 all ones, so row 0 is the plain sum).
- ``concat`` (k in {2, 4}): each image is average-pooled by 2 along its width (k=2) or along
  both dimensions (k=4), and the k small images are tiled into one image of the original size:
  side by side for k=2; top-left, top-right, bottom-left, bottom-right for k=4.

A parity model for a linear code is trained so that its output approximates the same linear
combination of the deployed model's outputs; one missing output is then rebuilt by
subtraction. A concat parity model is trained with cross-entropy on the k samples' labels,
each with weight 1/k, and decoded by subtraction in probability space (``decode_softmax``).

Tensors of k queries are stacked along a leading axis: ``(k, B, ...)``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from parityserve.core.coding.parity import LinearCode
from parityserve.errors import ConfigError

__all__ = [
    "ENCODERS",
    "addition_encode",
    "check_code",
    "combine",
    "concat_encode",
    "decode_softmax",
    "decode_subtraction",
    "default_coefficients",
    "soft_labels",
]

ENCODERS = ("addition", "concat")
CONCAT_KS = (2, 4)


def check_code(k: int, r: int, encoder: str) -> None:
    """Raise ``ConfigError`` unless (k, r, encoder) names a code this trainer supports."""
    if encoder not in ENCODERS:
        raise ConfigError(f"--encoder {encoder!r}: use one of {list(ENCODERS)}")
    if k < 2:
        raise ConfigError(f"--k {k}: a parity code needs k >= 2 queries per group")
    if r < 1:
        raise ConfigError(f"--r {r}: train at least one parity model (r >= 1)")
    if encoder == "concat" and k not in CONCAT_KS:
        raise ConfigError(f"--encoder concat works for k in {list(CONCAT_KS)}, not k={k}")
    if encoder == "concat" and r != 1:
        raise ConfigError("--encoder concat trains one parity model; use --r 1 (or addition)")


def default_coefficients(k: int, r: int) -> torch.Tensor:
    """The (r, k) matrix of ``LinearCode.default(k, r)``: row j is ``[1, 2, ..., k] ** j``.

    Taken from the serving-side code, so a trained parity model and the decoder agree.
    """
    if k < 1 or r < 1:
        raise ConfigError(f"coefficients need k >= 1 and r >= 1, got k={k}, r={r}")
    matrix = LinearCode.default(k, r).coefficients
    return torch.from_numpy(np.array(matrix, dtype=np.float32))


def combine(stacked: torch.Tensor, coefficients: torch.Tensor) -> torch.Tensor:
    """``sum_l coefficients[l] * stacked[l]``: a linear code's encoder, and its target."""
    if stacked.shape[0] != coefficients.shape[0]:
        raise ValueError(
            f"{stacked.shape[0]} stacked items for {coefficients.shape[0]} coefficients"
        )
    coeffs = coefficients.to(device=stacked.device, dtype=stacked.dtype)
    return torch.tensordot(coeffs, stacked, dims=1)


def addition_encode(stacked: torch.Tensor) -> torch.Tensor:
    """The sum of the k queries in ``stacked`` (k, B, ...)."""
    return stacked.sum(dim=0)


def concat_encode(stacked: torch.Tensor, image_shape: tuple[int, int, int]) -> torch.Tensor:
    """Downsample-and-tile k in {2, 4} images; the result keeps one query's shape."""
    k, batch = stacked.shape[0], stacked.shape[1]
    if k not in CONCAT_KS:
        raise ValueError(f"concat encodes k in {list(CONCAT_KS)} images, got {k}")
    images = stacked.reshape(k * batch, *image_shape)
    kernel = (1, 2) if k == 2 else (2, 2)
    small = F.avg_pool2d(images, kernel)
    small = small.reshape(k, batch, *small.shape[1:])
    if k == 2:
        tiled = torch.cat([small[0], small[1]], dim=-1)
    else:
        top = torch.cat([small[0], small[1]], dim=-1)
        bottom = torch.cat([small[2], small[3]], dim=-1)
        tiled = torch.cat([top, bottom], dim=-2)
    return tiled.reshape(stacked.shape[1:])


def soft_labels(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(k, B) integer labels -> (B, num_classes) summed one-hot rows normalised to sum 1."""
    one_hot = F.one_hot(labels, num_classes).to(torch.float32)
    return one_hot.sum(dim=0) / labels.shape[0]


def decode_subtraction(
    parity: torch.Tensor, outputs: torch.Tensor, coefficients: torch.Tensor
) -> torch.Tensor:
    """Rebuild each output from the parity output and the others: (G, C), (G, k, C) -> (G, k, C).

    Entry ``[:, i]`` is ``(parity - sum_{l != i} c_l * outputs[:, l]) / c_i``, i.e. what the
    decoder returns when output i is the unavailable one.
    """
    c = coefficients.to(device=outputs.device, dtype=outputs.dtype)
    total = torch.einsum("l,glc->gc", c, outputs)
    rest = parity.unsqueeze(1) - total.unsqueeze(1) + c[None, :, None] * outputs
    return rest / c[None, :, None]


def decode_softmax(parity: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
    """The concat decoder: ``k * softmax(parity) - sum_{l != i} softmax(outputs[:, l])``."""
    k = outputs.shape[1]
    probs = outputs.softmax(dim=-1)
    total = probs.sum(dim=1, keepdim=True)
    return k * parity.softmax(dim=-1).unsqueeze(1) - (total - probs)
