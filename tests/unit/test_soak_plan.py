"""The soak's pure parts (benchmarks/soak.py, soak_attacks.py): the window plan and which
attacks an ``--attack`` filter runs."""

from __future__ import annotations

import pytest

from benchmarks.soak import plan_windows
from benchmarks.soak_attacks import ATTACKS, MATES, WRONG_WIDTH, select_attacks


def test_all_attacks_unless_filtered() -> None:
    assert select_attacks(None) == ATTACKS
    assert select_attacks([]) == ATTACKS


def test_a_filter_selects_by_words_in_any_case_keeping_the_order() -> None:
    chosen = select_attacks(["HUGE SHAPE", "1,024"])
    names = [a.name for a in chosen]
    assert names[0] == "1,024 new streams in one request"
    assert [n for n in names[1:]] == [a.name for a in ATTACKS if "huge shape" in a.name]
    assert select_attacks(["wrong-width", "batch-mates"]) == tuple(
        a for a in ATTACKS if a.name in (WRONG_WIDTH, MATES))


def test_a_filter_that_matches_nothing_names_the_attacks() -> None:
    with pytest.raises(ValueError, match="no attack matches .xyzzy.*10 MB stream key"):
        select_attacks(["1,024", "xyzzy"])


def test_windows_alternate_and_end_calm() -> None:
    plan = plan_windows(2, 10.0, 20.0)
    assert [w.kind for w in plan] == ["calm", "hostile", "calm", "hostile", "calm"]
    assert [w.offset_s for w in plan] == [0.0, 10.0, 30.0, 40.0, 60.0]
    with pytest.raises(ValueError):
        plan_windows(0, 10.0, 20.0)
