"""Which process prints a start-up error: rank 0 under every launcher it runs under.

Each case lists the environments of all processes of one job; exactly one must be first.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phalanx.env import is_first_process, prints_start_error, report_start_error
from tests.support.envtables import Env, hydra, openmpi, srun, torchrun


def torchrun_in_tasks(tasks: int, workers: int, **agent: str) -> list[Env]:
    """`srun -n TASKS torchrun --standalone --nproc_per_node=WORKERS`: each agent counts from 0."""
    return [
        {
            **srun(task, task, 0, nodelist="node01", tasks=str(tasks)),
            **torchrun(worker, worker, workers, workers, GROUP_WORLD_SIZE="1", **agent),
        }
        for task in range(tasks)
        for worker in range(workers)
    ]


def torchrun_across_nodes(nodes: int, workers: int) -> list[Env]:
    """`srun --ntasks-per-node=1 phalanx run`: one rendezvous, RANK counts the whole job, and
    c10d may give rank 0 to any node (SLURM_PROCID of rank 0's node need not be 0)."""
    world = nodes * workers
    return [
        {
            **srun((node + 1) % nodes, 0, (node + 1) % nodes, tasks=f"1(x{nodes})"),
            **torchrun(node * workers + w, w, world, workers, GROUP_WORLD_SIZE=str(nodes)),
        }
        for node in range(nodes)
        for w in range(workers)
    ]


JOBS = {
    "srun": [srun(rank, rank % 2, rank // 2) for rank in range(4)],
    "plain-torchrun": [torchrun(rank, rank, 2, 2, GROUP_WORLD_SIZE="1") for rank in range(2)],
    "torchrun-double-spawn-in-srun": torchrun_in_tasks(2, 2),
    "torchrun-across-nodes": torchrun_across_nodes(2, 2),
    # mpirun inside sbatch: every rank inherits the batch step's SLURM_PROCID=0.
    "openmpi-in-sbatch": [{**srun(0, 0, 0), **openmpi(rank, 2, rank, 2)} for rank in range(2)],
    "hydra": [hydra(rank, 3, rank, 3) for rank in range(3)],
    "torchrun-per-mpi-rank": [
        {**openmpi(rank, 2, rank, 2), **torchrun(w, w, 2, 2, GROUP_WORLD_SIZE="1")}
        for rank in range(2)
        for w in range(2)
    ],
    "no-launcher": [{}],
    "garbage-rank-is-the-same-everywhere": [
        srun(rank, rank, 0, nodelist="n1", tasks="2", RANK="x") for rank in range(2)
    ],
}


@pytest.mark.parametrize("environs", JOBS.values(), ids=JOBS.keys())
def test_exactly_one_process_of_a_job_is_first(environs: list[Env]) -> None:
    assert [is_first_process(environ) for environ in environs].count(True) == 1


@pytest.mark.parametrize("name", ["hydra", "openmpi-in-sbatch", "torchrun-per-mpi-rank"])
def test_under_mpirun_every_rank_prints(name: str) -> None:
    # mpirun kills the other ranks when the first one exits with an error, and it has no
    # error file: a rank that left the line to rank 0 could lose the only line of the job.
    assert all(prints_start_error(environ) for environ in JOBS[name])


@pytest.mark.parametrize("name", ["srun", "plain-torchrun", "torchrun-across-nodes"])
def test_under_srun_and_torchrun_only_the_first_prints(name: str) -> None:
    # srun lets each task run to its end; torchrun shows the first failed worker's error file.
    assert [prints_start_error(environ) for environ in JOBS[name]].count(True) == 1


def test_under_srun_killing_on_a_bad_exit_every_task_prints() -> None:
    # SLURM_KILL_BAD_EXIT=1 (phalanx submit's scripts): srun stops the other tasks when the
    # first one fails, maybe before task 0 prints; torchrun workers inside keep their rule.
    kill = {"SLURM_KILL_BAD_EXIT": "1"}
    tasks = [{**environ, **kill} for environ in JOBS["srun"]]
    assert all(prints_start_error(environ) for environ in tasks)
    workers = [{**environ, **kill} for environ in JOBS["torchrun-across-nodes"]]
    assert [prints_start_error(environ) for environ in workers].count(True) == 1
    off = [{**environ, "SLURM_KILL_BAD_EXIT": "0"} for environ in JOBS["srun"]]
    assert [prints_start_error(environ) for environ in off].count(True) == 1


def test_the_line_reaches_torchruns_error_file_on_every_worker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = [tmp_path / f"error-{rank}.json" for rank in range(2)]
    for rank, path in enumerate(files):
        environ = {**torchrun(rank, rank, 2, 2), "TORCHELASTIC_ERROR_FILE": str(path)}
        report_start_error("error: bad", environ)
    assert [json.loads(p.read_text())["message"]["message"] for p in files] == ["error: bad"] * 2
    assert capsys.readouterr().err == "error: bad\n"  # printed once, by rank 0
