"""``make mutate``'s planted bugs and its committed report cannot rot silently.

Each mutant in ``scripts/mutate.py`` is an exact text replacement: when the code it targets is
rewritten, its ``old`` text is gone and the script stops at that mutant; when the unit tests
are moved, the files it runs are gone. Both happened (a reorganised tests/unit, a rewritten
``BackupApplier``) without anything failing. This checks, in well under a second, what a full
run (minutes) would find first, and that the committed report names this list's mutants and
test files that exist.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "benchmarks" / "results" / "mutate"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutate_script", ROOT / "scripts" / "mutate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


MUTANTS = _script().MUTANTS


def test_mutant_names_are_unique() -> None:
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_each_mutant_plants_once_in_its_file_and_names_tests_that_exist(mutant) -> None:
    path = ROOT / mutant.path
    assert path.is_file(), f"{mutant.name}: {mutant.path} does not exist"
    count = path.read_text().count(mutant.old)
    assert count == 1, f"{mutant.name}: its old text occurs {count} times in {mutant.path}"
    assert mutant.new != mutant.old
    missing = [t for t in mutant.tests if not (ROOT / t).is_file()]
    assert mutant.tests and not missing, f"{mutant.name}: no such test files {missing}"


def test_the_committed_report_names_these_mutants_and_tests_that_exist() -> None:
    """A stale report (mutants renamed, test files moved since): rerun ``make mutate``."""
    report = json.loads((REPORT / "mutate.json").read_text())
    outcomes = report["outcomes"]
    assert [o["name"] for o in outcomes] == [m.name for m in MUTANTS]
    assert [o["path"] for o in outcomes] == [m.path for m in MUTANTS]
    gone = sorted({o["failed_test"].split("::")[0] for o in outcomes if o["failed_test"]}
                  - {str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")})
    assert not gone, f"the report names test files that no longer exist: {gone}"
    markdown = (REPORT / "mutate.md").read_text()
    assert all(f"| {o['name']} |" in markdown for o in outcomes)


def test_the_committed_report_names_no_checkout() -> None:
    """The recorded command runs from the project root: no absolute path of one machine."""
    for name in ("command.txt", "mutate.md", "mutate.json"):
        text = (REPORT / name).read_text()
        assert str(ROOT) not in text and "/work/" not in text, name
