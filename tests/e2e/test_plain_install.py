"""A plain ``pip install parityserve`` serves: ``parityserve start`` loads no optional framework
that its config does not use.

The server runs in a subprocess with ``import_watch/sitecustomize.py`` on its path, which
records every watched module whose code really runs, in the frontend and in every worker
(they inherit the environment), with the parityserve frames that imported it. A config of
plain models (a ``python:`` class, a scikit-learn pipeline, a zoo model) must load none of
them anywhere; an ONNX model loads onnxruntime in its own worker only; the stateful graph of
the README loads torch in its operators' workers only, never in the frontend.

``make check-plain-install`` (run by ``.ci/run``) does the same with a real plain install in a
fresh venv, where importing torch would fail outright.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from plain_install_check import STOCKS, plain_models  # the real install's check, beside this

from parityserve.bench.serverproc import ServerProcess, write_config
from parityserve.client import Client
from parityserve.errors import InvalidInput

pytestmark = pytest.mark.e2e

WATCH_SITE = Path(__file__).with_name("import_watch")
# What a config may need but a plain install does not have (pyproject's extras), and what
# only the benchmarks and plots use.
OPTIONAL = ("torch", "onnxruntime", "onnx", "ray", "redis", "matplotlib", "aiohttp")

@pytest.fixture
def watched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The import log that every process started from here appends to."""
    log = tmp_path / "imports.jsonl"
    log.touch()
    monkeypatch.setenv("PARITYSERVE_WATCH_IMPORTS", ",".join(OPTIONAL))
    monkeypatch.setenv("PARITYSERVE_IMPORT_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(WATCH_SITE), os.environ.get("PYTHONPATH")])))
    yield log


def _loads(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def _describe(records: list[dict[str, Any]]) -> str:
    return "\n".join(f"pid {r['pid']} {' '.join(r['argv'])}: {r['module']} via "
                     f"{' -> '.join(r['chain']) or '(no parityserve frame)'}" for r in records)


def _write_onnx(path: Path) -> None:
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "double",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        initializer=[numpy_helper.from_array(np.eye(3, dtype=np.float32) * 2, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())


def test_plain_models_load_no_optional_framework(tmp_path: Path, watched: Path) -> None:
    config = write_config(plain_models(tmp_path), tmp_path / "serving.yaml")
    with ServerProcess(config) as server, Client(server.url) as client:
        assert client.predict("double", [1.0, 2.0, 3.0])["output"] == [2.0, 4.0, 6.0]
        assert client.predict("linear", [1.0, 2.0, 3.0])["output"] == pytest.approx(6.0)
        assert client.predict("echo", [5.0])["output"] == [5.0]
    records = _loads(watched)
    assert not records, "optional frameworks loaded serving plain models:\n" + \
        _describe(records)


def test_an_onnx_model_loads_onnxruntime_in_its_worker_only(tmp_path: Path,
                                                             watched: Path) -> None:
    _write_onnx(tmp_path / "double.onnx")
    config = {"server": {"http_port": 0},
              "models": [{"name": "double", "source": "onnx:double.onnx"}],
              "applications": [{"name": "double", "models": ["double"], "slo_ms": 5000}]}
    path = write_config(config, tmp_path / "serving.yaml")
    with ServerProcess(path) as server, Client(server.url) as client:
        assert client.predict("double", [1.0, 2.0, 3.0])["output"] == [2.0, 4.0, 6.0]
        frontend = server.proc.pid if server.proc else -1
    records = _loads(watched)
    assert {r["module"] for r in records} <= {"onnxruntime", "onnx"}, _describe(records)
    assert any(r["module"] == "onnxruntime" for r in records)  # the premise: it was watched
    assert not [r for r in records if r["pid"] == frontend], _describe(records)


README_GRAPH = {"server": {"http_port": 0}, **STOCKS}  # the README's stocks graph


def test_a_stateful_graph_loads_torch_in_its_operators_never_in_the_frontend(
        tmp_path: Path, watched: Path) -> None:
    path = write_config(README_GRAPH, tmp_path / "serving.yaml")
    with ServerProcess(path) as server, Client(server.url) as client:
        answer = client.predict_graph("stocks", [0.1, 0.2, 0.3, 0.4], stream="IBM",
                                      stream_key="ticker")
        frontend = server.proc.pid if server.proc else -1
    assert answer["durable"] is True and len(answer["output"]) == 1, answer
    records = _loads(watched)
    assert {r["module"] for r in records} == {"torch"}, _describe(records)
    assert not [r for r in records if r["pid"] == frontend], _describe(records)


@pytest.fixture
def without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Processes started from here run as if torch were not installed."""
    monkeypatch.setenv("PARITYSERVE_REFUSE_MODULES", "torch")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(REFUSE_SITE), os.environ.get("PYTHONPATH")])))


REFUSE_SITE = Path(__file__).with_name("import_refuse")
PARITYSERVE = str(Path(sys.executable).with_name("parityserve"))
TORCH_HINT = "pip install 'parityserve[torch]'"


@pytest.mark.parametrize("command", ["validate", "start"])
def test_without_torch_a_stateful_graph_is_refused_naming_the_extra(
        tmp_path: Path, without_torch: None, command: str) -> None:
    path = write_config(README_GRAPH, tmp_path / "serving.yaml")
    done = subprocess.run([PARITYSERVE, command, "-c", str(path)], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stdout + done.stderr
    assert TORCH_HINT in done.stderr, done.stderr
    assert "model lstm1: a stateful graph operator" in done.stderr
    assert "model lstm2: a stateful graph operator" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_without_torch_a_torch_deploy_is_refused_with_400_and_the_server_serves_on(
        tmp_path: Path, without_torch: None) -> None:
    config = write_config(plain_models(tmp_path), tmp_path / "serving.yaml")
    with ServerProcess(config) as server, Client(server.url) as client:
        with pytest.raises(InvalidInput) as refused:  # InvalidInput: a 400 invalid_input
            client.deploy({"name": "lenet", "source": "zoo:lenet5"})
        assert TORCH_HINT in str(refused.value) and "zoo:lenet5" in str(refused.value)
        assert client.predict("double", [1.0])["output"] == [2.0]


@pytest.mark.parametrize("command", ["validate", "start"])
def test_a_zoo_name_no_worker_could_load_is_refused_before_any_starts(
        tmp_path: Path, command: str) -> None:
    config = {"server": {"http_port": 0},
              "models": [{"name": "typo", "source": "zoo:ecoh"}],
              "applications": [{"name": "typo", "models": ["typo"], "slo_ms": 5000}]}
    path = write_config(config, tmp_path / "serving.yaml")
    done = subprocess.run([PARITYSERVE, command, "-c", str(path)], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "unknown zoo model 'ecoh'" in done.stderr and "echo" in done.stderr, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
