"""Hang detection under srun on the real SLURM cluster: one task per rank, each its own
watchdog; rank 1 blocks after step 30, the job ends FAILED within seconds of the limit, and its
output names rank 1 and the line it is stuck on."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster.test_preemption import output, submit
from tests.support.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.cluster


@pytest.mark.timeout(200)
def test_srun_job_with_a_stuck_task_fails_naming_it(slurm: SlurmCluster, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # No data loader workers: their first batch on a busy machine is no part of this test.
    faults = ("fail.hang_at_step=30", "train.hang_timeout_s=3", "dist.timeout_s=600",
              "data.num_workers=0")  # fmt: skip
    job = submit(slurm, tmp_path, "srun -n 2 --kill-on-bad-exit=1 python", run_dir, faults)
    # Far below the 600 s collective timeout and the job's 5-minute limit.
    state = slurm.wait(job, 120)
    info = slurm.job(job)
    text = output(tmp_path)
    assert state == "FAILED" and info.get("ExitCode") != "0:0", (info, text)
    line = next((x for x in text.splitlines() if "phalanx.hang: hang:" in x), "")
    assert "rank 1 (" in line and "in phase 'after' after step 30" in line, text
    assert "at ckpt_worker.py:" in line and "in on_step_end" in line
    assert list((run_dir / "diagnostics").glob("hang-*.txt")), text
