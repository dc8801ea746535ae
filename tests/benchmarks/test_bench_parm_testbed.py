"""``benchmarks.parm_testbed``: ParM section 6 on emulated accelerators. Its pure helpers,
then one tiny real run end to end (2 deployed instances, 150 queries)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks import parm_testbed as tb
from benchmarks.tail import gap_rows
from parityserve.config import parse_config


def _counts(deployed: int = 12, ks: tuple[int, ...] = (2, 4)) -> dict[str, int]:
    return {c.name: c.instances for c in tb.testbed_cases(tb.MODES, ks, deployed, 60.0)}


def test_parms_gpu_cluster_is_resource_matched_at_12_plus_6_and_12_plus_3() -> None:
    assert _counts() == {
        "none": 12, "equal-resources-15": 15, "equal-resources-18": 18, "replication-2": 18,
        "reactive": 18, "parm-k2": 18, "parm-k4": 15, "berrut": 18, "systematic-berrut": 18}
    assert _counts(24, (2,))["parm-k2"] == 36  # the CPU cluster: 24 + 12


@pytest.mark.parametrize("case", tb.testbed_cases(tb.MODES, (2, 4), 12, 60.0),
                         ids=lambda c: c.name)
def test_every_case_is_a_valid_emulated_deployment(case: tb.Case) -> None:
    config = parse_config(tb.testbed_config(case, "parm-gpu-resnet18", 3))
    (model,) = config.models
    assert model.worker_processes() == case.instances
    assert model.emulation is not None and model.emulation.seed == 3
    assert model.emulation.service_profile().name == "parm-gpu-resnet18"
    assert model.batching.max_batch_size == 1 and config.server.cache_bytes == 0
    if case.mode == "reactive":
        assert model.redundancy.timeout_ms == 60.0
    if case.mode in ("berrut", "systematic-berrut"):
        assert (model.redundancy.K, model.redundancy.S) == (12, 6)


def test_bad_case_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown modes"):
        tb.testbed_cases(["hedge"], (2,), 12, 60.0)
    with pytest.raises(ValueError, match="k >= 2"):
        tb.testbed_cases(["parm"], (1,), 12, 60.0)


def test_shuffles_keep_the_lanes_busy_with_parms_sizes_between_distinct_pairs() -> None:
    events = tb.shuffle_events(18, 4, 60.0, 1.5, np.random.default_rng(0))
    durations = [d for _, d, _ in events]
    # 128-256 MB at 1.5 Gbps: 0.68-1.37 s each
    assert min(durations) >= 128 * 8 / 1000 / 1.5 and max(durations) <= 256 * 8 / 1000 / 1.5
    assert all(a != b and 0 <= a < b < 18 for _, _, (a, b) in events)
    # 4 lanes back to back: at every moment 4 shuffles run (so the busy time is 4 x horizon)
    busy = sum(min(start + d, 60.0) - start for start, d, _ in events if start < 60.0)
    assert busy == pytest.approx(4 * 60.0)
    assert tb.shuffle_events(18, 4, 60.0, 1.5, np.random.default_rng(0)) == events
    with pytest.raises(ValueError, match="2\\+ slots"):
        tb.shuffle_events(1, 4, 1.0, 1.5, np.random.default_rng(0))


def test_shuffle_transitions_merge_overlaps_and_skip_slots_a_deployment_lacks() -> None:
    events = [(0.0, 1.0, (0, 5)), (0.5, 1.0, (0, 1)), (3.0, 0.5, (1, 15))]
    assert tb.shuffle_transitions(events, 12) == [
        (0.0, 0, True), (0.0, 5, True), (0.5, 1, True), (1.0, 5, False), (1.5, 0, False),
        (1.5, 1, False), (3.0, 1, True), (3.5, 1, False)]
    assert all(slot < 4 for _, slot, _ in tb.shuffle_transitions(events, 4))


def _point(case: str, instances: int, rate: float, p50: float, p999: float,
           cpu: float) -> dict[str, object]:
    return {"case": case, "mode": case.split("-")[0], "instances": instances, "rate": rate,
            "p50_ms": p50, "p99_ms": p999, "p999_ms": p999, "frontend_cpu_us": cpu}


def test_costs_are_extra_instances_and_cpu_per_query_beside_none() -> None:
    points = [_point("none", 12, 100.0, 30, 200, 400.0),
              _point("parm-k2", 18, 100.0, 31, 60, 600.0),
              _point("parm-k2", 18, 200.0, 31, 60, 650.0)]
    costs = tb.cost_rows(points, 12)
    assert costs[1] == {"case": "parm-k2", "rate": 100.0, "extra_instances": 6,
                        "extra_fraction": 0.5, "frontend_cpu_us": 600.0, "cpu_vs_none": 1.5}
    assert costs[2]["cpu_vs_none"] is None  # no `none` at 200 q/s


def test_the_target_line_says_met_or_missed_from_parm_k2() -> None:
    cases = tb.testbed_cases(["equal-resources", "parm"], (2,), 12, 60.0)
    er, parm = (_point("equal-resources-18", 18, 100.0, 30, 240, 500.0),
                _point("parm-k2", 18, 100.0, 31, 91, 600.0))
    assert "**met** (best 3.50x" in tb.target_line(gap_rows([er, parm], cases), 12)
    parm["p999_ms"] = 131
    assert "**missed** (best 2.10x" in tb.target_line(gap_rows([er, parm], cases), 12)
    assert "not run" in tb.target_line([], 12)


def test_the_steal_free_gaps_are_a_labelled_diagnostic_beside_the_target() -> None:
    cases = tb.testbed_cases(["equal-resources", "parm"], (2,), 12, 60.0)
    er, parm = (_point("equal-resources-18", 18, 150.0, 35, 93, 500.0),
                _point("parm-k2", 18, 150.0, 35, 58, 600.0))
    er.update(clean_p50_ms=34.0, clean_p99_ms=50.0, clean_p999_ms=80.0, clean_share=0.8)
    parm.update(clean_p50_ms=34.0, clean_p99_ms=40.0, clean_p999_ms=46.0, clean_share=0.82)
    rows = tb.steal_gap_rows([er, parm], cases)
    assert rows[1]["gap_reduction"] == pytest.approx(46 / 12)
    line = tb.steal_line(rows)
    assert line is not None and line.startswith("Diagnostic, not the target")
    assert "(82% of ParM k = 2's)" in line and "3.83x smaller" in line
    # steal not measured (None, as on a host without the counter): no rows, no line
    er["clean_p999_ms"] = parm["clean_p999_ms"] = None
    assert tb.steal_gap_rows([er, parm], cases) == [] and tb.steal_line([]) is None


def test_the_full_run_fits_the_issues_45_minutes_and_a_second_rate_does_not() -> None:
    cases = len(tb.testbed_cases(tb.MODES, (2, 4), 12, 60.0))
    full = tb.plan_s(cases, tb.RATES, 20_000, 3)
    assert cases == 9 and full / 60 <= tb.BUDGET_MIN
    # 540,000 queries at 250 q/s is 36 min of load; 9 server starts and 27 points' drains
    assert full == pytest.approx(9 * 20 + 27 * (20_000 / 250 + 3))
    assert "within the 45-min budget" in tb.budget_line(full)
    two = tb.plan_s(cases, (175.0, 250.0), 20_000, 3)
    assert "over the 45-min budget by 48 min" in tb.budget_line(two)


def test_repetitions_are_interleaved_when_that_fits_the_budget() -> None:
    two = tb.testbed_cases(["equal-resources", "parm"], (2,), 12, 60.0)
    assert tb.run_order("auto", 2, (150.0,), 20_000, 3) == "interleaved"  # +4 starts: fits
    nine = len(tb.testbed_cases(tb.MODES, (2, 4), 12, 60.0))
    assert tb.run_order("auto", nine, tb.RATES, 20_000, 3) == "grouped"  # 27 starts do not
    assert tb.run_order("interleaved", nine, tb.RATES, 20_000, 3) == "interleaved"
    assert tb.plan_s(2, (150.0,), 20_000, 3, interleaved=True) \
        == pytest.approx(tb.plan_s(2, (150.0,), 20_000, 3) + 4 * 20)
    plan = [(case.name, reps) for case, reps in tb.measure_plan(two, 3, "interleaved")]
    assert plan == [("equal-resources-18", [0]), ("parm-k2", [0]), ("parm-k2", [1]),
                    ("equal-resources-18", [1]), ("equal-resources-18", [2]), ("parm-k2", [2])]
    grouped = [(case.name, reps) for case, reps in tb.measure_plan(two, 3, "grouped")]
    assert grouped == [("equal-resources-18", [0, 1, 2]), ("parm-k2", [0, 1, 2])]


def test_a_resumed_run_estimates_only_what_is_left(tmp_path: Path) -> None:
    two = tb.testbed_cases(["equal-resources", "parm"], (2,), 12, 60.0)
    saved = tb.Checkpoint(tmp_path / "runs.jsonl", {"settings": 1}, resume=False)
    full = tb.remaining_s(two, (150.0,), saved, 3, "interleaved", 20_000)
    assert full == pytest.approx(tb.plan_s(2, (150.0,), 20_000, 3, interleaved=True))
    for rep in (0, 1):
        saved.put({"case": "parm-k2", "rate": 150.0}, rep)
    left = tb.remaining_s(two, (150.0,), saved, 3, "interleaved", 20_000)
    assert left == pytest.approx(full - 2 * (20 + 20_000 / 150 + 3))


def test_berrut_cases_carry_the_group_wait_only_when_asked() -> None:
    plain = {c.name: c for c in tb.testbed_cases(tb.MODES, (2,), 12, 60.0)}
    waited = {c.name: c for c in tb.testbed_cases(tb.MODES, (2,), 12, 60.0,
                                                  berrut_group_wait_ms=20.0)}
    for name in ("berrut", "systematic-berrut"):
        assert "group_wait_ms" not in plain[name].redundancy
        assert waited[name].redundancy["group_wait_ms"] == 20.0
        model = parse_config(tb.testbed_config(waited[name], "parm-gpu-resnet18", 0)).models[0]
        assert model.redundancy.group_wait_ms == 20.0
    assert waited["none"] == plain["none"] and waited["parm-k2"] == plain["parm-k2"]


@pytest.mark.timeout(300)
def test_a_tiny_run_writes_labelled_results(tmp_path: Path, data_dir: Path) -> None:
    # 10 warm-up queries, not 100: each is ~35 ms one after another, a second per server
    code = tb.main(["--deployed", "2", "--modes", "none,equal-resources,parm", "--ks", "2",
                    "--rates", "40", "--queries", "80", "--repeats", "1", "--warmup", "10",
                    "--shuffle-delay-ms", "20", "--results-dir", str(tmp_path),
                    "--data-dir", str(data_dir)])
    assert code == 0
    report = json.loads((tmp_path / "parm-testbed.json").read_text())
    assert report["label"].startswith("EMULATED accelerator 'parm-gpu-resnet18'")
    assert report["warmup"] == 10 and report["queries_per_point"] == 80
    assert [p["case"] for p in report["points"]] == ["none", "equal-resources-3", "parm-k2"]
    for p in report["points"]:
        assert p["n"] == 80 and p["errors"] == 0 and p["fault_errors"] == 0
        assert p["p50_ms"] >= 28.0  # the profile's 30 ms service time was held
        assert p["frontend_cpu_us"] > 0
        # the per-task split the simulator replays: the worker's hold and the transport
        assert p["worker_hold_ms"] >= 28.0 and 0.0 < p["transport_ms_per_task"] < 28.0
    assert report["points"][2]["rebuilt_fraction"] >= 0.0
    for p in report["points"]:  # this VM has a steal counter: every point says what it lost
        assert 0.0 <= p["steal_share"] <= 1.0 and p["steal_stalls"] >= 0
        assert 0 <= p["clean_n"] <= p["n"]
    md = (tmp_path / "parm-testbed.md").read_text()
    for heading in ("# EMULATED accelerators", "## Latency (EMULATED accelerators)",
                    "## Hypervisor steal: what the host took",
                    "## Cost (EMULATED accelerators)", "## Headline (EMULATED accelerators)"):
        assert heading in md
    assert (tmp_path / "parm-testbed-latency.png").stat().st_size > 0
    assert list((tmp_path / "parm-testbed-runs").glob("parm-testbed-*.jsonl"))


def test_the_report_says_which_slowdown_a_shuffle_applies() -> None:
    # the committed runs' shuffle settings name no distribution: they were constant
    assert tb.shuffle_delay_words({"delay_ms": 50.0}) == "50 ms"
    words = tb.shuffle_delay_words({"delay_ms": 8.0, "delay_distribution": "exponential"})
    assert words.startswith("an exponential wait with mean 8 ms, drawn per batch")
    heavy = {"delay_ms": 6.0, "delay_distribution": "pareto", "tail_index": 2.5}
    assert "Lomax, tail index 2.5" in tb.shuffle_delay_words(heavy)
    assert tb.shuffle_faults(heavy) == {"delay_ms": 6.0, "delay_distribution": "pareto",
                                        "delay_tail_index": 2.5}
    assert tb.shuffle_faults({"delay_ms": 50.0}) == {"delay_ms": 50.0,
                                                     "delay_distribution": "constant"}


def test_a_pareto_tail_index_must_leave_a_finite_mean(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="tail-index must be > 1"):
        tb.run(tb.build_parser().parse_args(
            ["--report-only", "--modes", "none", "--results-dir", str(tmp_path),
             "--shuffle-delay-distribution", "pareto", "--shuffle-tail-index", "1"]))


def test_the_distribution_joins_the_fingerprint_only_when_not_constant(tmp_path: Path) -> None:
    # A constant run keeps the committed runs' settings (and so their run file); an
    # exponential one gets its own. --report-only measures nothing and finds no runs.
    def run_file(*extra: str) -> str:
        with pytest.raises(SystemExit, match="no saved runs") as info:
            tb.run(tb.build_parser().parse_args(
                ["--report-only", "--modes", "none", "--results-dir", str(tmp_path), *extra]))
        return str(info.value)

    constant = run_file()
    assert constant == run_file("--shuffle-delay-distribution", "constant")
    assert constant != run_file("--shuffle-delay-distribution", "exponential")
    pareto = run_file("--shuffle-delay-distribution", "pareto")
    assert pareto not in (constant, run_file("--shuffle-delay-distribution", "exponential"))
    assert pareto != run_file("--shuffle-delay-distribution", "pareto",
                              "--shuffle-tail-index", "3")
    # the tail index only means something to pareto: it leaves the others' files alone
    assert constant == run_file("--shuffle-tail-index", "3")
    # the committed runs' 100 warm-up queries keep their file; another count gets its own
    assert constant == run_file("--warmup", "100")
    assert constant != run_file("--warmup", "10")


def test_a_negative_warmup_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--warmup must be >= 0"):
        tb.run(tb.build_parser().parse_args(
            ["--report-only", "--modes", "none", "--results-dir", str(tmp_path),
             "--warmup", "-1"]))


def test_auto_order_goes_on_with_the_saved_run_when_resuming() -> None:
    only_interleaved = {"interleaved"}.__contains__
    assert tb.resumed_order("auto", True, only_interleaved) == "interleaved"
    assert tb.resumed_order("auto", True, {"grouped"}.__contains__) == "grouped"
    assert tb.resumed_order("auto", True, {"grouped", "interleaved"}.__contains__) \
        == "interleaved"
    assert tb.resumed_order("auto", True, set().__contains__) is None  # nothing saved yet
    assert tb.resumed_order("auto", False, only_interleaved) is None  # a fresh run
    assert tb.resumed_order("grouped", True, only_interleaved) is None  # named: obeyed


def test_a_report_of_more_cases_finds_the_interleaved_run_without_naming_it(
        tmp_path: Path) -> None:
    # The committed 5-shuffle run was interleaved; its nine cases no longer fit the budget
    # interleaved, so ``auto`` alone would look for a grouped run file and find none.
    source = Path(__file__).parents[2] / (
        "benchmarks/results/parm-testbed-calibrated-pareto-150qps-5-shuffles")
    runs = tmp_path / "parm-testbed-runs"
    runs.mkdir()
    for saved in (source / "parm-testbed-runs").glob("*.jsonl"):
        (runs / saved.name).write_bytes(saved.read_bytes())
    code = tb.main(["--report-only", "--modes", ",".join(tb.MODES), "--ks", "2,4",
                    "--rates", "150", "--shuffles", "5", "--shuffle-delay-distribution",
                    "pareto", "--shuffle-delay-ms", "3.5", "--shuffle-tail-index", "2",
                    "--results-dir", str(tmp_path)])
    assert code == 0
    report = json.loads((tmp_path / "parm-testbed.json").read_text())
    assert report["order"] == "interleaved"
    assert len(report["points"]) == 9 and not report["missing"]


def test_a_rewritten_report_names_the_commands_that_measured_its_runs(monkeypatch) -> None:
    import sys

    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "benchmarks.parm_testbed",
                                           "--report-only"])
    measured = "python -m benchmarks.parm_testbed --rates 100"
    assert "measured by:\n\n    " + measured in tb._measured_by({"measured_by": [measured]})
    # the report's own command measured every run, or no run said: nothing to add
    assert tb._measured_by({"measured_by": [
        "python -m benchmarks.parm_testbed --report-only"]}) == ""
    assert tb._measured_by({"measured_by": []}) == ""
