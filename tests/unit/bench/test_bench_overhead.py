"""The overhead bench's p50 verdict: it states only what the measured figures support."""

from __future__ import annotations

from typing import Any

from parityserve.bench.overhead import _p50_verdict


def _model(probe: dict[str, float], raw: float = 0.002) -> dict[str, Any]:
    points = [{"system": s, "rate": 100.0, "p50_ms": p} for s, p in probe.items()
              if s != "floor"]
    return {"raw": {"p50_ms": raw}, "points": points,
            "probe": {s: {"p50_ms": p} for s, p in probe.items()}}


def test_met_when_under_a_millisecond_and_hops_split() -> None:
    text = _p50_verdict("noop", _model({"bare": 0.4, "floor": 0.6, "parityserve": 0.9}))
    assert "(target < 1 ms): met" in text
    assert "process hop costs 0.200 ms" in text
    assert "serving logic 0.300 ms" in text
    assert "whole 1 ms budget" not in text


def test_a_floor_above_parityserve_is_not_split() -> None:
    """The floor app measured slower than parityserve: no negative 'serving logic' cost."""
    text = _p50_verdict("noop", _model({"bare": 1.0, "floor": 1.85, "parityserve": 1.41}))
    assert "missed" in text
    assert "does not split the hops" in text
    assert "serving logic -" not in text


def test_a_bare_app_over_budget_is_named_as_the_limit() -> None:
    text = _p50_verdict("noop", _model({"bare": 1.2, "floor": 1.3, "parityserve": 1.5}))
    assert "bare HTTP app alone spends the whole 1 ms budget" in text
    assert "serving path adds 0.300 ms over the bare app" in text


def test_a_floor_over_budget_rules_out_the_architecture() -> None:
    text = _p50_verdict("noop", _model({"bare": 0.8, "floor": 1.1, "parityserve": 1.4}))
    assert "no implementation of this architecture meets the target" in text
    assert "whole 1 ms budget" not in text
