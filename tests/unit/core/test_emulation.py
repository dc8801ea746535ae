"""Emulated accelerators (parityserve.core.emulation): service-time draws and their config."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from parityserve.config import Deployment, EmulationConfig
from parityserve.core import emulation
from parityserve.core.emulation import PROFILES, ServiceProfile, draw_service_s, profile_named
from parityserve.errors import ConfigError
from parityserve.runtime.fleet.slots import emulation_spec


def _profile(**fields: object) -> ServiceProfile:
    base = {"name": "t", "base_ms": 10.0, "per_query_ms": 2.0, "source": "a test"}
    return ServiceProfile(**{**base, **fields})  # type: ignore[arg-type]


def test_public_names() -> None:
    assert sorted(emulation.__all__) == ["PROFILES", "ServiceProfile", "draw_service_s",
                                         "profile_named"]


def test_a_constant_profile_gives_base_plus_per_query_for_the_batch() -> None:
    profile = _profile(distribution="constant", cv=0.5)
    rng = np.random.default_rng(0)
    assert draw_service_s(profile, 1, rng) == pytest.approx(0.012)
    assert draw_service_s(profile, 4, rng) == pytest.approx(0.018)
    assert draw_service_s(profile, 0, rng) == pytest.approx(0.012)  # an empty batch costs one


def test_a_lognormal_draw_keeps_the_mean_and_spreads_by_cv() -> None:
    profile = _profile(cv=0.3)
    rng = np.random.default_rng(1)
    draws = np.array([draw_service_s(profile, 2, rng) for _ in range(20_000)])
    assert draws.mean() == pytest.approx(0.014, rel=0.01)
    assert draws.std() / draws.mean() == pytest.approx(0.3, rel=0.05)
    assert draws.min() > 0


def test_the_draw_depends_only_on_the_generator_passed_in() -> None:
    profile = _profile(cv=0.2)
    a = [draw_service_s(profile, 3, np.random.default_rng(7)) for _ in range(3)]
    assert a[0] == a[1] == a[2]
    rng = np.random.default_rng(7)
    assert draw_service_s(profile, 3, rng) == a[0] != draw_service_s(profile, 3, rng)


def test_zero_cv_lognormal_is_the_mean_and_draws_nothing() -> None:
    rng = np.random.default_rng(3)
    before = rng.bit_generator.state
    assert draw_service_s(_profile(cv=0.0), 1, rng) == pytest.approx(0.012)
    assert rng.bit_generator.state == before


def test_the_parm_profile_matches_its_stated_derivation() -> None:
    parm = profile_named("parm-gpu-resnet18")
    assert parm.mean_ms(1) == pytest.approx(30.0)  # 75% of 12 instances at 300 q/s
    # ParM's batch scaling: 300, 460 and 584 q/s at batch 1, 2 and 4 at one utilisation.
    for batch, rate in ((2, 460.0), (4, 584.0)):
        assert parm.mean_ms(batch) / parm.mean_ms(1) == pytest.approx(batch * 300 / rate,
                                                                        rel=0.04)
    assert "SOSP'19" in parm.source and "assumption" in parm.source
    assert parm.label.startswith("EMULATED accelerator 'parm-gpu-resnet18'")
    assert set(PROFILES) == {"parm-gpu-resnet18"}


@pytest.mark.parametrize(("fields", "message"), [
    ({"base_ms": -1.0}, "base_ms must be a finite number >= 0"),
    ({"per_query_ms": math.inf}, "per_query_ms must be a finite number >= 0"),
    ({"cv": math.nan}, "cv must be"),
    ({"base_ms": 0.0, "per_query_ms": 0.0}, "base_ms \\+ per_query_ms > 0"),
    ({"distribution": "pareto"}, "constant or lognormal"),
    ({"source": "  "}, "needs a source"),
])
def test_bad_profiles_name_the_problem(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _profile(**fields)


def test_an_unknown_profile_lists_the_built_in_ones() -> None:
    with pytest.raises(ConfigError, match="unknown emulation profile 'tpu'; built in: "
                                          "parm-gpu-resnet18"):
        profile_named("tpu")


# --- config -----------------------------------------------------------------------------------


def _dep(emulation: dict) -> Deployment:
    return Deployment.model_validate({"name": "m", "source": "zoo:echo", "replicas": 12,
                                      "emulation": emulation})


def test_a_deployment_names_a_profile_or_states_its_own() -> None:
    named = _dep({"profile": "parm-gpu-resnet18", "seed": 4})
    assert named.emulation is not None
    assert named.emulation.service_profile() == PROFILES["parm-gpu-resnet18"]
    own = _dep({"base_ms": 5, "per_query_ms": 1, "cv": 0.1, "source": "measured on an A100"})
    assert own.emulation is not None
    assert own.emulation.service_profile().label == (
        "EMULATED accelerator 'custom': 5 ms + 1 ms/query, lognormal cv 0.1 (source: measured "
        "on an A100)")
    assert Deployment(name="m", source="zoo:echo").emulation is None


def test_the_worker_spec_carries_the_profile_and_seed() -> None:
    spec = emulation_spec(_dep({"profile": "parm-gpu-resnet18", "seed": 4}))
    assert spec["seed"] == 4 and spec["base_ms"] == 19.5 and spec["name"] == "parm-gpu-resnet18"
    assert ServiceProfile(**{k: v for k, v in spec.items() if k != "seed"}) == \
        PROFILES["parm-gpu-resnet18"]
    assert emulation_spec(Deployment(name="m", source="zoo:echo")) == {}


@pytest.mark.parametrize(("emulation", "message"), [
    ({}, "name a profile, or give base_ms, per_query_ms and source"),
    ({"base_ms": 5, "per_query_ms": 1}, "and source"),
    ({"profile": "parm-gpu-resnet18", "base_ms": 3}, "not both"),
    ({"profile": "parm-gpu-resnet18", "cv": 0.3}, "not both"),
    ({"profile": "k80"}, "unknown emulation profile 'k80'"),
    ({"base_ms": -5, "per_query_ms": 1, "source": "x"}, "greater than or equal to 0"),
    ({"profile": "parm-gpu-resnet18", "speed": 2}, "Extra inputs are not permitted"),
])
def test_bad_emulation_settings_name_the_problem(emulation: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        _dep(emulation)
    with pytest.raises(ValidationError, match=message):
        EmulationConfig.model_validate(emulation)
