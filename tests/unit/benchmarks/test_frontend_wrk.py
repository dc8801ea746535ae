"""The wrk harness (benchmarks/frontend_wrk.py): what it makes of wrk's numbers, how it
summarises rounds into ratios against the bare app and LitServe, and the MLP target."""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
import pytest

from benchmarks import frontend_cases, frontend_wrk, frontend_wrk_report
from parityserve.errors import DataError


def test_rates_count_only_answered_requests() -> None:
    rates = frontend_wrk._rates({"requests": 1000, "duration_us": 2_000_000,
                                 "socket_errors": 10, "status_errors": 90, "p50_us": 1500,
                                 "p99_us": 4000, "p999_us": 9000})
    assert rates["rps"] == 450 and rates["errors"] == 100
    assert (rates["p50_ms"], rates["p99_ms"], rates["p999_ms"]) == (1.5, 4.0, 9.0)


def _point(rps: float, p50: float) -> dict:
    return {"rps": rps, "requests": 1000, "p50_ms": 1.0, "p99_ms": 2.0, "p999_ms": 3.0,
            "p50_1conn_ms": p50, "frontend_cpu_us_per_request": 100.0,
            "worker_cpu_us_per_request": 5.0}


def test_summary_takes_medians_and_ratios_to_bare_and_litserve() -> None:
    points = {"0/noop/bare/clipper-json/distinct": _point(4000, 0.3),
              "1/noop/bare/clipper-json/distinct": _point(4400, 0.2),
              "0/noop/litserve/clipper-json/distinct": _point(800, 1.0),
              "0/noop/parityserve/clipper-json/distinct": _point(3000, 0.5),
              "1/noop/parityserve/clipper-json/distinct": _point(2600, 0.6),
              "0/noop/bare/v2-binary/distinct": _point(5000, 0.2),
              "0/noop/parityserve/grpc/distinct": _point(2500, 0.4)}
    rows = {(r["system"], r["route"]): r for r in frontend_wrk.summarise(points)}
    ours = rows["parityserve", "clipper-json"]
    assert ours["rps"] == 2800 and ours["rps_rounds"] == [3000, 2600]
    # each round's pair: 3000/4000 and 2600/4400; LitServe was measured in round 0 only
    assert ours["vs_bare"] == pytest.approx(statistics.median([3000 / 4000, 2600 / 4400]))
    assert ours["vs_litserve"] == pytest.approx(3000 / 800)
    assert ours["p50_over_bare_ms"] == pytest.approx(0.55 - 0.25)
    assert rows["parityserve", "grpc"]["vs_bare"] == pytest.approx(0.5)  # vs V2 binary


def test_stolen_cpu_is_a_median_where_measured_and_a_dash_where_not() -> None:
    points = {"0/noop/bare/v2-binary/distinct": {**_point(10000, 0.1), "steal_share": 0.01},
              "1/noop/bare/v2-binary/distinct": {**_point(9000, 0.1), "steal_share": 0.05},
              "2/noop/bare/v2-binary/distinct": {**_point(9500, 0.1), "steal_share": None},
              "0/noop/parityserve/v2-binary/distinct": _point(6000, 0.3)}  # saved before
    rows = {r["system"]: r for r in frontend_wrk.summarise(points)}
    assert rows["bare"]["steal_share"] == pytest.approx(0.03)
    assert rows["parityserve"]["steal_share"] is None
    cells = {name: frontend_wrk_report._table_row(row).rstrip(" |").split(" | ")[-2]
             for name, row in rows.items()}
    assert cells == {"bare": "3.0%", "parityserve": "–"}


def test_ratios_pair_the_rounds_so_a_slow_spell_does_not_skew_them() -> None:
    """Round 1 ran in a slow spell of the VM for both systems: the ratio of the medians
    (2000/6000) would mix a slow round of one with a fast round of the other."""
    rps = {"bare": [10000, 5000, 6000], "parityserve": [6000, 3000, 2000]}
    points = {f"{r}/noop/{system}/v2-binary/distinct": {**_point(v, 0.2),
                                                      "bystander_share": 0.01 * (r + 1)}
              for system, values in rps.items() for r, v in enumerate(values)}
    rows = {r["system"]: r for r in frontend_wrk.summarise(points)}
    assert rows["parityserve"]["vs_bare"] == pytest.approx(0.6)  # median of 0.6, 0.6, 0.33
    assert rows["parityserve"]["bystander_share"] == pytest.approx(0.02)
    assert frontend_wrk_report._table_row(rows["parityserve"]).endswith("| 2.0% |")


