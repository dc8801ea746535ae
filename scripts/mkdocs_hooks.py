"""MkDocs hooks: links from the documentation to files elsewhere in the repository.

The pages cite results files (benchmarks/results/...), deploy manifests and tests by relative
paths, as a reader of the Markdown on a checkout expects. MkDocs only knows files under docs/,
so `mkdocs build --strict` would reject those links. These hooks check that each such file
exists (a missing one is a warning, so the strict build fails and names it), copy it into the
built site under repo/, and point the link there, so the site is complete wherever it is
served.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import shutil
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.plugins.parityserve.links")

_LINK = re.compile(r"(\]\()([^)\s]+)(\))")
_FENCE = re.compile(r"^\s*(```|~~~)")
_LIST_ITEM = re.compile(r"^(?:[-*+]|\d+\.) ")
_SCHEME = "repo:"
_copied: set[str] = set()


def _outside_target(target: str, page_src: str, docs_dir: Path, root: Path) -> str | None:
    """The repository path a relative link points to when it leaves docs/, else None."""
    if "://" in target or target.startswith(("#", "/", "mailto:", _SCHEME)):
        return None
    path = target.split("#", 1)[0]
    if not path:
        return None
    # normpath, not resolve(): a symlinked checkout must keep its own paths
    joined = Path(os.path.normpath(docs_dir / posixpath.dirname(page_src) / path))
    if joined.is_relative_to(docs_dir):
        return None
    if not joined.is_relative_to(root):
        return path  # outside the repository: reported as missing
    return joined.relative_to(root).as_posix()


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs_dir = Path(os.path.normpath(config["docs_dir"]))
    root = docs_dir.parent
    out: list[str] = []
    fenced = False
    for line in markdown.split("\n"):
        if _FENCE.match(line):
            fenced = not fenced
        if not fenced:
            line = _LINK.sub(lambda m: _rewrite(m, page, docs_dir, root), line)
            if _starts_a_list(line, out):
                out.append("")
        out.append(line)
    return "\n".join(out)


def _starts_a_list(line: str, before: list[str]) -> bool:
    """A list right under a paragraph line: GitHub renders it as a list, Python-Markdown as
    running text unless a blank line comes first."""
    if not _LIST_ITEM.match(line) or not before:
        return False
    previous = before[-1]
    return bool(previous.strip()) and not previous.startswith((" ", "|", "#", "<")) \
        and not _LIST_ITEM.match(previous)


def _rewrite(match: re.Match[str], page: Any, docs_dir: Path, root: Path) -> str:
    target = match.group(2)
    rel = _outside_target(target, page.file.src_uri, docs_dir, root)
    if rel is None:
        return match.group(0)
    if not (root / rel).is_file():
        log.warning("%s links to %s, which is not in the repository", page.file.src_uri, rel)
        return match.group(0)
    _copied.add(rel)
    fragment = "#" + target.split("#", 1)[1] if "#" in target else ""
    return f"{match.group(1)}{_SCHEME}{rel}{fragment}{match.group(3)}"


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    # the page's folder in the site, relative to the site's root
    depth = page.file.dest_uri.count("/")
    prefix = "../" * depth + "repo/"
    return html.replace(f'href="{_SCHEME}', f'href="{prefix}').replace(
        f'src="{_SCHEME}', f'src="{prefix}')


def on_post_build(config: Any) -> None:
    root = Path(config["docs_dir"]).parent
    site = Path(config["site_dir"])
    for rel in sorted(_copied):
        dest = site / "repo" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, dest)
