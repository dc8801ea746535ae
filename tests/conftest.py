"""Shared fixtures. The real datasets live outside the repo; tests that need them skip cleanly."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The shared data folder from PARITYSERVE_DATA, or skip the test."""
    raw = os.environ.get("PARITYSERVE_DATA")
    if not raw or not Path(raw).is_dir():
        pytest.skip("set PARITYSERVE_DATA to the shared data folder (e.g. ../shared/data)")
    return Path(raw).resolve()  # a relative path (the hint above) must not depend on the cwd


@pytest.fixture(scope="session", autouse=True)
def parityserve_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Tests never touch ~/.parityserve: servers write, and clients read, the token here."""
    home = tmp_path_factory.mktemp("parityserve-home")
    saved = {k: os.environ.pop(k, None) for k in ("PARITYSERVE_HOME", "PARITYSERVE_ADMIN_TOKEN")}
    os.environ["PARITYSERVE_HOME"] = str(home)
    yield home
    for key, value in saved.items():
        os.environ.pop(key, None)
        if value is not None:
            os.environ[key] = value