def test_a_round_measures_each_point_on_every_system_back_to_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """All servers up at once; per point every system in turn, the order alternating; the
    idle servers are passed as bystanders; a resumed round measures only what is missing."""
    started, stopped, measured = [], [], []

    class Proc:
        def __init__(self, pid: int) -> None:
            self.pid = pid

    def start(system: str, port: int, case: object, work: Path) -> tuple[Proc, int]:
        started.append(system)
        return Proc(100 + len(started)), 0

    def http_point(pid: int, url: str, spec: dict, lua: Path, args: object, batches: object,
                   others: list[int]) -> dict:
        measured.append((url.split("/", 3)[3], pid, sorted(others)))
        return _point(1000, 0.2)

    monkeypatch.setattr(frontend_wrk, "_start", start)
    monkeypatch.setattr(frontend_wrk, "_stop", lambda proc: stopped.append(proc.pid))
    monkeypatch.setattr(frontend_wrk, "_http_point", http_point)
    case = frontend_cases.Case("noop", np.zeros((2, 784), np.float32), ("distinct",),
                               None, "inline")
    bodies = {f"{r}/distinct": {} for r in ("clipper-json", "v2-json", "v2-binary")}
    state: dict = {"points": {"0/noop/bare/v2-json/distinct": _point(1, 1)}}
    where = frontend_wrk._Where(state, tmp_path / "s.json", tmp_path / "b.lua", bodies,
                                tmp_path)
    args = frontend_wrk.build_parser().parse_args(["--systems", "bare,floor"])
    frontend_wrk._measure_round(["bare", "floor"], 0, case, args, where)
    assert started == ["bare", "floor"] and sorted(stopped) == [101, 102]
    paths = [(path, pid) for path, pid, _ in measured]
    assert paths == [("app/predict", 101), ("app/predict", 102),  # clipper-json
                     ("v2/models/noop/infer", 102),  # v2-json: bare's was saved before
                     ("v2/models/noop/infer", 101), ("v2/models/noop/infer", 102)]  # binary
    assert all(others == [203 - pid] for _, pid, others in measured)
    assert len(state["points"]) == 6
    started.clear()
    frontend_wrk._measure_round(["bare", "floor"], 0, case, args, where)
    assert started == []  # the whole round is saved: no server starts


def test_litserve_runs_alone_for_its_own_points(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle with batching on, LitServe polls its queue: it is started for each of its
    points and stopped after, and is never a bystander of another system's run."""
    events: list[str] = []

    class Proc:
        def __init__(self, system: str) -> None:
            self.system, self.pid = system, {"bare": 1, "litserve": 2}[system]

    def start(system: str, port: int, case: object, work: Path) -> tuple[Proc, int]:
        events.append(f"start {system}")
        return Proc(system), 0

    def http_point(pid: int, url: str, spec: dict, lua: Path, args: object, batches: object,
                   others: list[int]) -> dict:
        events.append(f"measure {pid} beside {others}")
        return _point(1000, 0.2)

    monkeypatch.setattr(frontend_wrk, "_start", start)
    monkeypatch.setattr(frontend_wrk, "_stop", lambda proc: events.append(f"stop {proc.system}"))
    monkeypatch.setattr(frontend_wrk, "_http_point", http_point)
    case = frontend_cases.Case("noop", np.zeros((2, 784), np.float32), ("distinct",),
                               None, "inline")
    bodies = {f"{r}/distinct": {} for r in ("clipper-json", "v2-json", "v2-binary")}
    state: dict = {"points": {f"0/noop/bare/{r}/distinct": _point(1, 1)
                              for r in ("v2-json", "v2-binary")}}
    where = frontend_wrk._Where(state, tmp_path / "s.json", tmp_path / "b.lua", bodies,
                                tmp_path)
    args = frontend_wrk.build_parser().parse_args(["--systems", "bare,litserve"])
    frontend_wrk._measure_round(["bare", "litserve"], 0, case, args, where)
    assert events == ["start bare", "measure 1 beside []", "start litserve",
                      "measure 2 beside [1]", "stop litserve", "stop bare"]


def test_each_model_is_compared_with_its_own_baseline_and_the_target_judged() -> None:
    points = {"0/noop/bare/v2-binary/distinct": _point(10000, 0.1),
              "0/mlp/bare/v2-binary/distinct": _point(5000, 0.2),
              "0/mlp/parityserve/v2-binary/distinct": _point(4600, 0.3),
              "0/mlp/bare/clipper-json/distinct": _point(4000, 0.2),
              "0/mlp/parityserve/clipper-json/distinct": _point(3000, 0.3)}
    rows = frontend_wrk.summarise(points)
    ours = {r["route"]: r for r in rows if r["model"] == "mlp" and r["system"] == "parityserve"}
    assert ours["v2-binary"]["vs_bare"] == pytest.approx(0.92)
    verdicts = frontend_wrk_report.verdicts(rows)
    assert len(verdicts) == 2
    assert "clipper-json" in verdicts[0] and "75%" in verdicts[0] and "missed" in verdicts[0]
    assert "v2-binary" in verdicts[1] and "92%" in verdicts[1] and "met" in verdicts[1]
    state = {"command": "python -m benchmarks.frontend_wrk", "summary": rows,
             "mlp": {"bodies": 2000, "max_batch_size": 64, "bare_batch_run": "inline",
                     "litserve_batch_timeout_s": 0.001}}
    text = frontend_wrk_report.markdown(state, {"cpu_model": "x", "cpu_count": 2,
                                                "python": "3", "date": "d"})
    assert "## MNIST MLP" in text and "target >= 90%" in text and "**missed**" in text


def test_saved_points_from_before_models_are_the_noop_models() -> None:
    moved = frontend_wrk._with_model({"0/bare/v2-json/fixed": {"rps": 1},
                                      "1/mlp/bare/v2-binary/distinct": {"rps": 2}})
    assert moved == {"0/noop/bare/v2-json/fixed": {"rps": 1},
                     "1/mlp/bare/v2-binary/distinct": {"rps": 2}}


def test_the_recorded_command_is_relative_to_the_project_root(tmp_path: Path) -> None:
    args = frontend_wrk.build_parser().parse_args(
        ["--models", "mlp", "--quick", "--results-dir", str(tmp_path)])
    data = frontend_cases.ROOT.parent / "shared" / "data"
    args.data_dir = data
    command = frontend_wrk._command(args)
    assert command.startswith("python -m benchmarks.frontend_wrk --models mlp --quick")
    assert "--data-dir ../shared/data" in command
    assert "/" not in command.split("--results-dir ")[1][:1]  # not an absolute path


def test_the_mlp_case_says_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="t10k-images-idx3-ubyte.gz.*parm-mnist-base-mlp.npz"):
        frontend_cases.load_case("mlp", tmp_path)
    with pytest.raises(DataError, match="use noop or mlp"):
        frontend_cases.load_case("resnet", tmp_path)


