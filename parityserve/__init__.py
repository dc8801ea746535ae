"""parityserve: prediction serving that answers on time, even when model instances are slow,
fail or return wrong answers.

Describe a deployment in Python with the same objects the YAML file holds::

    from parityserve import Application, Deployment, Server, ServingConfig, start_in_thread

    config = ServingConfig(
        server=Server(http_port=8000),
        models=[Deployment(name="mlp", source="zoo:parm-mlp", weights="mlp.npz", replicas=2)],
        applications=[Application(name="digits", models=["mlp"], slo_ms=20, default_output=-1)],
    )
    with start_in_thread(config) as server, Client(server.url) as client:
        client.predict("digits", x)

Heavy pieces (the HTTP server, torch) are imported only when used.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from parityserve.config import (
    Application,
    BatchingConfig,
    BurstConfig,
    Deployment,
    FaultConfig,
    Graph,
    GraphOperator,
    Server,
    ServingConfig,
    TensorSpec,
    load_config,
    parse_config,
)
from parityserve.errors import ParityServeError

__version__ = "0.1.0"

__all__ = [
    "Application",
    "BatchingConfig",
    "BurstConfig",
    "Client",
    "Deployment",
    "FaultConfig",
    "Graph",
    "GraphOperator",
    "Model",
    "ParityServeError",
    "RunningServer",
    "Server",
    "ServingConfig",
    "TensorSpec",
    "__version__",
    "load_config",
    "load_model",
    "parse_config",
    "serve",
    "start_in_thread",
]

# name -> module that defines it; resolved on first access so `import parityserve` stays light.
_LAZY = {
    "Client": "parityserve.client",
    "Model": "parityserve.models.base",
    "load_model": "parityserve.models.loader",
    "RunningServer": "parityserve.runtime.server",
    "serve": "parityserve.runtime.server",
    "start_in_thread": "parityserve.runtime.server",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'parityserve' has no attribute {name!r}")
    return getattr(import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
