"""``python -m benchmarks.simulate``: its flags, the CPU fit, the transport measure, the
calibration and the validation rows (moved from tests/unit/core/test_simulate.py)."""

from __future__ import annotations

import pytest

from parityserve.core.faults import BurstSpec


def test_cli_and_bench_helpers() -> None:
    from benchmarks.simulate import _tail_models, build_parser, real_rows, sim_config

    args = build_parser().parse_args(["--quick", "--no-project"])
    assert args.quick and args.no_project and callable(args.func)
    doc = {"x": [{"mode": "parm", "p50_ms": 1.0, "p99_ms": 2.0, "rate": 10},
                 {"system": "raw", "p50_ms": 1.0, "p99_ms": 2.0}]}
    assert [r["mode"] for r in real_rows(doc)] == ["parm"]
    tail = {"models": {"mlp": {"points": [], "cases": [], "burst": {},
                               "inner": {"points": [], "cases": [], "burst": {}}}}}
    assert [sorted(t) for t in _tail_models(tail)] == [["burst", "cases", "inner", "points"]]
    assert list(_tail_models(doc)) == []
    burst = BurstSpec(every_ms=100, duration_ms=10, delay_ms=5)
    assert sim_config("none", 12, burst=burst).instances() == 12
    for mode in ("equal-resources", "replication", "parm", "berrut", "systematic-berrut"):
        assert sim_config(mode, 12, burst=burst).instances() == 18, mode
    assert sim_config("reactive", 12, burst=None, reactive_ms=5).reactive_timeout_s == 0.005


def test_cpu_fit_splits_background_from_the_marginal_cost_per_query() -> None:
    from benchmarks.simulate import fit_cpu_cost

    # 100 ms/s of background plus 0.5 ms per query, measured as ms per query at each rate
    rates = [100.0, 200.0, 400.0]
    fit = fit_cpu_cost(rates, [100 / r + 0.5 for r in rates])
    assert fit["background_ms_per_s"] == pytest.approx(100.0)
    assert fit["per_query_ms"] == pytest.approx(0.5)
    # noise that would make the background negative: the line goes through the origin
    noisy = fit_cpu_cost([100.0, 200.0], [0.4, 0.6])
    assert noisy["background_ms_per_s"] == 0.0
    assert noisy["per_query_ms"] == pytest.approx((100 * 40 + 200 * 120) / (100**2 + 200**2))
    # one load cannot split the two: all of it is charged per query
    assert fit_cpu_cost([150.0, 150.0], [1.0, 2.0]) == {"background_ms_per_s": 0.0,
                                                       "per_query_ms": 1.5}


@pytest.mark.parametrize(("rates", "costs"), [([], []), ([100.0], [1.0, 2.0]),
                                              ([0.0, 100.0], [1.0, 1.0]),
                                              ([100.0, 200.0], [1.0, float("nan")])])
def test_cpu_fit_refuses_what_it_cannot_fit(rates: list[float], costs: list[float]) -> None:
    from benchmarks.simulate import fit_cpu_cost

    with pytest.raises(ValueError):
        fit_cpu_cost(rates, costs)


def test_calibration_takes_transport_measured_and_leaves_the_rest_outside_any_queue(
    tmp_path,
) -> None:
    import json

    from benchmarks import simulate as bench_sim

    profile = {"model": "x", "samples_ms": {"1": [1.0]}, "cpu_samples_ms": {"1": [0.8]}}
    (tmp_path / "simulate-profile-mlp.json").write_text(json.dumps(profile))
    args = bench_sim.build_parser().parse_args(["--results-dir", str(tmp_path),
                                                "--host-cores", "2", "--max-batch", "1"])

    def real(rate: float, cpu_ms: float) -> dict[str, float]:
        return {"p50_ms": 5.0, "p99_ms": 9.0, "frontend_cpu_ms_per_query": cpu_ms,
                "worker_cpu_ms_per_query": 1.0, "client_cpu_ms_per_query": 0.3,
                "transport_ms_per_task": 0.25}

    calibs = {150.0: real(150.0, 100 / 150 + 0.4), 600.0: real(600.0, 100 / 600 + 0.4)}
    overhead, sims = bench_sim._calibrate(args, bench_sim.load_profile(
        tmp_path / "simulate-profile-mlp.json"), calibs, 150.0, 3000)
    assert overhead["rpc"] == 0.25  # measured, not the p50 residual
    assert overhead["query_cpu"] + overhead["task_cpu"] == pytest.approx(0.4)  # marginal only
    assert overhead["cpu_fit"]["background_ms_per_s"] == pytest.approx(100.0)
    assert overhead["worker_cpu"] == pytest.approx(0.2) and overhead["host_cores"] == 2.0
    assert overhead["client_cpu"] == 0.3
    assert overhead["frontend"] > 2.0  # client and HTTP: latency that holds no replica
    assert sims[150.0]["p50_ms"] == pytest.approx(5.0, rel=0.05)  # calibrated to the real p50
    assert set(sims) == {150.0, 600.0}


def test_run_spread_is_range_over_median() -> None:
    from benchmarks.simulate import run_spread

    assert run_spread([4.0, 5.0, 6.0]) == pytest.approx(0.4)
    assert run_spread([3.0]) is None  # one run has no spread
    assert run_spread(None) is None


def test_compare_takes_the_spread_from_a_points_runs() -> None:
    """A stored tail point keeps its per-run figures: the validation row shows their spread,
    which says whether the real run itself can be checked to 10%."""
    from benchmarks.simulate import _compare

    real = {"p50_ms": 4.0, "p99_ms": 30.0, "p50_ms_runs": [4.0, 4.4, 3.6],
            "p99_ms_runs": [30.0, 30.0, 30.0]}
    row = _compare("tail.json none", "none", 2, 200.0, real, {"p50_ms": 4.2, "p99_ms": 31.0})
    assert row["real_p50_spread"] == pytest.approx(0.2)
    assert row["real_p99_spread"] == 0.0
    assert row["within_10pct"]


def test_validation_names_when_stored_runs_were_measured() -> None:
    from benchmarks.simulate import _references_note

    note = _references_note({"references": {"tail-mlp.json": "2026-11-21T10:23:46+00:00",
                                            "old.json": None}})
    assert "`tail-mlp.json` on 2026-11-21T10:23:46+00:00" in note
    assert "`old.json` on an unknown date" in note
    assert _references_note({}) == ""
