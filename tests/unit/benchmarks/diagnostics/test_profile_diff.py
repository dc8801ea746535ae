"""profile_diff compares two cProfile dumps per request, by function name across moved files."""

from __future__ import annotations

import cProfile
from pathlib import Path

import pytest

from benchmarks.diagnostics import profile_diff


def _leaf() -> int:
    return 1


def _extra() -> int:
    return _leaf()


def _dump(path: Path, requests: int, extra_calls: int) -> Path:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(requests):
        _leaf()
    for _ in range(extra_calls):
        _extra()
    profiler.disable()
    profiler.dump_stats(path)
    Path(f"{path}.txt").write_text(
        f"cProfile of the frontend's main thread: {requests:,} requests, 1 calls per request\n")
    return path


def test_calls_per_request_are_divided_by_each_dumps_own_request_count(tmp_path: Path) -> None:
    before = _dump(tmp_path / "before.prof", 1000, 0)
    after = _dump(tmp_path / "after.prof", 2000, 2000)  # one more _extra and _leaf each
    b, a = profile_diff.per_request(before), profile_diff.per_request(after)
    leaf = "test_profile_diff.py:_leaf"
    assert b[leaf][0] == pytest.approx(1.0) and a[leaf][0] == pytest.approx(2.0)
    assert "test_profile_diff.py:_extra" not in b
    assert a["test_profile_diff.py:_extra"][0] == pytest.approx(1.0)
    text = profile_diff.report(before, after, top=10)
    assert "| 1.00 | 2.00 | +1.00 |" in text and "`test_profile_diff.py:_extra`" in text


def test_a_dump_without_its_request_count_is_refused_by_name(tmp_path: Path) -> None:
    dump = _dump(tmp_path / "x.prof", 10, 0)
    Path(f"{dump}.txt").write_text("something else\n")
    with pytest.raises(SystemExit, match="x.prof.txt: no request count"):
        profile_diff.per_request(dump)
