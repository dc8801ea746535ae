"""Benchmark results files, tables and plots (parityserve.bench.report, benchmarks.report)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import report as lab_report
from benchmarks.report import plot_cdf, plot_quantile_cdf
from parityserve.bench import report
from parityserve.bench.report import (
    machine_info,
    markdown_table,
    plot_latency_vs_load,
    write_results,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_public_names() -> None:
    assert sorted(report.__all__) == [
        "Column", "colours", "command_line", "machine_info", "markdown_table", "new_figure",
        "plot_latency_vs_load", "save_figure", "write_results",
    ]
    # The experiments' one surface: the package's names plus the CDF plots only they draw.
    assert sorted(lab_report.__all__) == sorted([*report.__all__, "plot_cdf",
                                                 "plot_quantile_cdf"])
    assert all(hasattr(lab_report, name) for name in lab_report.__all__)


def test_machine_info_describes_the_machine() -> None:
    info = machine_info()
    assert info["cpu_count"] >= 1
    assert isinstance(info["cpu_model"], str) and info["cpu_model"]
    assert info["python"].count(".") == 2
    assert info["numpy"] == np.__version__
    assert "T" in info["date"]


def test_write_results_records_command_and_machine(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # the process's own command line, set here: under pytest-xdist this process is an execnet
    # worker whose argv names no pytest
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-m", "benchmarks.tail", "--quick"])
    payload = {"rates": [10.0, 20.0], "p99_ms": np.float32(1.5), "lat": np.arange(3.0)}
    paths = write_results("demo", payload, results_dir=tmp_path / "out",
                          markdown="## Table\n\n| a |\n|---|\n| 1 |")
    assert paths == {"json": tmp_path / "out" / "demo.json", "md": tmp_path / "out" / "demo.md"}
    doc = json.loads(paths["json"].read_text())
    assert doc["name"] == "demo"
    assert doc["rates"] == [10.0, 20.0] and doc["p99_ms"] == 1.5 and doc["lat"] == [0, 1, 2]
    assert doc["command"] == report.command_line()
    assert doc["command"].endswith("-m benchmarks.tail --quick")
    assert doc["machine"]["cpu_count"] >= 1
    md = paths["md"].read_text()
    assert md.startswith("# demo")
    assert doc["command"] in md and "cpu_model" in md and "## Table" in md


def test_write_results_keeps_a_given_command(tmp_path: Path) -> None:
    paths = write_results("x", {}, results_dir=tmp_path, command="parityserve bench tail")
    assert json.loads(paths["json"].read_text())["command"] == "parityserve bench tail"
    assert "x.json" in paths["md"].read_text()


@pytest.mark.parametrize("name", ["", "../up", "a/b", ".hidden"])
def test_write_results_rejects_bad_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError):
        write_results(name, {}, results_dir=tmp_path)


def test_markdown_table_formats_cells() -> None:
    rows = [
        {"mode": "parm k=2", "p99": 12.345, "ok": True},
        {"mode": "a|b", "p99": math.nan},
        {"mode": "none", "p99": None, "ok": False},
    ]
    table = markdown_table(rows, [("mode", "Mode", ""), ("p99", "p99 (ms)", ".1f"),
                                  ("ok", "OK", lambda v: "yes" if v else "no")])
    assert table.splitlines() == [
        "| Mode | p99 (ms) | OK |",
        "|---|---|---|",
        "| parm k=2 | 12.3 | yes |",
        "| a\\|b | – | – |",
        "| none | – | no |",
    ]


def test_plots_write_png_files(tmp_path: Path) -> None:
    series = {
        "baseline": [(200.0, 2.0, 9.0, 30.0), (100.0, 1.0, 5.0, 20.0)],
        "parm": [(100.0, 1.1, 3.0, 6.0), (200.0, 1.5, math.nan, 8.0)],
    }
    load_png = plot_latency_vs_load(series, tmp_path / "plots" / "load.png", "tail vs load")
    rng = np.random.default_rng(0)
    cdf_png = plot_cdf({"a": rng.exponential(0.01, 500), "b": [0.001, math.inf, 0.002]},
                       tmp_path / "cdf.png", "latency CDF")
    probs = [0.25, 0.5, 0.75, 1.0]
    quantile_png = plot_quantile_cdf({"a": [1.0, 2.0, 4.0, 9.0], "b": [1.0, math.nan, 3, 5]},
                                     probs, tmp_path / "quantiles.png", "CDF", note="no c")
    for png in (load_png, cdf_png, quantile_png):
        assert png.read_bytes().startswith(PNG_MAGIC)
        assert png.stat().st_size > 5_000


def test_a_cdf_with_no_curve_says_so_instead_of_warning(tmp_path: Path) -> None:
    png = plot_quantile_cdf({}, [0.5, 1.0], tmp_path / "empty.png", "CDF", note="no runs kept")
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_quantile_cdf_refuses_quantiles_off_its_grid(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="a: 2 quantiles for 3 probabilities"):
        plot_quantile_cdf({"a": [1.0, 2.0]}, [0.5, 0.9, 1.0], tmp_path / "x.png", "CDF")


@pytest.mark.parametrize(("argv", "expected"), [
    (["/work/p/.venv/bin/python3", "/work/p/.venv/bin/parityserve", "bench", "tail",
      "--data-dir", "/work/shared/data"], "parityserve bench tail --data-dir ../shared/data"),
    (["/usr/bin/python3.11", "-m", "parityserve.cli", "bench", "overhead", "--quick"],
     "parityserve bench overhead --quick"),
    (["/work/p/.venv/bin/parityserve", "bench", "simulate", "--out", "/work/p/results/x.json"],
     "parityserve bench simulate --out results/x.json"),
    ([".venv/bin/python", "benchmarks/diagnostics/overload.py", "--factor", "5"],
     "python benchmarks/diagnostics/overload.py --factor 5"),
    (["/work/p/.venv/bin/parityserve", "bench", "tail", "--results-dir", "/tmp/x y"],
     "parityserve bench tail --results-dir '/tmp/x y'"),
    (["/work/p/.venv/bin/python", "-m", "benchmarks.tail", "--data-dir", "/work/shared/data"],
     "python -m benchmarks.tail --data-dir ../shared/data"),
    (["/usr/bin/python3.11", "-m", "benchmarks.simulate", "--validate-real",
      "/work/p/benchmarks/results/tail-mlp.json"],
     "python -m benchmarks.simulate --validate-real benchmarks/results/tail-mlp.json"),
])
def test_the_recorded_command_reruns_from_the_project_root(argv, expected) -> None:
    assert report.command_line(argv, cwd=Path("/work/p")) == expected
