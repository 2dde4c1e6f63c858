"""The tutorials' code blocks run as written, so the docs cannot rot (issue #15).

The marker scheme and the runner are in tests/support/docs_blocks.py; pages whose blocks need
the test SLURM cluster run in tests/cluster/test_docs_slurm.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.docs_blocks import DOCS, ROOT, check_marks, run_page
from tests.support.procs import base_env

TUTORIALS = (
    "quickstart.md",
    "tutorials/mpi-horovod.md",
    "tutorials/large-models.md",
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
