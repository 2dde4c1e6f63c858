"""Which device a rank uses, decided from the geometry alone (no torch import here)."""

from __future__ import annotations

from phalanx.env.cluster_env import ClusterEnv
from phalanx.errors import UsageError

BACKENDS = ("auto", "nccl", "gloo")


def select_device(env: ClusterEnv, num_visible_gpus: int) -> str:
    """'cuda:K' or 'cpu' for this rank.

    - as many visible GPUs as tasks on the node: each rank takes `cuda:local_rank`;
    - exactly one visible GPU: `cuda:0` (SLURM's --gpus-per-task=1 hides the others);
    - none: the CPU;
    - anything else is refused: ranks would share or skip GPUs silently.
    """
    if num_visible_gpus == 0:
        return "cpu"
    if num_visible_gpus == 1:
        return "cuda:0"
    if num_visible_gpus == env.local_world_size:
        return f"cuda:{env.local_rank}"
    raise UsageError(
        f"{num_visible_gpus} GPUs are visible to each of the {env.local_world_size} ranks on this "
        f"node (node_rank {env.node_rank}); start {num_visible_gpus} ranks per node "
        f"(e.g. srun --ntasks-per-node={num_visible_gpus} or phalanx run -n {num_visible_gpus}), "
        "or give each rank one GPU (--gpus-per-task=1 or CUDA_VISIBLE_DEVICES)"
    )


def select_backend(requested: str, device: str) -> str:
    """NCCL for CUDA devices, gloo for the CPU, unless the user asked for one explicitly."""
    if requested not in BACKENDS:
        raise UsageError(f"unknown backend {requested!r}; valid: {', '.join(BACKENDS)}")
    if requested == "auto":
        return "nccl" if device.startswith("cuda") else "gloo"
    if requested == "nccl" and not device.startswith("cuda"):
        raise UsageError("backend 'nccl' needs a CUDA GPU but this rank has none; use 'gloo'")
    return requested
