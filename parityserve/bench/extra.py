"""The ``bench`` extra: what measuring needs beyond serving, and a clear word when it is gone.

A plain ``pip install parityserve`` serves (and runs ``parityserve demo``) without aiohttp and
matplotlib. ``parityserve bench overhead`` and the experiments under ``benchmarks/`` need both:
aiohttp keeps the load generator's own cost per request low enough not to hide the server's,
and matplotlib draws the plots. They check at the start, not after an hour of measuring.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from parityserve.errors import ParityServeError

__all__ = ["BENCH_MODULES", "INSTALL_HINT", "require_bench_extra"]

BENCH_MODULES = ("aiohttp", "matplotlib")
INSTALL_HINT = "pip install 'parityserve[bench]'"


def require_bench_extra(what: str, modules: Sequence[str] | None = None) -> None:
    """Raise a one-line ``ParityServeError`` naming the install command if a module of
    ``modules`` (default: all of ``BENCH_MODULES``) cannot be imported."""
    missing = [name for name in modules or BENCH_MODULES if not _importable(name)]
    if missing:
        raise ParityServeError(f"{what} needs {' and '.join(missing)}, which a plain install "
                               f"leaves out: {INSTALL_HINT}")


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True
