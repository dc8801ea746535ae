"""Pin the public names so that a rename is a deliberate, visible change."""

from __future__ import annotations

import subprocess
import sys

import parityserve

EXPECTED = {
    "Application", "BatchingConfig", "BurstConfig", "Client", "Deployment", "FaultConfig",
    "Graph", "GraphOperator", "Model", "ParityServeError", "RunningServer", "Server",
    "ServingConfig", "TensorSpec",
    "__version__", "load_config", "load_model", "parse_config", "serve", "start_in_thread",
}


def test_public_names_are_pinned() -> None:
    assert set(parityserve.__all__) == EXPECTED


def test_every_public_name_resolves() -> None:
    for name in parityserve.__all__:
        assert getattr(parityserve, name) is not None


def test_import_stays_light() -> None:
    code = ("import sys, parityserve; heavy = [m for m in ('torch', 'starlette', 'uvicorn', "
            "'sklearn', 'zmq') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_python_objects_match_the_yaml_shape() -> None:
    config = parityserve.ServingConfig(
        server=parityserve.Server(http_port=0),
        models=[parityserve.Deployment(name="m", source="zoo:noop", replicas=2)],
        applications=[parityserve.Application(name="a", models=["m"], slo_ms=20)],
    )
    same = parityserve.parse_config({
        "server": {"http_port": 0},
        "models": [{"name": "m", "source": "zoo:noop", "replicas": 2}],
        "applications": [{"name": "a", "models": ["m"], "slo_ms": 20}],
    })
    assert config == same
