"""The resumable run file that every benchmark saves its measurements in."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from parityserve.bench.run_file import RunFile


class _Named(RunFile):
    def key_of(self, saved: dict[str, Any]) -> str:
        return str(saved["key"])


def test_rows_come_back_under_the_same_settings_only(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    first = _Named(path, {"queries": 100}, resume=False)
    first.append("a", {"key": "a"}, {"p50": 1.5})
    first.append("b", {"key": "b"}, {"p50": 2.5})
    assert _Named(path, {"queries": 100}, resume=True).rows == {"a": {"p50": 1.5},
                                                               "b": {"p50": 2.5}}
    assert _Named(path, {"queries": 200}, resume=True).rows == {}  # other settings


def test_a_later_line_for_the_same_key_wins_and_blank_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    runs = _Named(path, {"q": 1}, resume=False)
    runs.append("a", {"key": "a"}, {"v": 1})
    with path.open("a") as f:
        f.write("\n")
    runs.append("a", {"key": "a"}, {"v": 2})
    assert _Named(path, {"q": 1}, resume=True).rows == {"a": {"v": 2}}


def test_starting_afresh_keeps_the_old_file_aside(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    _Named(path, {"q": 1}, resume=False).append("a", {"key": "a"}, {"v": 1})
    fresh = _Named(path, {"q": 1}, resume=False)
    assert fresh.rows == {} and not path.exists()
    old = path.with_name("runs.jsonl.old").read_text().splitlines()
    assert json.loads(old[0]) == {"fingerprint": {"q": 1}, "key": "a", "row": {"v": 1}}


def test_numpy_scalars_are_saved_as_floats(tmp_path: Path) -> None:
    import numpy as np

    path = tmp_path / "runs.jsonl"
    _Named(path, {"q": 1}, resume=False).append("a", {"key": "a"}, {"v": np.float32(0.5)})
    assert _Named(path, {"q": 1}, resume=True).rows == {"a": {"v": 0.5}}
