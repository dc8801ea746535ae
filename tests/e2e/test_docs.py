"""The documentation site builds strictly, and README.md's links all resolve.

`mkdocs build --strict` fails on a broken link or anchor between pages, and
scripts/mkdocs_hooks.py makes a link to a missing repository file (a results record) a warning
too. README.md is read on GitHub and PyPI, not built, so its links are checked here: each
relative file exists, and each anchor is a heading of the file it points into.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6} (.+)$", re.M)
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                           str(config), "--site-dir", str(site)],
                          capture_output=True, text=True, timeout=300,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    for page in ("index.html", "configuration/index.html", "hams/index.html",
                 "results/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    # a results file a page links to travels with the site
    assert (tmp_path / "site/repo/benchmarks/results/hams/hams.md").is_file()


def _copy_of_the_repo(tmp_path: Path) -> Path:
    """docs/ copied (to be broken), everything else the build reads linked."""
    copy = tmp_path / "repo"
    copy.mkdir()
    shutil.copytree(ROOT / "docs", copy / "docs")
    for name in ("mkdocs.yml", "scripts", "benchmarks", "deploy", "tests", "parityserve",
                 "README.md", "Makefile"):
        (copy / name).symlink_to(ROOT / name)
    return copy


@pytest.mark.parametrize("broken, named", [
    ("[r](../benchmarks/results/no-such-run/table.md)", "benchmarks/results/no-such-run"),
    ("[a](hams.md#no-such-heading)", "no-such-heading"),
    ("[p](no-such-page.md)", "no-such-page.md"),
])
def test_a_broken_link_fails_the_build_and_is_named(tmp_path: Path, broken: str,
                                                    named: str) -> None:
    copy = _copy_of_the_repo(tmp_path)
    page = copy / "docs" / "limits.md"
    page.write_text(page.read_text() + f"\n{broken}\n")
    done = _build(copy / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert named in done.stderr


def slug(heading: str) -> str:
    """GitHub's anchor for a heading (MkDocs' toc makes the same for these headings)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    return {slug(h) for h in _HEADING.findall(_FENCE.sub("", markdown))}


def broken_links(markdown: str, where: Path) -> list[str]:
    """Relative links in ``markdown`` (a file in folder ``where``) that do not resolve."""
    problems = []
    for target in _LINK.findall(_FENCE.sub("", markdown)):
        if "://" in target or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        file = (where / path).resolve() if path else None
        if file is not None and not file.exists():
            problems.append(f"{target}: no such file")
        elif anchor and (file is None or file.suffix == ".md"):
            text = file.read_text() if file is not None else markdown
            if anchor not in anchors(text):
                problems.append(f"{target}: no such heading")
    return problems


def test_the_link_checker_finds_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n## A part (`x`)\n")
    text = ("# Top\n[ok](other.md#a-part-x) [ok](#top) ![img](other.md)\n"
            "[gone](missing.md) [bad](other.md#nowhere) [bad](#bottom)\n"
            "```\n[in code](ignored.md)\n```\n")
    assert broken_links(text, tmp_path) == ["missing.md: no such file",
                                            "other.md#nowhere: no such heading",
                                            "#bottom: no such heading"]


def test_every_link_in_the_readme_resolves() -> None:
    readme = (ROOT / "README.md").read_text()
    assert _LINK.search(readme), "README.md has no links: the check would prove nothing"
    assert broken_links(readme, ROOT) == []


def test_the_readme_is_a_landing_page() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


# ---- the results record -----------------------------------------------------------------------
RESULTS = "benchmarks/results"
RESULTS_BUDGET_BYTES = 5_000_000


def _tracked(under: str) -> list[str]:
    """Files git tracks under ``under`` (skips outside a checkout: an sdist has no history)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "-z", under], cwd=ROOT, capture_output=True,
                         check=True).stdout.decode()
    return [name for name in out.split("\0") if name]


def results_links(markdown: str, where: Path) -> list[str]:
    """Repository paths under benchmarks/results that ``markdown`` (in ``where``) links to."""
    linked = []
    for target in _LINK.findall(_FENCE.sub("", markdown)):
        path = target.partition("#")[0]
        if not path or "://" in path:
            continue
        rel = Path(os.path.relpath(os.path.normpath(where / path), ROOT)).as_posix()
        if rel == RESULTS or rel.startswith(RESULTS + "/"):
            linked.append(rel)
    return linked


def test_the_results_link_finder_reads_relative_links() -> None:
    page = ("[a](../../benchmarks/results/x/t.md#h) [b](other.md) "
            "![p](../../benchmarks/results/p.png)")
    assert results_links(page, ROOT / "docs" / "results") == [
        "benchmarks/results/x/t.md", "benchmarks/results/p.png"]


def test_every_results_file_linked_from_the_readme_and_the_docs_is_committed() -> None:
    tracked = set(_tracked(RESULTS))
    folders = {str(Path(name).parent) for name in tracked}
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    missing = [f"{page.relative_to(ROOT)} -> {rel}" for page in pages
               for rel in results_links(page.read_text(), page.parent)
               if rel.rstrip("/") not in tracked and not any(
                   f == rel.rstrip("/") or f.startswith(rel.rstrip("/") + "/") for f in folders)]
    assert missing == []


def test_the_results_folder_stays_under_its_budget() -> None:
    # tracked files as they are in the working tree (a benchmark may be rewriting one now)
    sizes = {name: (ROOT / name).stat().st_size for name in _tracked(RESULTS)
             if (ROOT / name).is_file()}
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
    assert total < RESULTS_BUDGET_BYTES, f"{total:,} bytes; largest: {largest}"
