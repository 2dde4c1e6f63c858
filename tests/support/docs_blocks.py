"""The marked code blocks of a tutorial page, and running them in order (issue #15).

Each fenced block carries a marker in the HTML comment right above it:

- `<!-- file: NAME -->`  the block is saved as NAME in the page's working directory;
- `<!-- run -->`  a bash block, run there with `bash -eu -o pipefail` (optionally
  `expect="TEXT"`: TEXT must appear in its output; `same="PREFIX"`: its last output line that
  starts with PREFIX must equal that of the page's first block marked with the same PREFIX —
  for values that agree between runs but whose digits depend on the CPU, such as a checksum
  of weights trained with float arithmetic);
- `<!-- gpu -->`  needs CUDA GPUs: not run here (the only kind of block allowed to skip);
- `<!-- covered-by: PATH -->`  run by the named test, which must exist.

`text` blocks are output shown to the reader and need no marker. An unmarked block fails.
Used by tests/distributed/test_docs_code.py (CPU pages) and tests/cluster/test_docs_slurm.py
(pages whose blocks need the test SLURM cluster).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.support.procs import run

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs"
KINDS = ("file", "run", "gpu", "covered-by")

_BLOCK = re.compile(
    r"(?:<!--\s*(?P<marker>.*?)\s*-->\n)?```(?P<lang>\w*)[^\n]*\n(?P<body>.*?)```", re.S
)


@dataclass(frozen=True)
class Block:
    marker: str
    lang: str
    body: str


def blocks(page: Path) -> list[Block]:
    """The page's code blocks other than `text` (shown output), in order."""
    found = _BLOCK.finditer(page.read_text())
    return [Block(m["marker"] or "", m["lang"], m["body"]) for m in found if m["lang"] != "text"]


def check_marks(page: Path) -> None:
    """Every block is marked with a known kind; covered-by names an existing file."""
    for block in blocks(page):
        kind = block.marker.split(":")[0].split()[0] if block.marker else ""
        assert kind in KINDS, (page.name, block.body[:80])
        if kind == "covered-by":
            assert (ROOT / block.marker.split(":", 1)[1].strip()).is_file(), block.marker
        if kind == "run":
            assert block.lang == "bash", (page.name, block.body[:80])


def run_page(page: Path, cwd: Path, env: Mapping[str, str], timeout: float = 120) -> None:
    """Save the file blocks and run the run blocks of `page` in `cwd`, in page order."""
    first_seen: dict[str, str] = {}  # same="PREFIX" -> the line the first such block printed
    for block in blocks(page):
        if block.marker.startswith("file:"):
            path = cwd / block.marker.split(":", 1)[1].strip()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.body)
        elif block.marker.startswith("run"):
            cmd = ["bash", "-eu", "-o", "pipefail", "-c", block.body]
            result = run(cmd, timeout=timeout, env=env, cwd=cwd)
            output = result.stdout + result.stderr
            assert result.returncode == 0, f"{page.name}:\n{block.body}\n{output[-3000:]}"
            expect = re.search(r'expect="([^"]*)"', block.marker)
            assert expect is None or expect[1] in output, (
                f"{page.name}: {expect[1]!r} not in the output of\n{block.body}\n{output[-2000:]}"
            )
            same = re.search(r'same="([^"]*)"', block.marker)
            if same is not None:
                lines = [line for line in output.splitlines() if line.startswith(same[1])]
                assert lines, f"{page.name}: no line {same[1]!r}... in the output of\n{block.body}"
                first = first_seen.setdefault(same[1], lines[-1])
                assert lines[-1] == first, f"{page.name}: {lines[-1]!r}, earlier {first!r}"
