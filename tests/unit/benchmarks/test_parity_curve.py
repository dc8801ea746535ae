"""benchmarks.parity_curve's bookkeeping: the curve, when the target holds, and how many
epochs one resumed call may train inside the budget."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
import torch  # noqa: E402

from benchmarks import parity_curve  # noqa: E402


def _history(gaps: list[float], seconds: float = 2.0) -> list[dict[str, float]]:
    return [{"epoch": i + 1, "accuracy_available": 0.98, "accuracy_degraded": 0.98 - g,
             "seconds": seconds} for i, g in enumerate(gaps)]


def test_the_curve_adds_up_training_minutes_and_gaps() -> None:
    curve = parity_curve.curve_from_history(_history([0.10, 0.06], seconds=30.0))
    assert [r["gap_points"] for r in curve] == [10.0, 6.0]
    assert [r["train_minutes"] for r in curve] == [0.5, 1.0]


@pytest.mark.parametrize(("gaps", "held"), [
    ([0.08, 0.04, 0.06, 0.04, 0.03], 4),  # reached at 2, lost at 3, held from 4
    ([0.08, 0.04, 0.06], None),  # the last epoch is outside the target
    ([0.01], 1),
])
def test_the_target_holds_from_the_first_epoch_after_the_last_miss(gaps: list[float],
                                                                   held: int | None) -> None:
    curve = parity_curve.curve_from_history(_history(gaps))
    within = [r["gap_points"] <= 5.0 for r in curve]
    assert parity_curve._stays_from(curve, within) == held


def test_a_resumed_call_trains_what_the_budget_left_holds(tmp_path: Path) -> None:
    checkpoint = tmp_path / "c.pt"
    # No checkpoint yet: one epoch, to time it.
    assert parity_curve._next_stop(0, 100, 0.0, 60.0, checkpoint) == 1
    torch.save({"epoch": 2, "history": _history([0.1, 0.1], seconds=10.0)}, checkpoint)
    assert parity_curve._next_stop(2, 100, 20.0, 60.0, checkpoint) == 6  # 40 s left: 4 more
    assert parity_curve._next_stop(2, 3, 20.0, 60.0, checkpoint) == 3  # never past --epochs
    assert parity_curve._next_stop(2, 100, 55.0, 60.0, checkpoint) == 3  # at least one
