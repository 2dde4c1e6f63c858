"""Preemption on the real SLURM cluster: signal -> checkpoint -> requeue -> resume, bitwise.

Each job trains the ckpt_worker (2 ranks, DataLoader workers, dropout, per-sample-seeded
augmentation); rank 0 writes a marker at step 20, the test then signals the job as SLURM would.

Each launch mode runs the cases that differ in it, not every case (each costs ~50 s of the
2-core CI machine): torchrun per node the `scancel --signal=USR2` that torchrun must survive;
srun the partition preemption, the time-limit signal and the plain scancel. The same USR2 path
under srun, resumed bitwise, is test_hand_loop_preemption.py's job (the same PreemptionWatcher
and Checkpointer.stop), and the workers' SIGTERM stop under torchrun is test_elastic.py's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from tests.cluster.test_slurm import EXPORT_MASTER_ADDR
from tests.support.procs import VENV_BIN, run
from tests.support.slurm_cluster import TERMINAL_STATES, SlurmCluster

WORKER = str(Path(__file__).parents[1] / "support" / "ckpt_worker.py")
TRAIN = (
    "train.max_steps=400", "data.num_workers=2", "data.batch_size=4", "train.log_every=100",
    "train.progress=false", "model.dropout=0.1", "fail.mark_at_step=20",
)  # fmt: skip
pytestmark = pytest.mark.cluster


SRUN = "srun -n 2 --kill-on-bad-exit=1 python"
"""One task per rank: each gets SLURM's signals itself."""
TORCHRUN = "srun -n 1 phalanx run -n 2"
"""One `phalanx run` (torchrun) per node: the workers get SLURM's signals, torchrun must ignore
USR2 (phalanx run sets that)."""


def wait_for(path: Path, job_id: str, slurm: SlurmCluster, timeout: float = 60) -> None:
    """Poll for a marker the job writes (with a deadline), failing early if the job ended."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        state = slurm.job(job_id).get("JobState", "")
        assert state not in TERMINAL_STATES, f"job {job_id} is {state}"
        assert time.monotonic() < deadline, f"no {path} after {timeout}s"
        time.sleep(0.1)  # polling a condition with a deadline


def submit(
    slurm: SlurmCluster,
    tmp_path: Path,
    launch: str,
    run_dir: Path,
    extra: tuple[str, ...] = (),
    *,
    worker: str = WORKER,
    train: tuple[str, ...] = TRAIN,
    where: tuple[str, ...] = (),
) -> str:
    """A requeueable 2-rank job running `worker` with `train` + `extra` overrides; its id.
    `where`: sbatch options placing it (default: one node)."""
    script = "\n".join((
        "#!/bin/bash",
        f"#SBATCH --output={tmp_path}/job.out",
        f"#SBATCH --error={tmp_path}/job.err",
        "#SBATCH --time=5",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        f'export PATH="{VENV_BIN}:$PATH" OMP_NUM_THREADS=1',
        EXPORT_MASTER_ADDR,  # the fake node name node2 does not resolve (see test_slurm.py)
        f"{launch} {worker} run.dir={run_dir} {' '.join(train + extra)}",
        "",
    ))  # fmt: skip
    if where:
        return slurm.sbatch(script, *where)
    return slurm.sbatch(script, "-N1", "--ntasks-per-node=2" if "srun -n" in launch else "-n1")


def training_past_step_20(
    slurm: SlurmCluster, tmp_path: Path, launch: str, extra: tuple[str, ...] = ()
) -> tuple[Path, str]:
    """Submit the training job and wait until it wrote its step-20 marker: (run dir, job id)."""
    run_dir = tmp_path / "run"
    job = submit(slurm, tmp_path, launch, run_dir, extra)
    wait_for(run_dir / "marker-0.txt", job, slurm)
    return run_dir, job


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same 2-rank training, never interrupted (phalanx run on this machine). Only read, and
    checkpoint settings do not change training: one run serves every test of the module."""
    run_dir = tmp_path_factory.mktemp("preemption") / "reference"
    result = run([str(VENV_BIN / "phalanx"), "run", "-n", "2", WORKER, f"run.dir={run_dir}",
                  *TRAIN], timeout=240)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def output(tmp_path: Path) -> str:
    return "".join(p.read_text() for p in (tmp_path / "job.out", tmp_path / "job.err")
                   if p.exists())  # fmt: skip


def assert_same_final(run_dir: Path, ref: Path) -> None:
    final = torch.load(run_dir / "final.pt", weights_only=True)
    expected = torch.load(ref / "final.pt", weights_only=True)
    for name in expected:
        assert torch.equal(final[name], expected[name]), name


ASYNC_SAVES = (
    "checkpoint.every_steps=16", "checkpoint.sharded=true", "checkpoint.async_save=true",
    "checkpoint.async_writer=process",
)  # fmt: skip
"""Background saves from DCP's writer processes, which SLURM signals like every other process
of the step: they must survive the signal and write the stop checkpoint."""


