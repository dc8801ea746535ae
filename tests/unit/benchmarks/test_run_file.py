"""The resumable run file that every benchmark saves its measurements in."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.run_file import RunFile


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
    kept = json.loads(old[0])
    assert {k: kept[k] for k in ("fingerprint", "key", "row")} == {
        "fingerprint": {"q": 1}, "key": "a", "row": {"v": 1}}


def test_numpy_scalars_are_saved_as_floats(tmp_path: Path) -> None:
    import numpy as np

    path = tmp_path / "runs.jsonl"
    _Named(path, {"q": 1}, resume=False).append("a", {"key": "a"}, {"v": np.float32(0.5)})
    assert _Named(path, {"q": 1}, resume=True).rows == {"a": {"v": 0.5}}


def test_each_line_names_the_command_that_measured_it(tmp_path: Path, monkeypatch) -> None:
    import sys

    path = tmp_path / "runs.jsonl"
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "benchmarks.x", "--rates", "100"])
    _Named(path, {"q": 1}, resume=False).append("a", {"key": "a"}, {"v": 1})
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "benchmarks.x", "--resume"])
    resumed = _Named(path, {"q": 1}, resume=True)
    resumed.append("b", {"key": "b"}, {"v": 2})
    with path.open("a") as f:  # a line from before commands were kept
        f.write(json.dumps({"fingerprint": {"q": 1}, "key": "c", "row": {"v": 3}}) + "\n")
    again = _Named(path, {"q": 1}, resume=True)
    assert list(again.commands) == ["python -m benchmarks.x --rates 100",
                                    "python -m benchmarks.x --resume"]
    assert set(again.rows) == {"a", "b", "c"}