def test_the_mlp_deployment_batches_like_the_baselines_with_the_cache_off() -> None:
    case = frontend_cases.Case("mlp", np.zeros((2, 784), np.float32), ("distinct",),
                               Path("/w.npz"), "thread")
    config = case.parityserve_config(8000, 8001)
    assert config["server"]["cache_bytes"] == 0
    model = config["models"][0]
    assert model["source"] == "zoo:parm-mlp" and model["replicas"] == 1
    assert model["batching"] == {"max_batch_size": frontend_cases.MAX_BATCH,
                                 "max_delay_ms": 0.0}
    assert case.app_args("bare")[-2:] == ["--batch-run", "thread"]
    assert "--batch-run" not in case.app_args("litserve")
    assert case.routes("parityserve") == ("clipper-json", "v2-binary")
    assert not case.has_grpc("parityserve")


def test_the_batched_system_is_the_shipped_server_with_a_batching_delay() -> None:
    case = frontend_cases.load_case("noop", None)
    shipped = case.parityserve_config(8000, 8001)
    assert "batching" not in shipped["models"][0]  # the no-op runs with the defaults
    delay = frontend_cases.PARITYSERVE_SYSTEMS["parityserve-batched"]
    batched = case.parityserve_config(8000, 8001, max_delay_ms=delay)
    assert batched["models"][0]["batching"] == {"max_batch_size": frontend_cases.MAX_BATCH,
                                                "max_delay_ms": 2.0}
    assert {k: v for k, v in batched.items() if k != "models"} == {
        k: v for k, v in shipped.items() if k != "models"}
    assert case.has_grpc("parityserve-batched") and case.has_grpc("parityserve")
    assert case.routes("parityserve-batched") == case.routes("parityserve")


def test_an_unknown_system_is_refused_with_the_choices() -> None:
    with pytest.raises(SystemExit, match="unknown --systems \\['parityserv'\\].*"
                                         "parityserve-batched"):
        frontend_wrk._systems("bare,parityserv")


def test_mean_batch_from_the_histogram_before_and_after_the_run() -> None:
    text = ("# HELP parityserve_batch_size Queries per dispatched batch\n"
            'parityserve_batch_size_bucket{model="mlp",le="1.0"} 3.0\n'
            'parityserve_batch_size_count{model="mlp"} 10.0\n'
            'parityserve_batch_size_sum{model="mlp"} 120.0\n')
    after = frontend_wrk._histogram(text, "parityserve_batch_size")
    assert after == (120.0, 10.0)
    assert frontend_wrk._batching((20.0, 5.0), after) == {"model_calls": 5.0,
                                                          "mean_batch": 20.0}
    assert frontend_wrk._batching(None, after) == {"model_calls": None, "mean_batch": None}
    assert frontend_wrk._batching(after, after) == {"model_calls": 0.0, "mean_batch": None}
    assert frontend_wrk._histogram("", "parityserve_batch_size") is None


def test_the_floor_row_says_what_the_architecture_allows() -> None:
    points = {"0/mlp/bare/clipper-json/distinct": _point(10000, 0.2),
              "0/mlp/floor/clipper-json/distinct": _point(6000, 0.3),
              "0/mlp/parityserve/clipper-json/distinct": _point(4500, 0.4)}
    rows = {r["system"]: r for r in frontend_wrk.summarise(points)}
    assert rows["parityserve"]["vs_floor"] == pytest.approx(0.75)
    assert rows["floor"]["vs_bare"] == pytest.approx(0.6)
    assert rows["bare"]["vs_floor"] == pytest.approx(10000 / 6000)
    (verdict,) = frontend_wrk_report.verdicts(list(rows.values()))
    assert "45%" in verdict and "**missed**" in verdict
    assert "reaches 6000 req/s, 60% of the bare app" in verdict and "75% of the floor" in verdict
