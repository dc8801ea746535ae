"""``benchmarks.parm_calibration``: the tail ratio ParM's numbers imply, the crossing, the
headroom over the no-shuffle floor; then one tiny real run end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import parm_calibration as cal


def test_parms_two_numbers_fix_the_baselines_tail_ratio() -> None:
    # Check the algebra on a made-up pair: m = 10, E = 30, P = 15 gives G = 20 / 5 = 4 and
    # c = 0.5; the ratio must come back as E / m = 3.
    assert cal.paper_tail_ratio(4.0, 0.5) == pytest.approx(3.0)
    low, middle, high = cal.paper_tail_band()
    assert low == pytest.approx(2.2 / (3.2 * 0.62 - 1))  # G = 3.2, c = 0.38
    assert high == pytest.approx(1.6 / (2.6 * 0.57 - 1))  # G = 2.6, c = 0.43
    assert low < middle < high and middle == pytest.approx(2.62, abs=0.01)


def test_impossible_paper_numbers_are_refused() -> None:
    with pytest.raises(ValueError, match="above 1"):
        cal.paper_tail_ratio(1.0, 0.4)
    with pytest.raises(ValueError, match="cannot hold"):
        cal.paper_tail_ratio(1.5, 0.5)  # P = E / 2 leaves no room for a 1.5x gap cut


def test_the_crossing_is_linear_between_the_bracketing_points() -> None:
    points = [(30.0, 3.3), (10.0, 2.7), (20.0, 3.0)]  # any order
    assert cal.crossing(points, 2.85) == pytest.approx(15.0)
    assert cal.crossing(points, 3.3) == pytest.approx(30.0)
    assert cal.crossing(points, 2.0) is None and cal.crossing(points, 4.0) is None
    assert cal.crossing([(5.0, 2.0), (10.0, 2.0)], 2.0) == 5.0
    assert cal.crossing([(5.0, 2.0)], 2.0) is None  # one point brackets nothing


def test_the_headroom_is_the_gap_over_the_no_shuffle_gap() -> None:
    floor = {"p50_ms": 30.0, "p999_ms": 70.0}
    assert cal.max_gap_cut({"p50_ms": 32.0, "p999_ms": 112.0}, floor) == pytest.approx(2.0)
    assert cal.max_gap_cut({"p50_ms": 32.0, "p999_ms": 112.0},
                           {"p50_ms": 30.0, "p999_ms": 30.0}) is None


def test_bad_grids_are_refused_with_the_flag_named() -> None:
    args = cal.build_parser().parse_args(["--exponential-ms", "5,abc"])
    with pytest.raises(SystemExit, match="--exponential-ms takes numbers"):
        cal.run(args)
    args = cal.build_parser().parse_args(["--constant-ms", "0,10"])
    with pytest.raises(SystemExit, match="must be > 0"):
        cal.run(args)
    args = cal.build_parser().parse_args(["--distributions", "lognormal"])
    with pytest.raises(SystemExit, match="--distributions takes"):
        cal.run(args)
    args = cal.build_parser().parse_args(["--distributions", "pareto", "--tail-index", "0.9"])
    with pytest.raises(SystemExit, match="--tail-index must be > 1"):
        cal.run(args)


@pytest.mark.timeout(300)
def test_a_tiny_calibration_writes_its_table_and_the_testbed_command(
        tmp_path: Path, data_dir: Path) -> None:
    # 10 warm-up queries per grid point, not the testbed's 100 (a second each, not 3.5)
    code = cal.main(["--deployed", "2", "--rate", "40", "--queries", "150", "--warmup", "10",
                     "--distributions", "exponential,pareto", "--exponential-ms", "5,40",
                     "--pareto-ms", "5", "--tail-index", "2.5",
                     "--results-dir", str(tmp_path), "--data-dir", str(data_dir)])
    assert code == 0
    folder = tmp_path / "parm-calibration-40qps"  # the rate is not the testbed's 250 q/s
    report = json.loads((folder / "parm-calibration.json").read_text())
    assert report["floor"]["shuffles"] == 0 and report["floor"]["n"] == 150
    assert [(r["distribution"], r["delay_ms"]) for r in report["rows"]] == [
        ("exponential", 5.0), ("exponential", 40.0), ("pareto (a = 2.5)", 5.0)]
    for row in report["rows"]:
        assert row["case"] == "equal-resources-3" and row["n"] == 150
        assert row["tail_ratio"] == pytest.approx(row["p999_ms"] / row["p50_ms"])
        testbed = json.loads((Path(row["folder"]) / "parm-testbed.json").read_text())
        # the admin API took every exponential switch (a refused setting counts an error)
        assert testbed["points"][0]["fault_errors"] == 0
        assert testbed["shuffle"]["delay_distribution"] == row["distribution"].split()[0]
        assert testbed["warmup"] == 10 == report["warmup"]  # passed on to every grid point
    assert Path(report["rows"][-1]["folder"]).name == "pareto-a2.5-5ms"
    md = (folder / "parm-calibration.md").read_text()
    assert "ParM's own latency is not measured here" in md and "no shuffles" in md
    assert (folder / "parm-calibration.png").stat().st_size > 0
    assert set(report["testbed_commands"]) == {d for d, v in report["picks"].items() if v}
    assert all("--rates 40 --shuffles 4" in c for c in report["testbed_commands"].values())
    assert all(("--shuffle-tail-index 2.5" in c) == (d == "pareto")
               for d, c in report["testbed_commands"].items())


def test_the_floor_verdict_says_when_the_machine_alone_is_past_the_target() -> None:
    room = cal.floor_verdict({"tail_ratio": 1.36}, 2.62)
    assert room.startswith("With no shuffles the baseline's p99.9 / p50 is 1.36, below")
    none = cal.floor_verdict({"tail_ratio": 2.9}, 2.62)
    assert "already 2.90" in none and "No slowdown can match ParM's baseline" in none
    assert "already 2.62" in cal.floor_verdict({"tail_ratio": 2.62}, 2.62)  # at counts too
