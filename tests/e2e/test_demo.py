"""`make demo` is the main job: its command must work from a clean folder."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

PARITYSERVE = str(Path(sys.executable).with_name("parityserve"))
ROW = r"{}\s*│\s*([\d.]+) ?{unit}\s*│\s*([\d.]+) ?{unit}"  # a row of the side-by-side table


def _pair(out: str, metric: str, unit: str = "ms") -> tuple[float, float]:
    match = re.search(ROW.format(re.escape(metric), unit=unit), out)
    assert match, f"no {metric!r} row with two values in:\n{out}"
    return float(match.group(1)), float(match.group(2))


def _check_verdict(flat: str, uncoded_p99: float, coded_p99: float) -> None:
    """The verdict is the one the table's p99s give (not either): 'cut it' with their ratio
    when ParM's p99 is lower, 'did not cut it' otherwise, and it quotes those p99s."""
    verdict = re.search(r"Judged on the p99: ParM (cut it ([\d.]+)x|did not cut it), ([\d.]+) ms "
                        r"-> ([\d.]+) ms.*600 answers per deployment", flat)
    assert verdict, flat
    before, after = float(verdict.group(3)), float(verdict.group(4))
    # The table prints two decimals and the verdict one: equal to the rounding.
    assert abs(before - uncoded_p99) <= 0.051 and abs(after - coded_p99) <= 0.051, flat
    if abs(uncoded_p99 - coded_p99) >= 0.01:  # a tie to the table's rounding could go either way
        assert verdict.group(1).startswith("cut it") == (coded_p99 < uncoded_p99), flat
    if verdict.group(2):
        assert abs(float(verdict.group(2)) - uncoded_p99 / coded_p99) <= 0.051 + 0.01 * (
            uncoded_p99 / coded_p99), flat


# Part 2 trains a parity model (about 15 s), starts 6 torch workers and sends 2 x 700 queries:
# about a minute on a quiet 2-core machine, more when it is shared.
# Part 1's SLO is 1 s here, not the demo's 50 ms: make test shares the cores with another test
# file (and in CI, other jobs), where admission rightly shed 2 of 400 queries it could not
# answer in 50 ms (a fresh-clone run beside a CPU hog), and the demo counts a shed query as an
# error. Every query must still be answered, with no error and no default.
@pytest.mark.timeout(300)
def test_demo_trains_serves_loads_and_reports(tmp_path: Path) -> None:
    run = subprocess.run(
        [PARITYSERVE, "demo", "--queries", "400", "--rate", "200", "--slo-ms", "1000",
         "--coding-queries", "600", "--cache-dir", str(tmp_path / "cache")],
        capture_output=True, text=True, timeout=290, cwd=tmp_path)
    out = run.stdout
    assert run.returncode == 0, out + run.stderr
    # Part 1: one classifier, 2 replicas, open-loop load.
    for metric in ("throughput", "p50 latency", "p99 latency", "p99.9 latency"):
        assert metric in out
    accuracy = float(re.search(r"accuracy vs labels\s*│\s*([\d.]+)%", out).group(1))
    assert accuracy > 90.0
    assert re.search(r"errors\s*│\s*0\s", out)
    assert re.search(r"default answers \(SLO misses\)\s*│\s*0\s", out)
    assert "/digits/predict" in out and "/metrics" in out
    assert "server stopped (exit code 0); no worker left behind" in out
    assert (tmp_path / "cache" / "digits-logreg-seed0.joblib").is_file()  # cached for next time

    # Part 2: the same load on a slowed replica, without coding and with ParM, side by side.
    part2 = out[out.index("one slow replica"):]
    assert "no coding" in part2 and "ParM, k = 2" in part2
    for metric in ("p50 latency", "p99 latency", "p99.9 latency"):
        _pair(part2, metric)
    uncoded, coded = _pair(part2, "accuracy vs labels", "%")
    assert uncoded > 90.0 and coded > 90.0
    assert _pair(part2, "errors", "") == (0, 0)
    # The answers behind each percentile, and a verdict that names the one it judges: with
    # 600 answers per side p99.9 is too thin, so p99 is judged (and said to be).
    assert _pair(part2, "answers measured", "") == (600, 600)
    assert re.search(r"answers at or above p99 / p99\.9\s*│\s*\d+ / \d+\s*│\s*\d+ / \d+", part2)
    flat = " ".join(part2.split())
    _check_verdict(flat, *_pair(part2, "p99 latency"))
    assert "p99.9: ParM" not in flat
    assert _pair(part2, "reconstructed answers", "")[0] == 0
    line = re.search(r"(\d+) of 600 answers were reconstructed by ParM; their accuracy against "
                     r"the labels: ([\d.]+)% \(vs ([\d.]+)% for the model's own answers",
                     " ".join(part2.split()))  # rich wraps long lines
    assert line, part2
    rebuilt, rebuilt_accuracy = int(line.group(1)), float(line.group(2))
    assert rebuilt == _pair(part2, "reconstructed answers", "")[1] > 0
    if rebuilt >= 10:  # a rebuilt answer is right about 96% of the time; chance is 10%
        assert rebuilt_accuracy > 50.0
    assert "comparison server stopped (exit code 0); no worker left behind" in part2
    assert (tmp_path / "cache" / "parity" / "demo-digits-mlp-k2-addition.npz").is_file()
