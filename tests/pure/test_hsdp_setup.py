"""HSDP set-up decisions that need no process group: the mesh shape chosen from the world,
the node size and train.hsdp_shard_size, and the config refusals."""

from __future__ import annotations

import pytest

from phalanx.config import load
from phalanx.config.training import TrainerConfig
from phalanx.env.cluster_env import ClusterEnv
from phalanx.errors import UsageError
from phalanx.train.hsdp import mesh_shape


def env(world_size: int, local_world_size: int) -> ClusterEnv:
    return ClusterEnv(
        rank=0, local_rank=0, world_size=world_size, local_world_size=local_world_size,
        node_rank=0, num_nodes=world_size // local_world_size, master_addr="127.0.0.1",
        master_port=29500, launcher="torchrun", job_id=None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("world", "per_node", "shard_size", "shape"),
    [
        (4, 2, 0, (2, 2)),  # default: shard within a node, replicate across the 2 nodes
        (16, 8, 0, (2, 8)),
        (4, 4, 2, (2, 2)),  # one node, two shard groups of 2 (the 2x2 tests)
        (16, 8, 4, (4, 4)),  # smaller groups than a node
        (16, 4, 8, (2, 8)),  # groups of two nodes
    ],
)
def test_mesh_shape(world: int, per_node: int, shard_size: int, shape: tuple[int, int]) -> None:
    assert mesh_shape(env(world, per_node), shard_size) == shape


@pytest.mark.parametrize(
    ("world", "per_node", "shard_size", "message"),
    [
        (6, 6, 4, r"train.hsdp_shard_size=4 does not divide the world size 6; set "
                  r"train.hsdp_shard_size to a divisor of 6"),
        (4, 1, 0, r"train.hsdp_shard_size=0 \(ranks per node: 1\) shards nothing .* use "
                  r"train.strategy=ddp"),
        (4, 4, 1, r"train.hsdp_shard_size=1 shards nothing"),
        (4, 4, 0, r"puts all 4 ranks in one shard group, which is train.strategy=fsdp: use that"),
        (4, 2, 8, r"train.hsdp_shard_size=8 does not divide the world size 4"),
    ],
)  # fmt: skip
def test_degenerate_or_uneven_meshes_are_one_line_errors_with_the_fix(
    world: int, per_node: int, shard_size: int, message: str
) -> None:
    with pytest.raises(UsageError, match=message) as error:
        mesh_shape(env(world, per_node), shard_size)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.strategy=hsdp"], "train.strategy=hsdp needs checkpoint.sharded=true"),
        (["train.strategy=hsdp", "checkpoint.sharded=true", "train.precision=fp16"],
         "fp16 is not supported with train.strategy=hsdp; use bf16"),
        (["train.strategy=fsdp", "checkpoint.sharded=true", "train.hsdp_shard_size=2"],
         "applies to train.strategy=hsdp only \\(got fsdp\\); add train.strategy=hsdp"),
        (["train.strategy=hsdp", "checkpoint.sharded=true", "train.hsdp_shard_size=-1"],
         "train.hsdp_shard_size=-1 must be >= 0"),
        (["train.strategy=hspd"], "is not one of: auto, single, ddp, fsdp, hsdp"),
    ],
)  # fmt: skip
def test_hsdp_config_errors_are_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message) as error:
        load(TrainerConfig, overrides=overrides)
    assert "\n" not in str(error.value)


def test_hsdp_config_loads() -> None:
    cfg = load(TrainerConfig, overrides=["train.strategy=hsdp", "checkpoint.sharded=true",
                                         "train.hsdp_shard_size=2"])  # fmt: skip
    assert (cfg.train.strategy, cfg.train.hsdp_shard_size) == ("hsdp", 2)
