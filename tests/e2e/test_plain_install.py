"""A plain ``pip install parityserve`` serves: no module of the ``bench`` or ``ray`` extras is
needed.

The check (``plain_install_check.py``) runs in a subprocess whose import system refuses every
module that only those extras bring: aiohttp, matplotlib, ray and whatever they pull in that
serving does not. The list comes from the installed packages' own metadata and
``pyproject.toml``, so a new extra-only dependency is refused here without anyone updating
this file.
``make check-plain-install`` runs the same check in a fresh venv with a real plain install.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).parents[2]
CHECK = Path(__file__).with_name("plain_install_check.py")

# Installed into the subprocess as sitecustomize: it runs before anything else is imported.
REFUSER = '''
import os, sys

class _RefuseBenchOnly:
    refused = frozenset(os.environ["PARITYSERVE_REFUSE_MODULES"].split(","))

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.refused:
            raise ModuleNotFoundError(f"No module named {name!r} (a plain install)", name=name)
        return None

sys.meta_path.insert(0, _RefuseBenchOnly())
'''


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _closure(requirements: Iterable[str]) -> set[str]:
    """Every installed distribution that ``requirements`` pull in, their extras included."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = _canonical(req.name)
        if name in seen or name == "parityserve" or not _installed(name):
            continue
        seen.add(name)
        for line in md.requires(name) or []:
            sub = Requirement(line)
            wanted = [{"extra": e} for e in req.extras] or [{"extra": ""}]
            if sub.marker is None or any(sub.marker.evaluate(env) for env in wanted):
                todo.append(sub)
    return seen


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _installed(name: str) -> bool:
    try:
        md.distribution(name)
    except md.PackageNotFoundError:
        return False
    return True


def bench_only_modules() -> set[str]:
    """Top-level modules that the bench and ray extras bring and a plain install does not."""
    project = _project()
    core = _closure(project["dependencies"])
    extras = project["optional-dependencies"]
    bench_only = _closure([*extras["bench"], *extras["ray"]]) - core
    owners = md.packages_distributions()
    return {module for module, dists in owners.items()
            if {_canonical(d) for d in dists} <= bench_only}


def test_the_refused_modules_cover_the_bench_extra() -> None:
    refused = bench_only_modules()
    assert {"aiohttp", "matplotlib"} <= refused
    assert "ray" in refused  # the local launcher, the default, serves without Ray
    assert not refused & {"numpy", "starlette", "uvicorn", "httpx", "zmq", "yaml", "sklearn"}


def test_the_server_starts_and_answers_without_the_bench_extra(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(REFUSER)
    env = {**os.environ, "PARITYSERVE_REFUSE_MODULES": ",".join(sorted(bench_only_modules())),
           "PARITYSERVE_HOME": str(tmp_path / "home"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path),
                                                      os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(CHECK)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=180, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK: served" in done.stdout and "on httpx" in done.stdout
