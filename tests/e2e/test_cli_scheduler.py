"""`parityserve validate` checks a scheduler's profile the way `start` does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli import run_cli, write_yaml

pytestmark = pytest.mark.e2e

PROFILE = {"schema": "parityserve.profile/1", "model": "m", "cores": 2,
           "oversubscribe": False, "elapsed_s": 1.0, "measurements": [],
           "profiles": {"1": [10.0, 9.0], "2": [16.0]}}


def _yaml(folder: Path, model: str) -> Path:
    (folder / "m.profile.json").write_text(json.dumps({**PROFILE, "model": model}))
    return write_yaml(folder / "serving.yaml", {"models": [
        {"name": "m", "source": "zoo:echo", "replicas": 2,
         "scheduler": {"policy": "serf", "profile": "m.profile.json", "period_s": 2}}]})


def test_validate_reads_the_profile_relative_to_the_config(tmp_path: Path) -> None:
    result = run_cli("validate", "-c", str(_yaml(tmp_path, "m")))
    assert result.returncode == 0, result.stderr
    assert "  scheduler: serf, every 2 s" in result.stdout


def test_validate_refuses_a_profile_of_another_model_in_one_line(tmp_path: Path) -> None:
    result = run_cli("validate", "-c", str(_yaml(tmp_path, "resnet56")))
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "serving.yaml: model 'm': scheduler.profile 'm.profile.json': the profile is of " \
           "model 'resnet56', not 'm'" in lines[0]
