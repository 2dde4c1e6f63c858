"""Which process prints a start-up error: rank 0 under every launcher it runs under.

Each case lists the environments of all processes of one job; exactly one must be first.
"""

from __future__ import annotations

import pytest

from phalanx.env import is_first_process, reports_start_error
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


SIBLING_KILLERS = {
    name: JOBS[name] for name in ("plain-torchrun", "hydra", "torchrun-per-mpi-rank")
}


@pytest.mark.parametrize("environs", SIBLING_KILLERS.values(), ids=SIBLING_KILLERS.keys())
def test_under_launchers_that_stop_the_rest_on_a_failure_every_process_reports(
    environs: list[Env],
) -> None:
    # torchrun and mpirun kill the other processes when the first one exits with an error: a
    # process that waited for rank 0 to print could lose the only line of the job.
    assert all(reports_start_error(environ) for environ in environs)


def test_srun_tasks_leave_the_report_to_the_first() -> None:
    assert [reports_start_error(environ) for environ in JOBS["srun"]] == [True, False, False, False]
