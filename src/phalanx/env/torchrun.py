"""torchrun / TorchElastic: the agent exports the geometry to each worker it starts."""

from __future__ import annotations

from collections.abc import Mapping

from phalanx.env.cluster_env import ClusterEnv, read_int, read_port
from phalanx.errors import UsageError

_REQUIRED = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def is_torchrun(environ: Mapping[str, str]) -> bool:
    """A TorchElastic worker, or a process given torch's env:// variables by hand."""
    return "TORCHELASTIC_RUN_ID" in environ or all(name in environ for name in _REQUIRED)


def from_torchrun(environ: Mapping[str, str]) -> ClusterEnv:
    """Read the variables torchrun sets (GROUP_* are its per-node counts)."""

    def read(name: str) -> int:
        return read_int(environ, name, launcher="torchrun")

    world_size = read("WORLD_SIZE")
    rank = read("RANK")
    local_world_size = read("LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in environ else world_size
    node_rank = read("GROUP_RANK") if "GROUP_RANK" in environ else rank // local_world_size
    if "GROUP_WORLD_SIZE" in environ:
        num_nodes = read("GROUP_WORLD_SIZE")
    else:
        num_nodes = -(-world_size // local_world_size)
    master_addr = environ.get("MASTER_ADDR", "")
    if not master_addr:
        raise UsageError(
            "torchrun environment without MASTER_ADDR; start the script with torchrun or "
            "phalanx run, or export MASTER_ADDR=<host of rank 0>"
        )
    return ClusterEnv(
        rank=rank,
        local_rank=read("LOCAL_RANK"),
        world_size=world_size,
        local_world_size=local_world_size,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=master_addr,
        master_port=read_port(environ, default=29500),
        launcher="torchrun",
        job_id=environ.get("SLURM_JOB_ID") or environ.get("TORCHELASTIC_RUN_ID"),
    )
