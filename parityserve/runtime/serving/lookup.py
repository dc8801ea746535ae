"""Finding what a request names: an application or a model, or a 404 that says what exists."""

from __future__ import annotations

from parityserve.errors import UnknownApplication, UnknownModel
from parityserve.runtime.modelpath.dispatch import ModelPath
from parityserve.runtime.serving.applications import AppRuntime

__all__ = ["find_app", "find_model"]


def find_app(apps: dict[str, AppRuntime], name: str) -> AppRuntime:
    try:
        return apps[name]
    except KeyError:
        raise UnknownApplication(
            f"unknown application {name!r}; deployed: {sorted(apps) or 'none'}") from None


def find_model(models: dict[str, ModelPath], name: str,
               version: int | None = None) -> ModelPath:
    path = models.get(name)
    if path is None:
        raise UnknownModel(f"unknown model {name!r}; deployed: {sorted(models) or 'none'}")
    if version is not None and version != path.version:
        raise UnknownModel(
            f"model {name!r} has no version {version}; serving version {path.version}")
    return path
