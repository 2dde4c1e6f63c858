"""A requeued SLURM job finds its own run directory again (same job id, same home)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cluster.test_slurm import run_job
from tests.support.slurm_cluster import SlurmCluster

CONFIG_PROBE = str(Path(__file__).parents[1] / "support" / "config_probe.py")
pytestmark = pytest.mark.cluster


@pytest.mark.timeout(150)
def test_requeued_job_reuses_its_run_directory(slurm: SlurmCluster, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    body = f"python {CONFIG_PROBE} run.root={root} run.name=rq fail.requeue=true"
    job = run_job(slurm, tmp_path, body, "-N1", "--requeue", "--open-mode=append", timeout=120)
    assert job.state == "COMPLETED", job
    dirs = [p for p in root.iterdir() if p.is_dir()]
    assert [d.name for d in dirs] == [f"rq-{job.job_id}"], job  # one home, named by the job
    first = json.loads((dirs[0] / "probe-0.json").read_text())
    second = json.loads((dirs[0] / "probe-1.json").read_text())  # SLURM_RESTART_COUNT=1
    assert first[0]["run_dir"] == second[0]["run_dir"] == str(dirs[0])
    assert first[0]["dumped"] == second[0]["dumped"]  # the same resolved config both times
    logs = (dirs[0] / "logs" / "rank-0.log").read_text()
    assert logs.count("launcher=local") == 2  # both runs logged into the same file
