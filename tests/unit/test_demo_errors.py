"""The demo says which errors it saw and what to do about them, not just how many."""

from __future__ import annotations

import pytest

from parityserve import demo


def test_errors_are_listed_by_kind_most_first_with_a_hint_for_shedding(
        capsys: pytest.CaptureFixture[str]) -> None:
    demo._explain_errors({"timeout": 3, "HTTP 503": 100}, "no coding: ")
    out = " ".join(capsys.readouterr().out.split())
    assert "no coding: errors by kind: HTTP 503 x 100, timeout x 3" in out
    assert "is another job using the CPU" in out and "lower --rate" in out


def test_other_errors_get_no_load_hint_and_none_print_nothing(
        capsys: pytest.CaptureFixture[str]) -> None:
    demo._explain_errors({"ConnectError": 2})
    out = capsys.readouterr().out
    assert "errors by kind: ConnectError x 2" in out and "CPU" not in out
    demo._explain_errors({})
    assert capsys.readouterr().out == ""
