"""``parityserve train-parity`` end to end on scikit-learn digits (no shared data needed).

Runs the installed console script twice (train, then ``--resume`` for one more epoch), checks
the reported degraded-mode accuracy, and serves the exported weights through the zoo loader.
Measured on a 2-core machine: about 10-15 s per run (most of it imports and the deployed
DigitsMLP's training); A_a 0.976 and A_d 0.958 after 3 epochs. The parity model starts from
the deployed weights, which on digits already decode at A_d 0.96 (this small ReLU net is
nearly additive), so the test also checks that training cut the validation loss
(1.91 -> 0.70 in that run).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from parityserve.models import load_model
from parityserve.models.datasets import load_digits_split

pytestmark = pytest.mark.integration

PARITYSERVE = str(Path(sys.executable).with_name("parityserve"))


def train(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = [PARITYSERVE, "train-parity", "--dataset", "digits", "--k", "2", "--encoder",
            "addition", "--out", str(tmp_path / "parity.pt"), "--cache-dir",
            str(tmp_path / "cache"), "--threads", "1", *extra]
    result = subprocess.run(args, capture_output=True, text=True, timeout=90,
                            stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert result.returncode == 0, result.stderr + result.stdout
    return result


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    tmp_path = tmp_path_factory.mktemp("train-parity")
    return tmp_path, train(tmp_path, "--epochs", "3").stdout


def test_degraded_accuracy_is_far_above_chance(trained: tuple[Path, str]) -> None:
    tmp_path, stdout = trained
    info = json.loads((tmp_path / "parity.json").read_text())
    assert info["model"] == "zoo:digits-mlp" and info["k"] == 2 and info["epochs"] == 3
    assert info["accuracy_available"] > 0.9
    assert info["accuracy_degraded"] > 0.5  # chance is 0.1
    assert f"A_d {info['accuracy_degraded']:.4f} after 3 epochs" in stdout
    before = float(re.search(r"before training .*val loss ([\d.]+)", stdout).group(1))
    after = float(re.search(r"epoch 3/3: .*val loss ([\d.]+)", stdout).group(1))
    assert after < 0.8 * before
    weights = (tmp_path / "parity.npz").resolve()
    assert f"parity: {{weights: {weights}, k: 2, encoder: addition}}" in stdout


def test_exported_parity_model_rebuilds_predictions(trained: tuple[Path, str]) -> None:
    tmp_path, _ = trained
    deployed = load_model("zoo:digits-mlp", weights=str(tmp_path / "cache/digits-mlp-seed0.npz"))
    parity = load_model("zoo:digits-mlp", weights=str(tmp_path / "parity.npz"))
    _, _, x, y = load_digits_split(seed=0)
    x1, x2, y1 = x[0:400:2], x[1:400:2], y[0:400:2]
    rebuilt = parity.predict(x1 + x2) - deployed.predict(x2)  # the subtraction decoder
    assert rebuilt.shape == (200, 10)
    assert (rebuilt.argmax(axis=1) == y1).mean() > 0.5


def test_resume_runs_one_more_epoch(trained: tuple[Path, str]) -> None:
    tmp_path, _ = trained
    stdout = train(tmp_path, "--epochs", "4", "--resume").stdout
    assert re.search(r"resumed from .*parity\.pt after epoch 3", stdout)
    assert "epoch 4/4:" in stdout and "epoch 3/4" not in stdout
    info = json.loads((tmp_path / "parity.json").read_text())
    assert info["epochs"] == 4


def test_trained_parity_model_deploys_with_its_one_printed_line(
        trained: tuple[Path, str], server_factory) -> None:
    import yaml

    from parityserve.client import Client

    tmp_path, stdout = trained
    line = next(s for s in stdout.splitlines() if s.startswith("parity: "))
    model = {"name": "digits", "source": "zoo:digits-mlp", "replicas": 2,
             "weights": str(tmp_path / "cache/digits-mlp-seed0.npz"),
             "input": {"name": "input", "datatype": "FP32", "shape": [64]},
             "batching": {"max_batch_size": 1},
             "faults": {"0": {"delay_ms": 3000}},
             **yaml.safe_load(line)}  # the printed line, as a user pastes it
    served = server_factory({
        "server": {"http_port": 0, "cache_bytes": 0},
        "models": [model],
        "applications": [{"name": "digits", "models": ["digits"], "slo_ms": 10_000}]})
    _, _, x, y = load_digits_split(seed=0)
    with Client(served.url) as client:
        answer = client.predict("digits", x[0].tolist())  # replica 0 (3 s slow) takes it
        assert answer["reconstructed"] == "parm-subtraction", answer
        state = next(m for m in client.state()["models"] if m["name"] == "digits")
        # Rebuilt, not waited for: the slow replica has not answered its batch yet.
        assert [r["served"] for r in state["replicas"]
                if r["pool"] == "data" and r["index"] == 0] == [0], state
        assert sorted(r["pool"] for r in state["replicas"]) == ["data", "data", "parity0"]
    assert len(answer["output"]) == 10
