"""A hand-written loop with `phalanx.Checkpointer` (no Trainer) on the real SLURM cluster:
`scancel --signal=USR2` -> checkpoint -> requeue -> resume, final weights bitwise equal.

Also the srun mode's USR2 case: test_preemption.py runs the Trainer's only under torchrun."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cluster.test_preemption import assert_same_final, output, submit, wait_for
from tests.support.procs import VENV_BIN, run
from tests.support.slurm_cluster import SlurmCluster

WORKER = str(Path(__file__).parents[1] / "support" / "hand_loop_worker.py")
TRAIN = ("loop.max_steps=400", "loop.mark_at_step=20", "checkpoint.every_steps=16",
         "checkpoint.sharded=true", "checkpoint.async_save=true")  # fmt: skip
SRUN = "srun -n 2 --kill-on-bad-exit=1 python"
pytestmark = pytest.mark.cluster


@pytest.mark.timeout(300)
def test_hand_loop_usr2_checkpoints_requeues_and_resumes_bitwise(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    ref = tmp_path / "reference"
    result = run([str(VENV_BIN / "phalanx"), "run", "-n", "2", WORKER, f"run.dir={ref}",
                  *TRAIN], timeout=240)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "run"
    job = submit(slurm, tmp_path, SRUN, run_dir, worker=WORKER, train=TRAIN)
    wait_for(run_dir / "marker-0.txt", job, slurm)
    slurm.command(["scancel", "--signal=USR2", job])
    state = slurm.wait(job, 200)
    info = slurm.job(job)
    assert state == "COMPLETED" and info.get("Restarts") == "1", (info, output(tmp_path))
    starts = [int(s) for s in (run_dir / "starts-rank-0.txt").read_text().split()]
    # Resumed from the stop's checkpoint, not the periodic one of step 16. This loop agrees
    # before each step, so a signal that comes right after the step-20 marker stops it at 20.
    assert starts[0] == 1 and 21 <= starts[1] < 400, starts
    text = output(tmp_path)
    assert f"stopped at step {starts[1] - 1} by signal SIGUSR2" in text, text
    assert "requeueing job" in text
    assert_same_final(run_dir, ref)
    steps = [json.loads(line)["step"] for line in (run_dir / "ids-rank-1.jsonl").open()]
    assert sorted(set(steps)) == list(range(1, 401))
