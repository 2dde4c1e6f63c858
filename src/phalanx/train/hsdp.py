"""Hybrid sharding (HSDP, `train.strategy=hsdp`): FSDP2 over a 2-D device mesh.

Parameters, gradients and optimizer state are sharded within a group of `shard_size`
consecutive ranks (one node's, by default: all-gathers and reduce-scatters stay on the node's
fast links) and replicated across the groups (one all-reduce of each shard between nodes per
step, like DDP). The mesh is ("dp_replicate", "dp_shard") in torch's row-major rank order: ranks
0..shard_size-1 form the first shard group, which torchrun and srun place on one node.

A mesh whose shard groups hold one rank is DDP, and one whose single group holds every rank is
FSDP: both are refused, naming the strategy that does that, so that the run says what it does.
"""

from __future__ import annotations

import logging

from phalanx.env.cluster_env import ClusterEnv
from phalanx.errors import UsageError

log = logging.getLogger("phalanx.train")


def mesh_shape(env: ClusterEnv, shard_size: int) -> tuple[int, int]:
    """(replicas, shard_size) for `train.hsdp_shard_size=shard_size` (0: the node's ranks)."""
    size = shard_size or env.local_world_size
    key = (
        f"train.hsdp_shard_size={shard_size}"
        if shard_size
        else f"train.hsdp_shard_size=0 (ranks per node: {size})"
    )
    world = env.world_size
    if world % size:
        raise UsageError(
            f"{key} does not divide the world size {world}; set train.hsdp_shard_size to a "
            f"divisor of {world} (the ranks of a node, for the fast links)"
        )
    if size == 1:
        raise UsageError(
            f"{key} shards nothing (every rank would hold the whole model): use "
            "train.strategy=ddp, or set train.hsdp_shard_size to the ranks of a node"
        )
    if size == world:
        raise UsageError(
            f"{key} puts all {world} ranks in one shard group, which is train.strategy=fsdp: "
            "use that, or set train.hsdp_shard_size to a proper divisor of the world size"
        )
    return world // size, size


def log_hsdp_groups(env: ClusterEnv, replicas: int, size: int) -> None:
    """Rank 0 says in one INFO line which ranks form the shard groups."""
    if env.is_main_process:
        groups = [f"{g * size}-{g * size + size - 1}" for g in range(min(replicas, 3))]
        where = "within a node" if env.local_world_size % size == 0 else "spanning nodes"
        log.info(
            "hsdp mesh: %d replicas x %d shards (shard groups: ranks %s%s; each %s)",
            replicas, size, ", ".join(groups), ", ..." if replicas > 3 else "", where,
        )  # fmt: skip
