"""The demo's coding comparison is resource-matched: same processes, same slowed replica."""

from __future__ import annotations

from pathlib import Path

from parityserve.config import parse_config
from parityserve.demo import ARMS, BURST, coding_config


def test_both_deployments_run_three_processes_with_replica_0_slowed(tmp_path: Path) -> None:
    config = parse_config(coding_config(tmp_path / "deployed.npz", tmp_path / "parity.npz",
                                        seed=3))
    uncoded, parm = (next(m for m in config.models if m.name == arm.app) for arm in ARMS)
    assert uncoded.redundancy.mode == "equal-resources" and uncoded.data_replicas() == 3
    assert parm.redundancy.mode == "parm" and parm.parity is not None
    assert (parm.data_replicas(), parm.parity_replicas()) == (2, 1)
    assert parm.parity.weights == str(tmp_path / "parity.npz")
    for model in (uncoded, parm):
        assert model.weights == str(tmp_path / "deployed.npz")
        burst = model.faults_for(0).burst
        assert burst is not None and burst.model_dump() == BURST
        assert model.faults_for(1).is_noop
    assert config.server.cache_bytes == 0  # every query reaches a replica
    assert {a.name for a in config.applications} == {arm.app for arm in ARMS}


def test_part_one_keeps_its_tight_slo_unless_asked_for_another(tmp_path: Path) -> None:
    """--slo-ms reaches part 1's application (50 ms by default, as before)."""
    from parityserve.demo import DEMO_SLO_MS, demo_config

    model = tmp_path / "m.joblib"
    assert DEMO_SLO_MS == 50.0
    assert parse_config(demo_config(model)).applications[0].slo_ms == 50.0
    assert parse_config(demo_config(model, 1000.0)).applications[0].slo_ms == 1000.0


def test_a_non_positive_slo_is_refused_by_name(capsys) -> None:
    from parityserve.cli import main

    for bad in ("0", "-5", "nan"):
        assert main(["demo", "--slo-ms", bad, "--skip-coding", "--queries", "1"]) != 0
        assert "--slo-ms must be a positive number of ms" in capsys.readouterr().err
