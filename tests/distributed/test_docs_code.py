"""The tutorials' code blocks run as written, so the docs cannot rot (issue #15).

Each fenced block of a page in TUTORIALS carries a marker in the HTML comment right above it:

- `<!-- file: NAME -->`  the block is saved as NAME in the page's working directory;
- `<!-- run -->`  a bash block, run there with `bash -eu -o pipefail` (optionally
  `expect="TEXT"`: TEXT must appear in its output);
- `<!-- gpu -->`  needs CUDA GPUs: not run here (the only kind of block allowed to skip);
- `<!-- covered-by: PATH -->`  run by the named test, which must exist.

`text` blocks are output shown to the reader and need no marker. An unmarked block fails.
A `diff` block marked `covered-by` this file must equal the unified diff of the two `file:`
blocks its `---` and `+++` lines name (test_diff_blocks_match_their_files).
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.procs import base_env, run

ROOT = Path(__file__).parents[2]
TUTORIALS = (
    "quickstart.md",
    "tutorials/single-gpu-to-phalanx.md",
    "tutorials/multi-gpu.md",
    "tutorials/checkpoints.md",
    "tutorials/trackers.md",
    "tutorials/data-loading.md",
    "tutorials/troubleshooting.md",
)
pytestmark = pytest.mark.dist

_BLOCK = re.compile(
    r"(?:<!--\s*(?P<marker>.*?)\s*-->\n)?```(?P<lang>\w*)[^\n]*\n(?P<body>.*?)```", re.S
)


@dataclass(frozen=True)
class Block:
    marker: str
    lang: str
    body: str


def blocks(page: Path) -> list[Block]:
    found = _BLOCK.finditer(page.read_text())
    return [Block(m["marker"] or "", m["lang"], m["body"]) for m in found if m["lang"] != "text"]


def test_every_block_is_marked() -> None:
    for page in TUTORIALS:
        for block in blocks(ROOT / "docs" / page):
            kind = block.marker.split(":")[0].split()[0] if block.marker else ""
            assert kind in ("file", "run", "gpu", "covered-by"), (page, block.body[:80])
            if kind == "covered-by":
                assert (ROOT / block.marker.split(":", 1)[1].strip()).is_file(), block.marker
            if kind == "run":
                assert block.lang == "bash", (page, block.body[:80])


@pytest.mark.parametrize("page", TUTORIALS)
def test_tutorial_runs_as_written(page: str, tmp_path: Path) -> None:
    src = str(ROOT / "src")
    pythonpath = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    env = base_env({"PYTHONPATH": pythonpath})
    for block in blocks(ROOT / "docs" / page):
        if block.marker.startswith("file:"):
            (tmp_path / block.marker.split(":", 1)[1].strip()).write_text(block.body)
        elif block.marker.startswith("run"):
            cmd = ["bash", "-eu", "-o", "pipefail", "-c", block.body]
            result = run(cmd, timeout=120, env=env, cwd=tmp_path)
            output = result.stdout + result.stderr
            assert result.returncode == 0, f"{page}:\n{block.body}\n{output[-3000:]}"
            expect = re.search(r'expect="([^"]*)"', block.marker)
            assert expect is None or expect[1] in output, f"{page}: {expect}\n{output[-2000:]}"


@pytest.mark.parametrize("page", TUTORIALS)
def test_diff_blocks_match_their_files(page: str) -> None:
    found = blocks(ROOT / "docs" / page)
    files = {
        b.marker.split(":", 1)[1].strip(): b.body for b in found if b.marker.startswith("file:")
    }
    for block in (b for b in found if b.lang == "diff"):
        old, new = (line[4:] for line in block.body.splitlines()[:2])
        diff = difflib.unified_diff(
            files[old].splitlines(keepends=True), files[new].splitlines(keepends=True), old, new
        )
        assert "".join(diff) == block.body, f"{page}: the diff of {old} and {new} changed"


def test_blocks_covered_by_the_quickstart_are_the_quickstarts() -> None:
    quickstart = {b.body for b in blocks(ROOT / "docs" / "quickstart.md")}
    for page in TUTORIALS:
        for block in blocks(ROOT / "docs" / page):
            reused = block.marker == "covered-by: tests/distributed/test_docs_code.py"
            assert not reused or block.lang == "diff" or block.body in quickstart, (page, block)
