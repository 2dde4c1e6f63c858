"""The SLURM tutorials run as written on the test cluster (issue #15: SLURM blocks on CI's cluster).

The pages show what a user types on a login node (`phalanx submit …`, `squeue`, `scancel`); the
test supplies only the environment that login node would have: SLURM_CONF of the session's
two-node cluster, the venv on PATH (sbatch hands it to the job), and an empty directory.
Marker scheme: tests/support/docs_blocks.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.docs_blocks import DOCS, ROOT, check_marks, run_page
from tests.support.slurm_cluster import SlurmCluster

SLURM_TUTORIALS = ("tutorials/slurm.md", "tutorials/environments.md")
pytestmark = pytest.mark.cluster


def test_every_block_is_marked() -> None:
    for page in SLURM_TUTORIALS:
        check_marks(DOCS / page)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("page", SLURM_TUTORIALS)
def test_slurm_tutorial_runs_as_written(slurm: SlurmCluster, page: str, tmp_path: Path) -> None:
    src = str(ROOT / "src")
    pythonpath = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    run_page(DOCS / page, tmp_path, {**slurm.env, "PYTHONPATH": pythonpath})
