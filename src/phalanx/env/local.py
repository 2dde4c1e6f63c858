"""No launcher: one process, which still gets a (one-rank) process group."""

from __future__ import annotations

from collections.abc import Mapping

from phalanx.env.cluster_env import ClusterEnv, read_port


def from_local(environ: Mapping[str, str]) -> ClusterEnv:
    """A single process; inside a SLURM batch script it keeps the job id (for requeue)."""
    return ClusterEnv(
        rank=0,
        local_rank=0,
        world_size=1,
        local_world_size=1,
        node_rank=0,
        num_nodes=1,
        master_addr=environ.get("MASTER_ADDR") or "127.0.0.1",
        master_port=read_port(environ, default=0),
        launcher="local",
        job_id=environ.get("SLURM_JOB_ID"),
    )
