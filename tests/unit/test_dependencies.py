"""pyproject.toml: a plain install pulls only what serving needs; the experiments' packages
come with the ``bench`` extra, which ``dev`` pulls in so that ``make test`` has them."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from parityserve.bench.extra import BENCH_MODULES

PROJECT = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
BENCH_ONLY = {"aiohttp", "matplotlib"}


def _names(requirements: list[str]) -> set[str]:
    return {Requirement(r).name.lower() for r in requirements}


def test_core_dependencies_hold_no_bench_only_package() -> None:
    assert not _names(PROJECT["dependencies"]) & BENCH_ONLY


def test_the_bench_extra_holds_them_and_dev_pulls_it_in() -> None:
    extras = PROJECT["optional-dependencies"]
    assert _names(extras["bench"]) == BENCH_ONLY == set(BENCH_MODULES)
    assert "parityserve[bench]" in extras["dev"]


def test_torch_stays_pinned_and_out_of_the_core() -> None:
    assert PROJECT["optional-dependencies"]["torch"] == ["torch==2.13.0"]
    assert "torch" not in _names(PROJECT["dependencies"])


def test_ray_is_an_extra_that_dev_pulls_in() -> None:
    extras = PROJECT["optional-dependencies"]
    assert "ray" not in _names(PROJECT["dependencies"])
    assert _names(extras["ray"]) == {"ray"}
    assert "parityserve[ray]" in extras["dev"]


def test_only_the_ray_launcher_imports_ray() -> None:
    """A plain install never loads Ray: the two Ray launchers' modules import it (replicas;
    graph operators, issue 41), and only the launcher factories (lazily) import them."""
    import ast

    package = Path(__file__).parents[2] / "parityserve"
    importers = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "ray" or n.startswith("ray.") for n in names):
                importers.add(path.relative_to(package).as_posix())
    assert importers == {"runtime/fleet/ray_launcher.py", "runtime/fleet/ray_operators.py"}


def test_sniffio_is_a_core_dependency_and_httpcore_finds_it() -> None:
    """Without it, httpcore searches sys.path for sniffio on every async lock it makes
    (a failed import is never cached): about 60 us more per lock, several per request."""
    import asyncio

    from httpcore._synchronization import current_async_library

    assert "sniffio" in _names(PROJECT["dependencies"])
    import sniffio  # noqa: F401  (installed with the package)

    async def library() -> str:
        return current_async_library()
    assert asyncio.run(library()) == "asyncio"
