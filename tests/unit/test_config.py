"""Deployment settings: validated, frozen, and strict about unknown keys."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from parityserve.config import Deployment, FaultConfig, load_config, parse_config
from parityserve.errors import ConfigError

ISSUE_EXAMPLE = """
server: {http_port: 8000}
models:
  - name: mnist-mlp
    source: zoo:parm-mlp
    weights: path/to/parm-mnist-base-mlp.npz
    replicas: 2
    threads_per_replica: 1
    batching: {max_batch_size: 64, max_delay_ms: 1}
applications:
  - name: digits
    models: [mnist-mlp]
    slo_ms: 20
    default_output: -1
"""


def test_the_documented_yaml_shape_loads(tmp_path: Path) -> None:
    path = tmp_path / "serving.yaml"
    path.write_text(ISSUE_EXAMPLE)
    config = load_config(path)
    assert config.models[0].batching.max_batch_size == 64
    assert config.models[0].batching.max_delay_ms == 1
    assert config.applications[0].default_output == -1


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d["models"][0].update(replcas=2), "replcas"),
    (lambda d: d["models"][0].update(replicas=-1), "replicas"),
    (lambda d: d["applications"][0].update(models=["ghost"]), "ghost"),
    (lambda d: d["applications"][0].update(slo_ms=0), "slo_ms"),
    (lambda d: d["models"].append(dict(d["models"][0])), "unique"),
    (lambda d: d["applications"][0].update(name="admin"), "reserved"),
    (lambda d: d["models"][0].update(faults={"first": {}}), "replica index"),
    (lambda d: d["models"][0].update(batching={"max_batch_size": 0}), "max_batch_size"),
    (lambda d: d["models"][0].update(input={"datatype": "FP99"}),
     r"input\.datatype.*'FP99' is not a KServe V2 datatype; use one of BOOL, UINT8"),
    (lambda d: d["models"][0].update(output={"datatype": "fp32"}), "'fp32' is not a KServe"),
])
def test_bad_settings_name_the_problem(mutate, message) -> None:
    import yaml

    data = yaml.safe_load(ISSUE_EXAMPLE)
    mutate(data)
    with pytest.raises(ConfigError, match=message):
        parse_config(data)


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [unclosed")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(bad)
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(bad)


def test_settings_are_frozen() -> None:
    deployment = Deployment(name="m", source="zoo:noop")
    with pytest.raises(ValidationError):
        deployment.replicas = 3  # type: ignore[misc]


def test_faults_for_a_replica_fall_back_to_all() -> None:
    d = Deployment(name="m", source="zoo:noop", faults={
        "all": {"delay_ms": 5}, "1": {"crash_after_batches": 3}})
    assert d.faults_for(0).delay_ms == 5
    assert d.faults_for(1).crash_after_batches == 3
    assert FaultConfig().is_noop and not d.faults_for(0).is_noop


# ---- redundancy ------------------------------------------------------------------------------
def _dep(**extra: object) -> Deployment:
    return Deployment.model_validate({"name": "m", "source": "zoo:echo", "replicas": 2, **extra})


def test_a_parity_line_alone_selects_parm_with_m_over_k_parity_replicas() -> None:
    dep = _dep(replicas=4, parity={"weights": "p.npz", "k": 2})
    assert dep.redundancy.mode == "parm" and dep.parity_replicas() == 2
    assert dep.parity is not None and dep.parity.resolved_decoder() == "subtraction"
    assert _dep(replicas=3, parity={"k": 2}).parity_replicas() == 2  # ceil(3 / 2)
    assert _dep(parity={"k": 2, "r": 2}).parity.resolved_decoder() == "linear"


def test_equal_resources_adds_replicas() -> None:
    assert _dep(redundancy={"mode": "equal-resources"}).data_replicas() == 3
    assert _dep(redundancy={"mode": "equal-resources", "extra": 2}).data_replicas() == 4
    assert _dep().data_replicas() == 2


@pytest.mark.parametrize(("extra", "message"), [
    ({"redundancy": {"mode": "parm"}}, "needs a 'parity' entry"),
    ({"redundancy": {"mode": "replication"}, "parity": {"k": 2}}, "only used with mode parm"),
    ({"redundancy": {"mode": "reactive"}}, "needs timeout_ms"),
    ({"redundancy": {"mode": "replication", "d": 3}}, "needs at least 3 replicas"),
    ({"redundancy": {"mode": "berrut", "K": 2, "S": 1}}, "needs at least 3 replicas"),
    ({"replicas": 6, "redundancy": {"mode": "berrut", "K": 2, "E": 1, "S": 1}},
     "needs at least 7 replicas"),
    ({"replicas": 4, "redundancy": {"mode": "systematic-berrut", "K": 2, "S": 1, "E": 1}},
     "does not locate errors"),
    ({"parity": {"k": 3, "encoder": "concat"}}, "k = 2 or 4"),
    ({"parity": {"k": 2, "encoder": "concat", "r": 2}}, "one parity model"),
    ({"parity": {"k": 2, "r": 2, "weights": "a.npz"}}, "needs 2 weight files"),
    ({"parity": {"k": 2, "r": 2, "decoder": "subtraction"}}, "rebuilds one batch"),
    ({"parity": {"k": 2, "decoder": "softmax-subtraction"}}, "softmax-subtraction"),
    ({"parity": {"k": 2, "coefficients": [[1, 2, 3]]}}, "coefficients must be"),
    ({"redundancy": {"mode": "mirror"}}, "mode"),
    ({"replicas": 8, "redundancy": {"mode": "berrut", "K": 4, "S": 1, "workers": 4}},
     "needs at least 5 workers"),
    ({"replicas": 8, "redundancy": {"mode": "systematic-berrut", "K": 4, "workers": 6}},
     "only used by berrut"),
    ({"replicas": 6, "redundancy": {"mode": "berrut", "K": 2, "S": 1, "workers": 7}},
     "needs at least 7 replicas"),
    ({"replicas": 3, "redundancy": {"mode": "systematic-berrut", "decoder": "average"}},
     "decoder"),
    ({"replicas": 3, "redundancy": {"mode": "berrut", "decoder": "subtract"}},
     "decoder is only used by systematic-berrut"),
])
def test_bad_redundancy_settings_name_the_problem(extra: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        _dep(**extra)


def test_berrut_workers_widen_the_group() -> None:
    plain = _dep(replicas=8, redundancy={"mode": "berrut", "K": 4, "S": 1})
    wide = _dep(replicas=8, redundancy={"mode": "berrut", "K": 4, "S": 1, "workers": 8})
    assert (plain.redundancy.coded_tasks(), wide.redundancy.coded_tasks()) == (5, 8)


def test_a_config_needing_more_workers_than_the_host_allows_is_refused() -> None:
    models = [{"name": "a", "source": "zoo:noop", "replicas": 3},
              {"name": "b", "source": "zoo:noop", "replicas": 2,
               "redundancy": {"mode": "equal-resources", "extra": 1}}]
    with pytest.raises(ConfigError, match="need 6 worker processes, more than "
                                          "server.max_local_workers = 5"):
        parse_config({"server": {"max_local_workers": 5}, "models": models})
    assert parse_config({"server": {"max_local_workers": 6}, "models": models})


@pytest.mark.parametrize(("redundancy", "message"), [
    ({"mode": "parm", "group_wait_ms": 5}, "only used by the berrut modes"),
    ({"mode": "none", "group_wait_ms": 5}, "only used by the berrut modes"),
    ({"mode": "berrut", "group_wait_ms": -1}, "greater than or equal to 0"),
    ({"mode": "systematic-berrut", "group_wait_ms": 20_000}, "less than or equal to 10000"),
])
def test_berrut_group_wait_is_checked(redundancy: dict, message: str) -> None:
    extra = {"parity": {"k": 2}} if redundancy["mode"] == "parm" else {}
    with pytest.raises(ValidationError, match=message):
        _dep(replicas=3, redundancy=redundancy, **extra)


def test_berrut_group_wait_reaches_the_scheduler() -> None:
    from parityserve.runtime.modelpath.dispatch import mode_of
    dep = _dep(replicas=3, redundancy={"mode": "systematic-berrut", "group_wait_ms": 12.5})
    assert mode_of(dep).group_wait_s == pytest.approx(0.0125)
    assert mode_of(_dep(replicas=3, redundancy={"mode": "berrut"})).group_wait_s == 0.0


@pytest.mark.parametrize(("server", "shared"), [
    ({}, False),  # memory: nothing to share through
    ({"state_store": "sqlite:s.db"}, False),
    ({"state_store": "redis://r:6379/0"}, True),  # on by default with Redis
    ({"state_store": "redis://r:6379/0", "peers": None}, False),  # turned off
    ({"state_store": "redis://r:6379/0", "peers": {"namespace": "prod"}}, True),
])
def test_admin_changes_are_shared_only_through_redis(server: dict, shared: bool) -> None:
    assert parse_config({"server": server}).server.shares_admin_changes() is shared


@pytest.mark.parametrize(("server", "message"), [
    ({"peers": {"namespace": "prod"}}, "needs state_store: redis"),
    ({"state_store": "redis://r/0", "peers": {"namespace": "a b"}}, "namespace"),
    ({"state_store": "redis://r/0", "peers": {"max_changes": 10}}, "max_changes"),
])
def test_bad_peer_settings_name_the_problem(server: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"server": server})
