"""Is a rebuilt answer worth serving? Expected accuracy per decoding method, and the floor.

A reconstruction (``parm-subtraction``, ``berrut``...) is approximate: how often it is right
depends on the mode and the model, and is measured, not guessed. ``ExpectedAccuracy`` holds
one deployment's measured table (method -> accuracy of a rebuilt answer) with the place the
numbers come from: a ``reconstruction:`` table in the deployment (e.g. copied from
``benchmarks/results/accuracy.md``), or the degraded-mode accuracy that
``parityserve train-parity`` stored in the parity model's JSON sidecar.

An application may set ``min_expected_accuracy``: a rebuilt answer expected to be right less
often than that, or whose accuracy nobody measured, is replaced by the application's default
output, flagged with the reason, as a low-confidence answer is (robust Exp4). Pure: no files;
the runtime reads the sidecar and hands the numbers in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["METHODS", "ExpectedAccuracy", "Rebuilt", "below_floor", "parm_method"]

# The methods decoders flag their answers with (core/redundancy.py).
METHODS = ("parm-subtraction", "parm-linear", "parm-concat", "berrut", "systematic-berrut")


@dataclass(frozen=True, slots=True)
class ExpectedAccuracy:
    """Accuracy (0..1) of a rebuilt answer, per decoding method, and where it was measured."""

    by_method: Mapping[str, float]
    source: str

    def __post_init__(self) -> None:
        for method, accuracy in self.by_method.items():
            if method not in METHODS:
                raise ValueError(f"unknown decoding method {method!r}; use one of "
                                 f"{', '.join(METHODS)}")
            if not 0.0 <= accuracy <= 1.0:
                raise ValueError(f"expected accuracy of {method} must be in [0, 1], got "
                                 f"{accuracy!r}")
        if not self.source.strip():
            raise ValueError("say where the expected accuracies come from (source)")

    def of(self, method: str) -> float | None:
        return self.by_method.get(method)


@dataclass(frozen=True, slots=True)
class Rebuilt:
    """One model's part of an answer that was rebuilt: its method and expected accuracy."""

    model: str
    method: str
    expected: float | None


def parm_method(r: int, encoder: str) -> str:
    """The method a ParM deployment's rebuilt answers carry (``core/redundancy.py``)."""
    if encoder == "concat":
        return "parm-concat"
    return "parm-subtraction" if r == 1 else "parm-linear"


def below_floor(floor: float | None, parts: list[Rebuilt]) -> str | None:
    """Why a rebuilt answer must give way to the default output (None: serve it).

    Every rebuilt part must be expected at least ``floor`` accurate; a part with no measured
    accuracy fails any floor (unknown is not good enough when an application asked for one).
    """
    if floor is None:
        return None
    for part in parts:
        if part.expected is None:
            return (f"low expected accuracy: model {part.model!r}'s answer was rebuilt by "
                    f"{part.method}, whose accuracy is not measured for this deployment, and "
                    f"the application asks for at least {floor:g}")
        if part.expected < floor:
            return (f"low expected accuracy: model {part.model!r}'s answer was rebuilt by "
                    f"{part.method}, expected {part.expected:.4g} accurate, below the "
                    f"application's floor {floor:g}")
    return None
