"""Which optional extras a deployment needs, and one clear error when one is not installed.

A plain ``pip install parityserve`` serves numpy, scikit-learn, ``python:`` and the numpy zoo
models. Anything else needs an extra: a torch or torchscript source, a torch zoo network, a
stateful graph operator (its state is a dict of torch tensors), an ONNX file, a Redis state
store or the Ray launcher. ``parityserve validate`` and ``start`` check this before any
process starts, so a missing framework is one line naming the ``pip install`` that fixes it,
not a traceback from a worker minutes later.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from parityserve.config import Deployment, ServingConfig
from parityserve.errors import ConfigError
from parityserve.models.zoo import TORCH_ZOO_NAMES

__all__ = ["Need", "check_extras", "deployment_needs", "missing_extras", "needed_extras"]

# The module whose presence proves an extra is installed.
_PROOF = {"torch": "torch", "onnx": "onnxruntime", "redis": "redis", "ray": "ray"}
_SCHEME_EXTRA = {"torch": "torch", "torchscript": "torch", "onnx": "onnx"}


@dataclass(frozen=True)
class Need:
    """``extra`` (a pip extra of parityserve) is needed because of ``why``."""

    extra: str
    why: str

    @property
    def module(self) -> str:
        return _PROOF[self.extra]


def source_extra(source: str) -> str | None:
    """The extra a model source needs to load, or None when a plain install loads it."""
    scheme, _, target = source.partition(":")
    if scheme == "zoo":
        return "torch" if target in TORCH_ZOO_NAMES else None
    return _SCHEME_EXTRA.get(scheme)


def deployment_needs(deployment: Deployment, *, stateful: bool = False) -> list[Need]:
    """What one deployment needs: its source, its parity models' source, and torch for a
    stateful operator whatever its source."""
    needs = []
    sources = [("source", deployment.source)]
    if deployment.parity is not None and deployment.parity.source:
        sources.append(("parity source", deployment.parity.source))
    for what, source in sources:
        if extra := source_extra(source):
            needs.append(Need(extra, f"model {deployment.name}: {what} {source}"))
    if stateful:
        needs.append(Need("torch", f"model {deployment.name}: a stateful graph operator"))
    return needs


def needed_extras(config: ServingConfig) -> list[Need]:
    """Every extra the deployment file needs, each with what needs it (no I/O)."""
    return list(_needs(config))


def _needs(config: ServingConfig) -> Iterator[Need]:
    stateful = {op.model for g in config.graphs for op in g.operators if op.stateful}
    for deployment in config.models:
        yield from deployment_needs(deployment, stateful=deployment.name in stateful)
    if config.server.state_store.strip().startswith(("redis://", "rediss://")):
        yield Need("redis", f"server.state_store {config.server.state_store}")
    if config.launcher.kind == "ray":
        yield Need("ray", "launcher kind ray")


def _installed(module: str) -> bool:
    # find_spec looks the module up without running it: checking costs no import time. An
    # import hook may refuse the name outright (ModuleNotFoundError): absent too.
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_extras(needs: list[Need], *,
                   installed: Callable[[str], bool] = _installed) -> list[Need]:
    return [need for need in needs if not installed(need.module)]


def check_extras(needs: list[Need], *, where: str = "",
                 installed: Callable[[str], bool] = _installed) -> None:
    """Raise ``ConfigError`` naming each missing extra, what needs it and the pip line."""
    missing = missing_extras(needs, installed=installed)
    if not missing:
        return
    extras = sorted({need.extra for need in missing})
    lines = [f"  {need.why} needs the {need.extra} extra ({need.module} is not installed)"
             for need in missing]
    prefix = f"{where}: " if where else ""
    raise ConfigError(f"{prefix}optional dependencies are missing:\n" + "\n".join(lines)
                      + f"\ninstall them with: pip install 'parityserve[{','.join(extras)}]'")
