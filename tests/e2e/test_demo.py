"""`make demo` is the main job: its command must work from a clean folder."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

PARITYSERVE = str(Path(sys.executable).with_name("parityserve"))


def test_demo_trains_serves_loads_and_reports(tmp_path: Path) -> None:
    run = subprocess.run(
        [PARITYSERVE, "demo", "--queries", "400", "--rate", "200",
         "--cache-dir", str(tmp_path / "cache")],
        capture_output=True, text=True, timeout=240, cwd=tmp_path)
    out = run.stdout
    assert run.returncode == 0, out + run.stderr
    for metric in ("throughput", "p50 latency", "p99 latency", "p99.9 latency"):
        assert metric in out
    accuracy = float(re.search(r"accuracy vs labels\s*│\s*([\d.]+)%", out).group(1))
    assert accuracy > 90.0
    assert re.search(r"errors\s*│\s*0\s", out)
    assert "/digits/predict" in out and "/metrics" in out
    assert "no worker left behind" in out
    assert (tmp_path / "cache" / "digits-logreg-seed0.joblib").is_file()  # cached for next time