@pytest.mark.timeout(300)
def test_usr2_checkpoints_requeues_and_resumes_bitwise(
    slurm: SlurmCluster, tmp_path: Path, reference: Path
) -> None:
    run_dir, job = training_past_step_20(slurm, tmp_path, TORCHRUN, ASYNC_SAVES)
    slurm.command(["scancel", "--signal=USR2", job])
    state = slurm.wait(job, 200)
    info = slurm.job(job)
    assert state == "COMPLETED" and info.get("Restarts") == "1", (info, output(tmp_path))
    starts = [int(s) for s in (run_dir / "starts-rank-0.txt").read_text().split()]
    assert starts[0] == 1 and 21 < starts[1] < 400, starts  # resumed after the checkpoint
    stopped = starts[1] - 1
    assert f"stopped at step {stopped} by signal SIGUSR2" in output(tmp_path), output(tmp_path)
    assert "requeueing job" in output(tmp_path)
    assert_same_final(run_dir, reference)
    ids = [json.loads(line)["step"] for line in (run_dir / "ids-rank-1.jsonl").open()]
    assert sorted(set(ids)) == list(range(1, 401))


@pytest.mark.timeout(200)
def test_plain_scancel_checkpoints_and_ends_without_requeue(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    run_dir, job = training_past_step_20(slurm, tmp_path, SRUN)
    slurm.command(["scancel", job])
    state = slurm.wait(job, 60)
    info = slurm.job(job)
    assert state == "CANCELLED" and info.get("Restarts") == "0", info
    checkpoints = sorted((run_dir / "checkpoints").glob("step-*/meta.json"))
    assert len(checkpoints) == 1, output(tmp_path)  # the final checkpoint of the cancelled run
    step = int(checkpoints[0].parent.name[5:])
    assert 20 <= step < 400


IGNORE_USR2 = 'bash -c \'trap "" USR2; exec "$@"\' task'


@pytest.mark.timeout(220)
def test_time_limit_signal_checkpoints_and_requeues(slurm: SlurmCluster, tmp_path: Path) -> None:
    """`--signal=USR2@50` on a 1-minute job: SLURM signals ahead of the limit, at a moment it
    chooses (here often within seconds of the start). The tasks start with USR2 ignored, as
    job scripts should: a signal during `import torch` would otherwise kill them before phalanx's
    handler exists. If it comes that early it is lost, and phalanx's own time-limit check
    (EndTime from scontrol, 10% margin) checkpoints and requeues instead."""
    run_dir = tmp_path / "run"
    launch = f"srun -n 2 --kill-on-bad-exit=1 {IGNORE_USR2} python"
    script = "\n".join((
        "#!/bin/bash",
        f"#SBATCH --output={tmp_path}/job.out",
        f"#SBATCH --error={tmp_path}/job.err",
        "#SBATCH --time=1",
        "#SBATCH --signal=USR2@50",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        f'export PATH="{VENV_BIN}:$PATH" OMP_NUM_THREADS=1',
        EXPORT_MASTER_ADDR,
        # Many steps: the run must still be training when the signal comes.
        f"{launch} {WORKER} run.dir={run_dir} {' '.join(TRAIN)} train.max_steps=100000",
        "",
    ))  # fmt: skip
    job = slurm.sbatch(script, "-N1", "--ntasks-per-node=2")
    try:
        deadline = time.monotonic() + 170
        while slurm.job(job).get("Restarts", "0") == "0":
            assert time.monotonic() < deadline, (slurm.job(job), output(tmp_path))
            # Any live state (SIGNALING while the time-limit signal is delivered, REQUEUED...);
            # a final one before the requeue is the failure.
            state = slurm.job(job).get("JobState", "")
            assert state not in TERMINAL_STATES, (state, output(tmp_path))
            time.sleep(0.2)  # polling a condition with a deadline
    finally:
        slurm.cancel(job)
    text = output(tmp_path)
    assert "by signal SIGUSR2" in text or "by time limit" in text, text
    assert "requeueing job" in text
    assert list((run_dir / "checkpoints").glob("step-*/meta.json")), text


@pytest.mark.timeout(300)
def test_partition_preemption_requeues_and_resumes_bitwise(
    slurm: SlurmCluster, tmp_path: Path, reference: Path
) -> None:
    run_dir, job = training_past_step_20(slurm, tmp_path, SRUN)
    node = slurm.job(job)["NodeList"]
    high = slurm.sbatch("#!/bin/bash\ntrue\n", "-p", "high", "--exclusive", "-w", node,
                        f"--output={tmp_path}/high.out")  # fmt: skip
    state = slurm.wait(job, 240)
    slurm.wait(high, 30)
    info = slurm.job(job)
    assert state == "COMPLETED" and int(info.get("Restarts", "0")) >= 1, (info, output(tmp_path))
    assert "by signal SIGTERM" in output(tmp_path) and "requeueing job" in output(tmp_path)
    assert_same_final(run_dir, reference)
