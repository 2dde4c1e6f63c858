"""`phalanx doctor` inside a SLURM job step: it sees the job, finds scontrol, detects the srun
task, --bandwidth runs its all-reduce through `phalanx run` under the step, and --preflight
checks the ranks of a step over both nodes within 5 s."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cluster.test_slurm import EXPORT_MASTER_ADDR
from tests.support.procs import VENV_BIN
from tests.support.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.cluster


@pytest.mark.timeout(200)
def test_doctor_in_a_job_step(slurm: SlurmCluster, tmp_path: Path) -> None:
    script = "\n".join((
        "#!/bin/bash",
        f"#SBATCH --output={tmp_path}/job.out",
        f"#SBATCH --error={tmp_path}/job.err",
        f'export PATH="{VENV_BIN}:$PATH" OMP_NUM_THREADS=1',
        EXPORT_MASTER_ADDR,
        "srun -n 1 phalanx doctor --json > " + str(tmp_path / "checks.jsonl"),
        "srun -n 1 phalanx doctor --bandwidth -n 2 --sizes-mb 1 --iters 3",
        "srun -N 2 --ntasks-per-node=1 phalanx doctor --preflight -n 1 | grep '^preflight:'",
        "",
    ))  # fmt: skip
    job = slurm.sbatch(script, "-N2", "--ntasks-per-node=1")
    state = slurm.wait(job, 150)
    out = (tmp_path / "job.out").read_text()
    err = (tmp_path / "job.err").read_text()
    assert state == "COMPLETED", (slurm.job(job), out, err)
    checks = {c["name"]: c for c in map(json.loads, (tmp_path / "checks.jsonl").open())}
    assert checks["slurm"] == {"status": "ok", "name": "slurm",
                               "detail": f"job {job}, scontrol found"}  # fmt: skip
    assert checks["launcher"]["detail"].startswith("slurm: rank 0 of 1, 1 node(s)")
    assert "all-reduce over 2 ranks on 1 node(s), gloo on cpu:" in out, err
    (line,) = [x for x in out.splitlines() if x.startswith("preflight:")]
    assert line.startswith("preflight: 2 ranks, matrix product"), out
    assert float(line.rsplit(", ", 1)[1].removesuffix(" s")) <= 5.0, line
