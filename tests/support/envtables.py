"""Launcher environment tables shared by the pure tests: the variables each launcher exports.

Names come from torchrun, OpenMPI, Hydra / Intel MPI and slurmstepd. Values are strings, as in
os.environ.
"""

from __future__ import annotations

import re

from phalanx.env import FIELDS, ClusterEnv
from phalanx.env.mpi import Exchange

Env = dict[str, str]


def no_mpi4py() -> None:
    return None


def same_name(node: str) -> str:
    """A node_addr for detect(): every node name resolves (as on a cluster with working DNS)."""
    return node


def exchange(hosts: list[str], port: int, nodes: list[str] | None = None) -> Exchange:
    return lambda: (hosts, port, nodes)


def geometry(
    rank: int,
    local_rank: int,
    world_size: int,
    local_world_size: int,
    node_rank: int,
    num_nodes: int,
    master_addr: str,
    master_port: int,
    launcher: str,
    job_id: str | None,
) -> dict[str, object]:
    return dict(
        zip(
            FIELDS,
            (
                rank,
                local_rank,
                world_size,
                local_world_size,
                node_rank,
                num_nodes,
                master_addr,
                master_port,
                launcher,
                job_id,
            ),
            strict=True,
        )
    )


def torchrun(rank: int, local_rank: int, world: int, local_world: int, **extra: str) -> Env:
    return {
        "TORCHELASTIC_RUN_ID": "rdzv-7",
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(local_world),
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29400",
        **extra,
    }


def openmpi(rank: int, size: int, local_rank: int, local_size: int, **extra: str) -> Env:
    return {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
        "OMPI_MCA_ess_base_jobid": "3245932545",
        **extra,
    }


def hydra(rank: int, size: int, local_rank: int, local_size: int, **extra: str) -> Env:
    return {
        "PMI_RANK": str(rank),
        "PMI_SIZE": str(size),
        "MPI_LOCALRANKID": str(local_rank),
        "MPI_LOCALNRANKS": str(local_size),
        "PMI_FD": "5",
        **extra,
    }


def srun(
    procid: int,
    localid: int,
    nodeid: int,
    *,
    nodelist: str = "node[01-02]",
    tasks: str = "2(x2)",
    job: str = "4242",
    step: str = "0",
    **extra: str,
) -> Env:
    """A task of an srun step; the job-level variables describe a bigger allocation on purpose.

    The step's node and task counts follow from `tasks` (SLURM's 'N(xM),K' form).
    """
    items = [(int(n), int(m or 1)) for n, m in re.findall(r"(\d+)(?:\(x(\d+)\))?", tasks)]
    hosts, counts = sum(m for _, m in items), sum(n * m for n, m in items)
    return {
        "SLURM_JOB_ID": job,
        "SLURM_JOB_NODELIST": "node[01-16]",
        "SLURM_NTASKS": "64",
        "SLURM_JOB_NUM_NODES": "16",
        "SLURM_TASKS_PER_NODE": "4(x16)",
        "SLURM_STEP_ID": step,
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_STEP_TASKS_PER_NODE": tasks,
        "SLURM_STEP_NUM_NODES": str(hosts),
        "SLURM_STEP_NUM_TASKS": str(counts),
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(localid),
        "SLURM_NODEID": str(nodeid),
        **extra,
    }


def single_node(rank: int, world_size: int, launcher: str = "torchrun") -> ClusterEnv:
    """A one-node ClusterEnv: rank == local rank."""
    return ClusterEnv(
        **geometry(rank, rank, world_size, world_size, 0, 1, "127.0.0.1", 29500, launcher, None)
    )  # type: ignore[arg-type]
