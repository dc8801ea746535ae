"""``benchmarks.tail``'s pure helpers: cases, configs, the burst schedule, gaps, codec ops."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pytest

from benchmarks import tail
from benchmarks.tail import (
    Case,
    build_cases,
    burst_fraction,
    codec_verdicts,
    count_rebuilt,
    estimate_runtime_s,
    fault_transitions,
    gap_rows,
    headline,
    instance_names,
    matched_baseline,
    median_over_repeats,
    pair_burst_events,
    reference_decode,
    reference_encode,
    serving_config,
)
from parityserve.config import parse_config

ALL = list(tail.MODES)


def test_default_cases_are_resource_matched_at_three_instances() -> None:
    cases = build_cases(ALL, [2, 3, 4], deployed=2)
    assert [c.name for c in cases] == [
        "none", "equal-resources", "replication-2", "parm-k2", "parm-k3", "parm-k4",
        "berrut", "systematic-berrut"]
    counts = {c.name: c.instances for c in cases}
    assert counts.pop("none") == 2
    assert set(counts.values()) == {3}  # 2 deployed + 1 parity, or 3 plain replicas
    parm2 = next(c for c in cases if c.name == "parm-k2")
    assert (parm2.replicas, parm2.parity_instances) == (2, 1)
    assert matched_baseline(parm2, cases).name == "equal-resources"


def test_more_deployed_instances_give_one_baseline_per_parity_count() -> None:
    cases = build_cases(["equal-resources", "parm"], [2, 3, 4], deployed=4)
    by = {c.name: c for c in cases}
    assert by["parm-k2"].instances == 6 and by["parm-k4"].instances == 5
    assert {"equal-resources-5", "equal-resources-6"} <= set(by)
    assert matched_baseline(by["parm-k4"], cases).name == "equal-resources-5"
    assert matched_baseline(by["parm-k3"], cases).name == "equal-resources-6"


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown modes"):
        build_cases(["nonsense"], [2])


@pytest.mark.parametrize("case", build_cases(ALL, [2, 3, 4]), ids=lambda c: c.name)
def test_every_case_is_a_valid_deployment_with_its_instance_count(case: Case) -> None:
    config = parse_config(serving_config(case, "zoo:parm-mlp"))
    (model,) = config.models
    assert model.redundancy.mode == case.mode
    assert model.data_replicas() + model.parity_replicas() == case.instances
    assert config.server.cache_bytes == 0 and model.batching.max_batch_size == 1
    assert len(instance_names(case)) == case.instances


def test_instance_names_put_parity_replicas_last() -> None:
    parm = build_cases(["parm"], [2])[0]
    assert instance_names(parm) == ["0", "1", "parity0-0"]


def test_pair_bursts_are_seeded_poisson_pairs_of_distinct_slots() -> None:
    events = pair_burst_events(3, 100.0, 200.0, np.random.default_rng(1))
    again = pair_burst_events(3, 100.0, 200.0, np.random.default_rng(1))
    assert events == again
    assert 1700 < len(events) < 2300  # mean gap 100 ms over 200 s
    assert all(a < b < 3 for _, (a, b) in events)
    times = [t for t, _ in events]
    assert times == sorted(times) and times[-1] < 200.0
    pairs = {p for _, p in events}
    assert pairs == {(0, 1), (0, 2), (1, 2)}


def test_transitions_merge_overlaps_and_skip_missing_slots() -> None:
    events = [(0.0, (0, 1)), (0.05, (1, 2)), (1.0, (0, 2))]
    got = fault_transitions(events, 0.1, instances=2)  # slot 2 does not exist here
    assert [(slot, on) for _, slot, on in got] == [
        (0, True), (1, True), (0, False), (1, False), (0, True), (0, False)]
    assert [t for t, _, _ in got] == pytest.approx([0.0, 0.0, 0.1, 0.15, 1.0, 1.1])
    assert burst_fraction(got, 2.0) == pytest.approx(((0.1 + 0.1) + 0.15) / 2 / 2.0)
    assert burst_fraction(got, 0.5) == pytest.approx((0.1 + 0.15) / 2 / 0.5)  # cut at 0.5 s


def test_a_switch_off_and_on_at_the_same_time_ends_on() -> None:
    got = fault_transitions([(0.0, (0, 1)), (0.1, (0, 1))], 0.1, instances=2)
    assert got == [(0.0, 0, True), (0.0, 1, True), (0.2, 0, False), (0.2, 1, False)]


def _row(case: str, rate: float, p50: float, p999: float, **extra: float) -> dict:
    return {"case": case, "rate": rate, "p50_ms": p50, "p99_ms": p999, "p999_ms": p999,
            **extra}


def test_gap_and_its_reduction_against_the_matched_baseline() -> None:
    cases = build_cases(["none", "equal-resources", "parm"], [2])
    points = [_row("none", 10, 1.0, 50.0), _row("equal-resources", 10, 2.0, 37.0),
              _row("parm-k2", 10, 2.0, 12.0), _row("parm-k2", 20, 2.0, 12.0)]
    rows = {(r["case"], r["rate"]): r for r in gap_rows(points, cases)}
    parm = rows[("parm-k2", 10)]
    assert parm["gap_ms"] == 10.0 and parm["gap_reduction"] == pytest.approx(3.5)
    assert parm["p50_ratio"] == 1.0 and parm["baseline"] == "equal-resources"
    assert rows[("none", 10)]["gap_reduction"] is None  # 2 instances: no matched baseline
    assert rows[("parm-k2", 20)]["gap_reduction"] is None  # baseline not run at 20 q/s
    assert rows[("equal-resources", 10)]["gap_reduction"] == 1.0
    (line,) = headline(list(rows.values()))
    assert line.startswith("parm-k2: p99.9 - p50 gap 3.50x smaller than equal-resources")
    worse = gap_rows([points[1], _row("parm-k2", 10, 2.0, 72.0)], cases)
    assert headline(worse)[0].startswith("parm-k2: p99.9 - p50 gap 2.00x larger than")


def test_median_over_repeats_keeps_each_run() -> None:
    rows = [_row("x", 5, p50, 10 * p50, mean_ms=p50, throughput_qps=5.0, rebuilt_fraction=0.1,
                 errors=e, n=100) for p50, e in ((1.0, 0), (3.0, 2), (2.0, 1))]
    out = median_over_repeats(rows)
    assert out["p50_ms"] == 2.0 and out["p50_ms_runs"] == [1.0, 3.0, 2.0]
    assert out["p999_ms"] == 20.0 and out["errors"] == 3 and out["n"] == 300
    assert out["repeats"] == 3
    with pytest.raises(ValueError):
        median_over_repeats([])


def test_a_point_keeps_each_runs_own_overheads_by_its_number() -> None:
    # what sim_testbed replays each run with; run 0 was never saved, run 1 predates transports
    rows = [_row("x", 5, 1.0, 10.0, n=100, rep=rep, frontend_cpu_us=cpu,
                 transport_ms_per_task=transport)
            for rep, cpu, transport in ((1, 1000.0, None), (2, 3000.0, 1.4))]
    out = median_over_repeats(rows)
    assert out["frontend_cpu_us"] == 2000.0  # the median over runs, not the first run's
    assert out["transport_ms_per_task"] == 1.4 and out["transport_ms_per_task_runs"] == [1.4]
    assert [(r["rep"], r["frontend_cpu_us"], r["transport_ms_per_task"])
            for r in out["run_overheads"]] == [(1, 1000.0, None), (2, 3000.0, 1.4)]
    assert "rep" not in out


def test_an_unmeasured_steal_is_left_out_of_the_medians_not_read_as_zero() -> None:
    rows = [_row("x", 5, 1.0, 10.0, n=100, steal_share=share, clean_n=kept,
                 clean_p999_ms=p999) for share, kept, p999 in
            ((0.05, 90, 9.0), (None, None, None), (0.07, 80, 7.0))]
    out = median_over_repeats(rows)
    assert out["steal_share"] == pytest.approx(0.06) and out["steal_share_runs"] == [0.05, 0.07]
    assert out["clean_p999_ms"] == 8.0 and out["clean_n"] == 170
    bare = median_over_repeats([_row("x", 5, 1.0, 10.0, n=100)])
    assert "steal_share" not in bare and "clean_n" not in bare


def test_count_rebuilt_reads_the_flag() -> None:
    replies = [{"output": 1}, {"output": 2, "reconstructed": "parm-subtraction"}, None,
               {"reconstructed": "berrut"}]
    assert count_rebuilt(replies) == 2


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_reference_ops_are_parms_sum_and_subtraction(k: int) -> None:
    rng = np.random.default_rng(k)
    xs = [rng.standard_normal((2, 5)).astype(np.float32) for _ in range(k)]
    before = [x.copy() for x in xs]
    parity = reference_encode(xs)
    np.testing.assert_allclose(parity, np.sum(xs, axis=0), rtol=1e-5, atol=1e-6)
    for x, b in zip(xs, before, strict=True):
        np.testing.assert_array_equal(x, b)  # the inputs are not touched
    np.testing.assert_allclose(reference_decode(parity, xs[1:]), xs[0], rtol=1e-4, atol=1e-5)


def test_codec_bench_runs_small_and_checks_itself() -> None:
    report = tail.bench_codec(3, ks=(2,), image=(1, 4, 4), classes=10)
    (row,) = report["rows"]
    assert row["k"] == 2 and row["encode_parm_paper_us"] == 93.0
    assert all(row[f"{op}_us"] > 0 for op in ("encode_reference", "encode_ours",
                                                "encode_ours_total", "decode_reference",
                                                "decode_ours"))
    lines = codec_verdicts(report["rows"])
    assert len(lines) == 2 and lines[0].startswith("k=2 encode: ours")
    assert row["encode_reference_min_us"] <= row["encode_reference_us"]
    assert codec_verdicts(report["rows"], "min")[1].startswith("k=2 decode (best of): ours")


def test_quick_and_defaults_match_the_issue() -> None:
    p = argparse.ArgumentParser()
    tail.add_arguments(p)
    args = p.parse_args([])
    assert (args.queries, args.repeats) == (20_000, 3)
    assert args.models == "resnet20,mlp" and args.ks == "2,3,4"
    assert set(args.modes.split(",")) == set(tail.MODES)
    quick = p.parse_args(["--quick"])
    assert quick.quick


def test_runtime_estimate_adds_schedules_starts_and_overheads() -> None:
    assert estimate_runtime_s([10.0, 20.0, 10.0], 100, 2, startup_s=5.0, per_point_s=1.0) == (
        2 * 5.0 + (10.0 + 1.0) + (5.0 + 1.0) + (10.0 + 1.0))
    runs = 3 * 8  # repetitions x cases, a server start each
    full = estimate_runtime_s(list(tail.MODELS["mlp"]["rates"]) * runs, 20_000, runs)
    assert 1 * 3600 < full < 2 * 3600  # the MLP's full run: 1 h 20 min measured
    resnet = estimate_runtime_s(list(tail.MODELS["resnet20"]["rates"]) * runs, 20_000, runs)
    assert 4 * 3600 < resnet < 6 * 3600  # ResNet-20: about 5 hours


def test_interleaved_timing_reports_every_operation() -> None:
    got = tail.time_interleaved_us({"a": lambda: None, "b": lambda: sum(range(50))}, 3,
                                   target_s=0.0005)
    assert set(got) == {"a", "b"} and 0 < got["a"][0] < got["b"][0]
    assert all(best <= median for median, best in got.values())


def test_prepared_operations_time_their_run_only() -> None:
    prepared = tail.Prepared(lambda: time.sleep(0.003), lambda state: time.sleep(0.0002))
    got = tail.time_interleaved_us({"p": prepared}, 3, target_s=0.0005)
    assert 200 <= got["p"][1] <= got["p"][0] < 2000  # us: the 3 ms preparation is not counted


# ---- resuming a long run ---------------------------------------------------------------------


def _point_row(case: str, rate: float, p50: float = 1.0) -> dict[str, object]:
    return {"case": case, "mode": "none", "instances": 2, "rate": rate, "n": 10,
            "throughput_qps": 10.0, "p50_ms": p50, "p99_ms": 2 * p50, "p999_ms": 3 * p50,
            "errors": 0, "rebuilt_fraction": 0.0}


def test_checkpoint_keeps_points_of_the_same_settings_only(tmp_path: Path) -> None:
    path = tmp_path / "points.jsonl"
    first = tail.Checkpoint(path, {"queries": 100}, resume=False)
    first.put({**_point_row("none", 50.0), "latency_quantiles_ms": [1.0, 2.0]}, 1)
    first.put({**_point_row("none", 50.0), "latency_quantiles_ms": [3.0, 4.0]}, 0)
    first.put(_point_row("none", 100.0), 0)
    again = tail.Checkpoint(path, {"queries": 100}, resume=True)
    assert again.get("none", 50, 1) == {**_point_row("none", 50.0),
                                        "latency_quantiles_ms": [1.0, 2.0]}
    assert again.get("none", 100.0, 1) is None
    assert again.cdf("none", 50.0) == [3.0, 4.0]  # the first repetition that kept one
    assert again.cdf("none", 100.0) is None and again.cdf("other", 50.0) is None
    other = tail.Checkpoint(path, {"queries": 200}, resume=True)
    assert other.rows == {}
    fresh = tail.Checkpoint(path, {"queries": 100}, resume=False)
    assert fresh.rows == {} and not path.exists()
    assert (tmp_path / "points.jsonl.old").exists()  # kept aside, not deleted


def test_a_full_runs_file_is_a_committed_result_and_a_quick_ones_is_scratch(
    tmp_path: Path,
) -> None:
    full = tail.checkpoint_path(tmp_path, "mlp", {"queries": 20_000}, quick=False)
    other = tail.checkpoint_path(tmp_path, "mlp", {"queries": 2_000}, quick=False)
    quick = tail.checkpoint_path(tmp_path, "mlp", {"queries": 2_000}, quick=True)
    assert full.parent == tmp_path / "tail-runs" and quick.parent == tmp_path / ".work"
    assert full.name.startswith("tail-mlp-") and full.suffix == ".jsonl"
    assert full.name != other.name  # other settings never move this file aside
    ignore = (Path(__file__).parents[2] / ".gitignore").read_text()
    assert ".work/" in ignore and "tail-runs" not in ignore


def test_latency_quantiles_are_milliseconds_on_the_grid() -> None:
    lat = np.r_[np.linspace(0.001, 0.002, 1001), np.inf]
    q = tail.latency_quantiles_ms(lat)
    assert q is not None and len(q) == len(tail.CDF_PROBABILITIES)
    assert q[tail.CDF_PROBABILITIES.index(0.5)] == pytest.approx(1.5)
    assert q[-1] == pytest.approx(2.0) and q == sorted(q)
    assert tail.latency_quantiles_ms([]) is None


def test_the_cdf_defaults_to_the_middle_rate() -> None:
    assert tail.middle_rate([200.0, 50.0, 100.0]) == 100.0
    assert tail.middle_rate([10.0, 20.0]) == 20.0
    assert tail.middle_rate([5.0]) == 5.0


_SETTINGS = {"model": "mlp", "source": "zoo:parm-mlp", "queries": 50, "burst": {"every_ms": 1},
             "max_batch": 1, "seed": 0, "deployed": 2}


def _report_of(points: list[dict[str, object]], **changes: object) -> dict[str, object]:
    return {"model": "mlp", "source": "zoo:parm-mlp", "queries_per_point": 50,
            "burst": {"every_ms": 1}, "max_batch": 1, "deployed": 2, "points": points,
            **changes}


def test_recovered_runs_rebuild_each_repetition_from_a_report() -> None:
    runs = [_point_row("none", 10.0, p50=p) | {"errors": e, "p90_ms": 9.0 + p}
            for p, e in ((1.0, 2), (3.0, 1), (2.0, 0))]
    point = median_over_repeats(runs)
    rows = tail.recovered_runs(_report_of([point]), _SETTINGS, "old.json")
    assert [rep for rep, _ in rows] == [0, 1, 2]
    assert [row["p50_ms"] for _, row in rows] == [1.0, 3.0, 2.0]  # each run's own values
    assert [row["p999_ms"] for _, row in rows] == [3.0, 9.0, 6.0]
    assert rows[0][1]["p90_ms"] == 10.0 and "p90_ms" not in rows[1][1]  # kept for run 1 only
    assert [row["errors"] for _, row in rows] == [3, 0, 0]  # the point's total, kept whole
    assert [row["n"] for _, row in rows] == [10, 10, 10]
    assert all(row["recovered"] == "old.json" for _, row in rows)
    again = median_over_repeats([row for _, row in rows])
    for key in ("p50_ms", "p99_ms", "p999_ms", "throughput_qps", "errors", "n"):
        assert again[key] == point[key]  # the report's statistics come back unchanged
    assert "recovered" not in again


@pytest.mark.parametrize(("change", "message"), [
    ({"queries_per_point": 20_000}, "queries_per_point = 20000"),
    ({"seed": 3}, "seed = 3"),
    ({"burst": {"every_ms": 2}}, "burst"),
])
def test_runs_of_other_settings_are_not_recovered(change: dict[str, object],
                                                  message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tail.recovered_runs(_report_of([], **change), _SETTINGS, "old.json")


def test_a_report_whose_runs_disagree_with_its_repetitions_is_refused() -> None:
    point = median_over_repeats([_point_row("none", 10.0), _point_row("none", 10.0, 2.0)])
    point["p99_ms_runs"] = point["p99_ms_runs"][:1]
    with pytest.raises(ValueError, match="p99_ms has 1 runs for 2 repetitions"):
        tail.recovered_runs(_report_of([point]), _SETTINGS, "old.json")


class _NoServer:
    url = "http://unused"

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __enter__(self) -> _NoServer:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _fake_points(monkeypatch: pytest.MonkeyPatch, limit: list[int]
                 ) -> list[tuple[str, float, int]]:
    """Replace the servers and the load with instant points; raise KeyboardInterrupt (the
    session ending mid-run) once ``limit[0]`` points are measured."""
    measured: list[tuple[str, float, int]] = []

    def point(url: str, case: tail.Case, bodies: list[bytes], rate: float, rep: int,
              args: argparse.Namespace, burst: dict[str, object]
              ) -> tuple[dict[str, object], np.ndarray]:
        if len(measured) == limit[0]:
            raise KeyboardInterrupt
        measured.append((case.name, rate, rep))
        return (_point_row(case.name, rate, p50=float(rep + 1)),
                np.full(10, 0.001 * (rep + 1)))

    monkeypatch.setattr(tail, "_point", point)
    monkeypatch.setattr(tail, "ServerProcess", _NoServer)
    monkeypatch.setattr(tail, "_inputs", lambda name, data_dir: np.zeros((3, 784), np.float32))
    return measured


def _tail_args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    tail.add_arguments(p)
    return p.parse_args(["--modes", "none,equal-resources", "--rates", "10,20", "--repeats",
                         "2", "--queries", "50", "--results-dir", str(tmp_path), *extra])


def _interrupted_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, after: int
                     ) -> tuple[list[tuple[str, float, int]], list[int]]:
    """A run stopped after ``after`` points: what it measured, and its (mutable) limit."""
    limit = [after]
    measured = _fake_points(monkeypatch, limit)
    with pytest.raises(KeyboardInterrupt):
        tail._bench_model("mlp", _tail_args(tmp_path), tmp_path)
    return measured, limit


def test_an_interrupted_run_resumes_where_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    measured, limit = _interrupted_run(tmp_path, monkeypatch, 5)
    # one repetition of every case before the next, so a stopped run stays even
    assert measured == [("none", 10.0, 0), ("none", 20.0, 0), ("equal-resources", 10.0, 0),
                        ("equal-resources", 20.0, 0), ("none", 10.0, 1)]
    limit[0] = 100
    report = tail._bench_model("mlp", _tail_args(tmp_path, "--resume"), tmp_path)
    assert len(measured) == 8  # 2 cases x 2 rates x 2 repetitions, once each
    assert len(set(measured)) == 8
    assert [(pt["case"], pt["rate"], pt["repeats"]) for pt in report["points"]] == [
        ("none", 10.0, 2), ("none", 20.0, 2), ("equal-resources", 10.0, 2),
        ("equal-resources", 20.0, 2)]
    assert report["points"][0]["p50_ms"] == 1.5  # the median of both repetitions
    assert report["missing"] == []
    assert report["load_s"] == pytest.approx(8 * 10 / 10.0)  # n / throughput per run
    assert report["cdf_rate"] == 20.0 and report["cdf_missing"] == []
    assert set(report["_cdfs"]["none"]) == {1.0}  # the first repetition's, in ms
    assert report["recovered_runs"] == 0
    assert "latency_quantiles_ms" not in report["points"][0]  # a run's, not the point's


def test_report_only_writes_a_partial_report_without_measuring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    measured, limit = _interrupted_run(tmp_path, monkeypatch, 3)
    limit[0] = 0  # any measurement now fails the test
    args = _tail_args(tmp_path, "--report-only")
    report = tail._bench_model("mlp", args, tmp_path)
    assert len(measured) == 3
    assert [(pt["case"], pt["rate"], pt["repeats"]) for pt in report["points"]] == [
        ("none", 10.0, 1), ("none", 20.0, 1), ("equal-resources", 10.0, 1)]
    assert report["missing"] == [
        {"case": "none", "rate": 10.0, "repeats": 1}, {"case": "none", "rate": 20.0, "repeats": 1},
        {"case": "equal-resources", "rate": 10.0, "repeats": 1},
        {"case": "equal-resources", "rate": 20.0, "repeats": 0}]
    tail._write_load(report, args)
    md = (tmp_path / "tail-mlp.md").read_text()
    assert "**Partial run**: 4 of 4 points have fewer than 2 repetitions" in md
    assert "equal-resources at 20 q/s: 0 of 2" in md
    assert "**Not a result yet**" in md.split("## Headline")[1]
    assert json.loads((tmp_path / "tail-mlp.json").read_text())["missing"][3]["repeats"] == 0


def test_report_only_without_saved_points_says_what_to_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_points(monkeypatch, [0])
    with pytest.raises(SystemExit, match="run the measurement first"):
        tail._bench_model("mlp", _tail_args(tmp_path, "--report-only"), tmp_path)


def test_a_finished_report_carries_no_partial_note() -> None:
    finished = {"missing": [], "cases": [], "rates": [], "repeats": 3}
    assert tail._partial_note(finished) == "" and tail._partial_warning(finished) == ""


def test_lost_runs_are_recovered_from_the_report_and_only_the_rest_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fresh clone lacks the run file: ``--recover-from`` seeds it from the committed
    report, the run measures only what the report lacked, and the report says so."""
    _interrupted_run(tmp_path, monkeypatch, 5)
    args = _tail_args(tmp_path, "--report-only")
    tail._write_load(tail._bench_model("mlp", args, tmp_path), args)
    for lost in (tmp_path / "tail-runs").iterdir():
        lost.unlink()
    measured = _fake_points(monkeypatch, [100])
    args = _tail_args(tmp_path, "--recover-from", str(tmp_path / "tail-mlp.json"))
    report = tail._bench_model("mlp", args, tmp_path)
    assert sorted(measured) == [("equal-resources", 10.0, 1), ("equal-resources", 20.0, 1),
                                ("none", 20.0, 1)]
    assert report["missing"] == [] and report["recovered_runs"] == 5
    # at the CDF rate (20 q/s) the first repetitions were recovered without latencies, so the
    # CDF comes from the second, measured now
    assert report["cdf_missing"] == [] and set(report["_cdfs"]["none"]) == {2.0}
    tail._write_load(report, args)
    md = (tmp_path / "tail-mlp.md").read_text()
    assert "5 of 8 runs were recovered from `tail-mlp.json`" in md


def test_recovering_from_a_missing_report_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_points(monkeypatch, [0])
    args = _tail_args(tmp_path, "--recover-from", str(tmp_path / "nothing.json"))
    with pytest.raises(SystemExit, match="cannot recover runs from .*nothing.json"):
        tail._bench_model("mlp", args, tmp_path)
