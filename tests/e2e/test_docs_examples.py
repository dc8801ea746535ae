"""Every code block the documentation marks runnable is run, as a user would run it.

A block is runnable when the line before its fence is ``<!-- runnable: KIND -->`` (yaml,
shell or python; the comment is invisible on the site). Every YAML block passes
``parityserve validate``. A page with shell or Python blocks has one YAML block: the test
serves it with ``parityserve start`` on free ports, then runs each block against it with
those ports in place of the page's 8000 (HTTP) and 8001 (gRPC).

README.md's "Serving your own model" is run too: its model file and YAML written into a
folder, validated, served, and each curl's reply checked against the reply the README shows.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from parityserve.bench.ports import free_port
from parityserve.bench.serverproc import ServerProcess

pytestmark = pytest.mark.e2e

DOCS = Path(__file__).resolve().parents[2] / "docs"
PARITYSERVE = str(Path(sys.executable).with_name("parityserve"))
_BLOCK = re.compile(r"^<!-- runnable: (\w+) -->\n```\w*\n(.*?)^```", re.S | re.M)
KINDS = ("yaml", "shell", "python")


@dataclass(frozen=True)
class Block:
    page: str
    kind: str
    code: str
    line: int

    def __str__(self) -> str:
        return f"{self.page}:{self.line} ({self.kind})"


def runnable_blocks(text: str, page: str) -> list[Block]:
    return [Block(page, m.group(1), m.group(2), text.count("\n", 0, m.start()) + 2)
            for m in _BLOCK.finditer(text)]


def all_blocks() -> list[Block]:
    return [b for p in sorted(DOCS.rglob("*.md"))
            for b in runnable_blocks(p.read_text(), p.relative_to(DOCS).as_posix())]


def test_the_marker_finds_blocks_and_their_kinds() -> None:
    text = ("x\n<!-- runnable: yaml -->\n```yaml\na: 1\n```\n"
            "```python\nnot marked\n```\n<!-- runnable: python -->\n```python\nprint(1)\n```\n")
    blocks = runnable_blocks(text, "p.md")
    assert [(b.kind, b.code, b.line) for b in blocks] == [("yaml", "a: 1\n", 3),
                                                          ("python", "print(1)\n", 10)]


def test_the_docs_have_runnable_examples_of_each_kind() -> None:
    blocks = all_blocks()
    assert all(b.kind in KINDS for b in blocks), [str(b) for b in blocks if b.kind not in KINDS]
    kinds = {b.kind for b in blocks}
    assert kinds == set(KINDS), f"runnable kinds found: {kinds}"
    print(f"{len(blocks)} runnable blocks: " + ", ".join(map(str, blocks)))


@pytest.mark.parametrize("block", [b for b in all_blocks() if b.kind == "yaml"], ids=str)
def test_every_yaml_block_validates(block: Block, tmp_path: Path) -> None:
    config = tmp_path / "serving.yaml"
    config.write_text(block.code)
    done = subprocess.run([PARITYSERVE, "validate", "-c", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{block}: {done.stdout}{done.stderr}"


def _pages_with_clients() -> list[str]:
    return sorted({b.page for b in all_blocks() if b.kind != "yaml"})


@pytest.mark.parametrize("page", _pages_with_clients())
def test_the_pages_examples_run_against_a_real_server(page: str, tmp_path: Path) -> None:
    blocks = runnable_blocks((DOCS / page).read_text(), page)
    configs = [b for b in blocks if b.kind == "yaml"]
    assert len(configs) == 1, f"{page}: shell or python blocks need exactly one yaml block"
    http, grpc = free_port(), free_port()

    def ported(code: str) -> str:
        # the page's ports are 8000 and 8001; these are the test's free ones
        return code.replace(":8001", f":{grpc}").replace(":8000", f":{http}") \
                   .replace("http_port: 8000", f"http_port: {http}") \
                   .replace("grpc_port: 8001", f"grpc_port: {grpc}")

    config = tmp_path / "examples.yaml"
    config.write_text(ported(configs[0].code))
    with ServerProcess(config, port=http):
        for block in blocks:
            if block.kind != "yaml":
                _run(block, ported(block.code), tmp_path)


def _run(block: Block, code: str, folder: Path) -> None:
    script = folder / ("example.py" if block.kind == "python" else "example.sh")
    script.write_text(code if block.kind == "python" else "set -euo pipefail\n" + code)
    command = [sys.executable, str(script)] if block.kind == "python" else ["bash", str(script)]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env,
                          cwd=folder)
    assert done.returncode == 0, f"{block} failed:\n{done.stdout}{done.stderr}"


# ---- README.md's own example ------------------------------------------------------------------
README = DOCS.parent / "README.md"
_FENCED = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
_CURL_AND_REPLY = re.compile(r"^(curl .*)\n# (\{.*\})$", re.M)


def readme_own_model(text: str) -> dict[str, str]:
    """The code blocks of the README's "Serving your own model", by language."""
    section = text.split("\n## Serving your own model\n", 1)[1].split("\n## ", 1)[0]
    return {kind: code for kind, code in _FENCED.findall(section)}


def expected_reply(comment: str) -> dict[str, object]:
    """The fields a reply shown as ``{"a":1,...}`` promises (``...`` stands for the rest)."""
    return json.loads(comment.replace(",...}", "}"))


def test_the_readmes_reply_comment_reads_as_a_subset() -> None:
    assert expected_reply('{"output":[3.0,4.0],"default":false,...}') == {
        "output": [3.0, 4.0], "default": False}


def test_the_readmes_own_model_answers_as_the_readme_says(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = readme_own_model(README.read_text())
    assert set(blocks) == {"python", "yaml", "bash"}, sorted(blocks)
    http, grpc = free_port(), free_port()
    monkeypatch.chdir(tmp_path)  # the user's folder, holding both files
    (tmp_path / "mymodel.py").write_text(blocks["python"])
    config = tmp_path / "serving.yaml"
    config.write_text(blocks["yaml"].replace("http_port: 8000",
                                             f"http_port: {http}, grpc_port: {grpc}"))
    done = subprocess.run([PARITYSERVE, "validate", "-c", str(config)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    asked = _CURL_AND_REPLY.findall(blocks["bash"])
    assert asked, "no curl line followed by its reply in the README's example"
    with ServerProcess(config, port=http):
        for curl, comment in asked:
            reply = subprocess.run(["bash", "-c", curl.replace(":8000", f":{http}")],
                                   capture_output=True, text=True, timeout=60, check=True)
            got = json.loads(reply.stdout)
            promised = expected_reply(comment)
            assert {k: got.get(k) for k in promised} == promised, reply.stdout
