"""What a launched worker's environment says about threads, without starting one."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from parityserve.runtime.fleet import launcher as launcher_module
from parityserve.runtime.fleet.launcher import LocalLauncher
from parityserve.runtime.workers.worker import WorkerSpec


class _Captured(Exception):
    pass


def _env_of_launch(monkeypatch: pytest.MonkeyPatch, threads: int) -> dict[str, str]:
    seen: dict[str, Any] = {}

    def fake_popen(cmd: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        seen.update(kwargs["env"])
        raise _Captured

    monkeypatch.setattr(launcher_module.subprocess, "Popen", fake_popen)
    spec = WorkerSpec(replica_id="r0", model="m", version=1, source="zoo:noop", threads=threads)
    with pytest.raises(_Captured):
        LocalLauncher("tcp://127.0.0.1:1").start(spec)
    return seen


def test_workers_get_their_threads_and_sleeping_openmp_threads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    env = _env_of_launch(monkeypatch, threads=2)
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "2"
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"


def test_a_users_openmp_wait_policy_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert _env_of_launch(monkeypatch, threads=1)["OMP_WAIT_POLICY"] == "ACTIVE"
