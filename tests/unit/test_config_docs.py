"""docs/configuration.md is generated from parityserve/config.py and must equal it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from pydantic import Field

from parityserve.config import BatchingConfig

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_config_docs",
                                                  ROOT / "scripts" / "gen_config_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_page_is_what_the_models_generate() -> None:
    gen = _generator()
    assert (ROOT / "docs" / "configuration.md").read_text() == gen.render(), \
        "docs/configuration.md is stale: run python scripts/gen_config_docs.py"


def test_every_setting_of_every_section_is_on_the_page() -> None:
    gen = _generator()
    page = gen.render()
    for path, model in gen._sections(gen.ServingConfig):
        assert f"## {model.__name__}" in page
        for name in model.model_fields:
            assert f"| `{name}` |" in page, f"{path or 'top level'}: {name} missing"


def test_a_new_setting_changes_the_page() -> None:
    gen = _generator()

    class Wider(BatchingConfig):
        spill_ms: float = Field(3.0, ge=0, description="a setting added later")

    rows = gen._section("models[].batching", Wider)
    assert "| `spill_ms` | float | 3.0 | >= 0 | a setting added later |" in rows
