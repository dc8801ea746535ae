"""Shared fixtures. The real datasets live outside the repo; tests that need them skip cleanly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The shared data folder from PARITYSERVE_DATA, or skip the test."""
    raw = os.environ.get("PARITYSERVE_DATA")
    if not raw or not Path(raw).is_dir():
        pytest.skip("set PARITYSERVE_DATA to the shared data folder (e.g. ../shared/data)")
    return Path(raw)
