"""Resolving ``pkg.mod:Name`` and ``path/file.py:Name`` references and file paths named in a
model source."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from parityserve.errors import ModelLoadError

__all__ = ["import_object", "instantiate", "resolve_file"]


def import_object(ref: str, *, base_dir: Path | None = None) -> Any:
    """Import ``pkg.mod:Name`` or ``path/file.py:Name``. Modules next to the config file
    (``base_dir``) are importable, and a relative file path resolves against it."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ModelLoadError(
            f"expected 'package.module:Name' or 'path/file.py:Name', got {ref!r}"
        )
    if module_name.endswith(".py"):
        module = _import_file(resolve_file(module_name, base_dir, what="Python file"))
    else:
        module = _import_module(module_name, base_dir)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ModelLoadError(f"module {module_name!r} has no attribute {attr!r}") from None


def _import_module(name: str, base_dir: Path | None) -> Any:
    # Appended, not prepended: an installed package of the same name still wins.
    if base_dir is not None and str(base_dir) not in sys.path:
        sys.path.append(str(base_dir))
    try:
        return importlib.import_module(name)
    except Exception as exc:  # an import runs user code: anything can come out
        raise ModelLoadError(
            f"cannot import module {name!r}: {type(exc).__name__}: {exc}; is it installed, "
            "on PYTHONPATH, or next to the config file?"
        ) from exc


def _import_file(path: Path) -> Any:
    """Run a ``.py`` file as a module, once per absolute path; its folder becomes importable
    (appended, as for ``base_dir``), so it can import the modules beside it."""
    path = path.resolve()
    digest = hashlib.blake2b(str(path).encode("utf-8", "surrogatepass"), digest_size=6)
    name = f"parityserve_file_{path.stem}_{digest.hexdigest()}"
    if name in sys.modules:
        return sys.modules[name]
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ModelLoadError(f"cannot import {path}: not a Python source file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it, as import does: dataclasses look it up
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # running the file runs user code: anything can come out
        del sys.modules[name]
        raise ModelLoadError(f"cannot import {path}: {type(exc).__name__}: {exc}") from exc
    return module


def instantiate(factory: Any, options: Mapping[str, Any], *, source: str) -> Any:
    """Call ``factory(**options)``, blaming the options when the signature does not fit."""
    if not callable(factory):
        raise ModelLoadError(f"{source}: {factory!r} is not a class or callable")
    try:
        return factory(**options)
    except TypeError as exc:
        raise ModelLoadError(
            f"{source}: cannot construct with options {dict(options)}: {exc}"
        ) from exc
    except Exception as exc:
        raise ModelLoadError(f"{source}: constructor raised {type(exc).__name__}: {exc}") from exc


def resolve_file(path: str, base_dir: Path | None, *, what: str) -> Path:
    """A path relative to the config file's folder; the file must exist."""
    resolved = Path(path).expanduser()
    if not resolved.is_absolute() and base_dir is not None:
        resolved = base_dir / resolved
    if not resolved.is_file():
        raise ModelLoadError(f"{what} {resolved} does not exist; check the path in the config")
    return resolved
