"""The tutorials' code blocks run as written, so the docs cannot rot (issue #15).

The marker scheme and the runner are in tests/support/docs_blocks.py; pages whose blocks need
the test SLURM cluster run in tests/cluster/test_docs_slurm.py. A `diff` block marked
`covered-by` this file must equal the unified diff of the two `file:` blocks its `---` and
`+++` lines name (test_diff_blocks_match_their_files).
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from tests.support.docs_blocks import DOCS, ROOT, blocks, check_marks, run_page
from tests.support.procs import base_env

TUTORIALS = (
    "quickstart.md",
    "tutorials/single-gpu-to-phalanx.md",
    "tutorials/multi-gpu.md",
    "tutorials/checkpoints.md",
    "tutorials/trackers.md",
    "tutorials/data-loading.md",
    "tutorials/troubleshooting.md",
    "tutorials/mpi-horovod.md",
    "tutorials/large-models.md",
    "tutorials/lora.md",
    "tutorials/parallel.md",
    "migrating.md",
)
pytestmark = pytest.mark.dist


def test_every_block_is_marked() -> None:
    for page in TUTORIALS:
        check_marks(DOCS / page)


@pytest.mark.parametrize("page", TUTORIALS)
def test_tutorial_runs_as_written(page: str, tmp_path: Path) -> None:
    src = str(ROOT / "src")
    pythonpath = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    # mpirun refuses root (the CI user) unless told so; no other setting reaches the pages.
    mpi = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    run_page(DOCS / page, tmp_path, base_env({"PYTHONPATH": pythonpath, **mpi}))


@pytest.mark.parametrize("page", TUTORIALS)
def test_diff_blocks_match_their_files(page: str) -> None:
    found = blocks(DOCS / page)
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
    quickstart = {b.body for b in blocks(DOCS / "quickstart.md")}
    for page in TUTORIALS:
        for block in blocks(DOCS / page):
            reused = block.marker == "covered-by: tests/distributed/test_docs_code.py"
            assert not reused or block.lang == "diff" or block.body in quickstart, (page, block)
