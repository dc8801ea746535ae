"""Which member launcher a graph gets (issue 41): local processes by default, Ray actors with
``launcher: {kind: ray}``, and a clear ConfigError when Ray is not installed. No Ray needed."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest

from parityserve.config import LauncherConfig
from parityserve.errors import ConfigError
from parityserve.runtime.graphs.hams_graph import member_launcher
from parityserve.runtime.graphs.hams_members import Member, MemberLauncher
from parityserve.runtime.graphs.hams_protocol import OperatorSpec


def test_the_local_launcher_is_the_default() -> None:
    ctx: Any = SimpleNamespace(link=object())
    for launcher in (None, LauncherConfig()):
        made = member_launcher(ctx, None, None, launcher)
        assert type(made) is MemberLauncher and made.notes == {}


def test_kind_ray_without_ray_installed_is_a_config_error(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    for name in ("parityserve.runtime.graphs.hams_ray_members",
                 "parityserve.runtime.fleet.ray_operators",
                 "parityserve.runtime.fleet.ray_launcher"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    ctx: Any = SimpleNamespace(link=object())
    with pytest.raises(ConfigError, match=r"needs Ray installed: pip install 'parityserve\[ray\]'"):
        member_launcher(ctx, None, None, LauncherConfig(kind="ray"))


def test_a_local_member_is_on_the_local_node_and_this_host() -> None:
    """What ``/admin/state`` shows as its node, and whether the watchdog may read ``/proc``."""
    popen: Any = SimpleNamespace(pid=1234, returncode=None, poll=lambda: None)  # a Popen's face
    spec = OperatorSpec(worker_id="g/op/primary-1", op="op", source="zoo:echo", role="primary")
    member = Member(spec, popen, None, 0.0, hello=None)  # type: ignore[arg-type]
    assert member.node == "local" and member.on_this_host
