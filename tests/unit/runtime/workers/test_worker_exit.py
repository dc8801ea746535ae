"""How a worker leaves on SIGTERM: with BYE when asked to stop, silently when its launcher
died under it (a Ray actor or its node), so that the frontend replaces it."""

from __future__ import annotations

import pytest

from parityserve.runtime.workers import worker


class Exited(Exception):
    pass


def _fake_exit(code: int) -> None:
    raise Exited(code)


@pytest.mark.parametrize(("launcher", "parent", "leaves"), [
    (100, 1, "silently"),      # launcher gone: reparented, so no BYE
    (100, 100, "with bye"),    # launcher alive: someone asked us to stop
    (None, 1, "with bye"),     # not launched with --die-with-parent
])
def test_sigterm_says_bye_only_while_the_launcher_lives(
        monkeypatch: pytest.MonkeyPatch, launcher: int | None, parent: int, leaves: str) -> None:
    monkeypatch.setattr(worker, "_launcher_pid", launcher)
    monkeypatch.setattr(worker.os, "getppid", lambda: parent)
    monkeypatch.setattr(worker.os, "_exit", _fake_exit)
    if leaves == "silently":
        with pytest.raises(Exited) as info:
            worker._exit_on_signal(15, None)
        assert info.value.args == (worker.EXIT_LAUNCHER_DIED,)
    else:  # SystemExit unwinds through run_worker's finally, which sends BYE
        with pytest.raises(SystemExit):
            worker._exit_on_signal(15, None)


def test_a_ray_workers_sigterm_never_says_bye(monkeypatch: pytest.MonkeyPatch) -> None:
    """--no-bye: the launcher is alive (Ray signalled the actor's process group, not the
    frontend, which drops a replica before it stops it), yet the exit is silent."""
    monkeypatch.setattr(worker, "_launcher_pid", 100)
    monkeypatch.setattr(worker, "_never_bye", True)
    monkeypatch.setattr(worker.os, "getppid", lambda: 100)
    monkeypatch.setattr(worker.os, "_exit", _fake_exit)
    with pytest.raises(Exited) as info:
        worker._exit_on_signal(15, None)
    assert info.value.args == (worker.EXIT_LAUNCHER_DIED,)
