"""``scripts/redis.sh`` and ``scripts/prometheus.sh`` share ``scripts/lib/services.sh``: the
Debian install (a clear error where it cannot run) and the pidfile stop (never a process
that only reuses the pid). Run as the Makefile runs them, with a PATH built for each case."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TOOLS = ("bash", "dirname", "id", "cat", "grep", "mktemp", "tail", "rm", "seq", "sleep",
         "mkdir", "kill")


def _bare_path(tmp_path: Path) -> str:
    """A PATH with the shell's tools and neither the servers nor apt-get nor sudo."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        if found is not None:
            (folder / tool).symlink_to(found)
    return str(folder)


@pytest.mark.parametrize(("script", "package"), [("redis.sh", "redis-server"),
                                                 ("prometheus.sh", "prometheus")])
def test_ensure_without_apt_get_says_what_to_install_by_hand(
        tmp_path: Path, script: str, package: str) -> None:
    done = subprocess.run([ROOT / "scripts" / script, "ensure"], capture_output=True,
                          text=True, env={"PATH": _bare_path(tmp_path)}, timeout=30,
                          check=False)
    assert done.returncode == 1
    assert done.stderr.startswith(f"scripts/{script}: {package} is not installed")
    # root: apt-get is missing; anyone else: no sudo either. Both say what to do.
    assert "by hand" in done.stderr or "yourself, then rerun" in done.stderr


@pytest.mark.parametrize(("script", "port_variable"), [
    ("redis.sh", "PARITYSERVE_REDIS_PORT"), ("prometheus.sh", "PARITYSERVE_PROMETHEUS_PORT")])
def test_stop_leaves_a_process_that_only_reused_the_pid_alive(
        tmp_path: Path, script: str, port_variable: str) -> None:
    """A stale pidfile naming a live process that is not the server: stop removes the
    pidfile and kills nothing."""
    port = "65001"
    name = script.removesuffix(".sh")
    folder = ROOT / ".cache" / name / port
    folder.mkdir(parents=True, exist_ok=True)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (folder / f"{name}.pid").write_text(f"{stranger.pid}\n")
        subprocess.run([ROOT / "scripts" / script, "stop"], check=True, timeout=30,
                       env={**os.environ, port_variable: port})
        assert not (folder / f"{name}.pid").exists()
        assert stranger.poll() is None, "stop killed a process that was not its server"
    finally:
        stranger.kill()
        stranger.wait()
        shutil.rmtree(folder, ignore_errors=True)
