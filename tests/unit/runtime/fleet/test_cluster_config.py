"""Running on a Ray cluster, as configured: the launcher block, replica resources, the
``--ray-address`` flag, the coding groups placement spreads, and Ray missing."""

from __future__ import annotations

import sys

import pytest

from parityserve.cli import _with_ray, main
from parityserve.config import ServingConfig, parse_config
from parityserve.errors import ConfigError
from parityserve.runtime.fleet.placement_plan import deployment_members, group_size, slot_key
from parityserve.runtime.serving.system import ServingSystem

ECHO = {"source": "zoo:echo", "input": {"name": "input", "datatype": "FP32", "shape": [4]}}


def _members(**model: object) -> list[tuple[str, str, float]]:
    config = parse_config({"models": [{"name": "m", **ECHO, **model}]})
    return [(m.key, m.group, m.demand.cpu) for m in deployment_members(config.models)]


def test_launcher_is_local_by_default_and_ray_takes_an_address() -> None:
    assert parse_config({}).launcher.kind == "local"
    config = parse_config({"launcher": {"kind": "ray", "address": "ray://head:10001"}})
    assert (config.launcher.kind, config.launcher.address) == ("ray", "ray://head:10001")


@pytest.mark.parametrize(("launcher", "error"), [
    ({"kind": "local", "address": "auto"}, "only used with kind: ray"),
    ({"kind": "k8s"}, "launcher.kind"),
    ({"kind": "ray", "adress": "auto"}, "unknown key"),
])
def test_bad_launcher_blocks_are_refused(launcher: dict, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        parse_config({"launcher": launcher})


def test_ray_address_flag_switches_the_launcher() -> None:
    config = _with_ray(ServingConfig(), "auto")
    assert (config.launcher.kind, config.launcher.address) == ("ray", "auto")


def test_start_help_teaches_the_ray_address(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["start", "--help"])
    assert "--ray-address" in capsys.readouterr().out


def test_parm_groups_k_data_slots_with_their_parity_slots() -> None:
    members = _members(replicas=4, parity={"k": 2, "r": 1})
    assert members == [
        ("m/v1/0", "m/v1/group0", 1.0), ("m/v1/1", "m/v1/group0", 1.0),
        ("m/v1/2", "m/v1/group1", 1.0), ("m/v1/3", "m/v1/group1", 1.0),
        ("m/v1/parity0-0", "m/v1/group0", 1.0), ("m/v1/parity0-1", "m/v1/group1", 1.0)]


@pytest.mark.parametrize(("model", "size"), [
    ({"replicas": 3, "redundancy": {"mode": "berrut", "K": 2, "S": 1}}, 3),
    ({"replicas": 2, "redundancy": {"mode": "replication", "d": 2}}, 2),
    ({"replicas": 3}, 1),
])
def test_group_sizes_follow_the_mode(model: dict, size: int) -> None:
    dep = parse_config({"models": [{"name": "m", **ECHO, **model}]}).models[0]
    assert group_size(dep) == size
    groups = {g for _, g, _ in _members(**model)}
    assert groups == ({""} if size == 1 else {"m/v1/group0"})


def test_resources_come_from_the_deployment() -> None:
    assert {cpu for *_, cpu in _members(replicas=1, threads_per_replica=3)} == {3.0}
    config = parse_config({"models": [{"name": "m", **ECHO, "resources": {
        "cpu": 0.5, "gpu": 1, "memory_mb": 512}}]})
    (member,) = deployment_members(config.models)
    assert (member.demand.cpu, member.demand.gpu, member.demand.memory) == (0.5, 1, 2**29)


def test_slot_key_drops_the_incarnation() -> None:
    assert slot_key("m/v2/parity0-1#7-0123abcd") == "m/v2/parity0-1"


def test_ray_launcher_without_ray_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what a plain install has
    monkeypatch.delitem(sys.modules, "parityserve.runtime.fleet.ray_launcher", raising=False)
    # refused as the system is built, before any process starts (models/extras.py)
    with pytest.raises(ConfigError, match=r"launcher kind ray needs the ray extra(.|\n)*"
                                          r"pip install 'parityserve\[ray\]'"):
        ServingSystem(parse_config({"launcher": {"kind": "ray", "address": "auto"}}))
