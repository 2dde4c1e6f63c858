"""The parallel layout's decisions that need no process group: sizes from the `parallel` section
or from train.strategy, the refusals (one line each), data ranks, and the config keys."""

from __future__ import annotations

import pytest
import torch

from phalanx.config import load
from phalanx.config.parallel import ParallelConfig
from phalanx.config.training import TrainConfig, TrainerConfig
from phalanx.env.cluster_env import ClusterEnv
from phalanx.errors import UsageError
from phalanx.train.layout import ParallelLayout, Sizes, check_checkpoint_form, resolve_sizes
from phalanx.train.parallelize import WrapOptions


def env(world: int, per_node: int = 0, rank: int = 0) -> ClusterEnv:
    per_node = per_node or world
    return ClusterEnv(
        rank=rank, local_rank=rank % per_node, world_size=world, local_world_size=per_node,
        node_rank=rank // per_node, num_nodes=world // per_node, master_addr="127.0.0.1",
        master_port=29500, launcher="torchrun", job_id=None,
    )  # fmt: skip


def sizes(world: int, strategy: str = "auto", shard: int = 0, **section: int) -> Sizes:
    return resolve_sizes(
        ParallelConfig(**section), strategy=strategy, hsdp_shard_size=shard,
        env=env(world, min(world, 4)),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("world", "strategy", "expected", "kind"),
    [
        (1, "auto", (1, 1, 1), "single"),
        (8, "auto", (8, 1, 1), "ddp"),
        (8, "ddp", (8, 1, 1), "ddp"),
        (8, "fsdp", (1, 8, 1), "sharded"),
        (8, "hsdp", (2, 4, 1), "sharded"),  # a node's 4 ranks per shard group
        (4, "single", (1, 1, 1), "single"),
        (1, "fsdp", (1, 1, 1), "sharded"),  # FSDP2 on one rank stays FSDP2
    ],
)
def test_train_strategy_is_a_shorthand_for_a_layout(
    world: int, strategy: str, expected: tuple[int, int, int], kind: str
) -> None:
    got = sizes(world, strategy)
    assert (got.dp_replicate, got.dp_shard, got.tp) == expected and got.kind == kind


@pytest.mark.parametrize(
    ("world", "section", "expected"),
    [
        (8, {"tp": 2}, (1, 4, 2)),  # dp_shard takes the ranks tp leaves
        (8, {"dp_shard": 2, "tp": 4}, (1, 2, 4)),
        (8, {"dp_replicate": 2, "tp": 2}, (2, 2, 2)),
        (8, {"dp_replicate": 2, "dp_shard": -1}, (2, 4, 1)),  # HSDP by sizes
        (8, {"dp_shard": -1}, (1, 8, 1)),  # FSDP by sizes: -1 set explicitly
        (8, {"dp_replicate": 8}, (8, 1, 1)),  # DDP by sizes
    ],
)
def test_the_parallel_section_sets_the_sizes(
    world: int, section: dict[str, int], expected: tuple[int, int, int]
) -> None:
    got = sizes(world, **section)
    assert (got.dp_replicate, got.dp_shard, got.tp) == expected


@pytest.mark.parametrize(
    ("world", "strategy", "section", "message"),
    [
        (4, "auto", {"dp_shard": 2, "tp": 3},
         r"^parallel.dp_replicate=1 x dp_shard=2 x tp=3 is 6 ranks, but the job has 4; make the "
         r"product 4 \(parallel.dp_shard=-1 takes"),
        (6, "auto", {"tp": 4}, r"is 4 ranks, but the job has 6"),  # tp does not divide the world
        (4, "ddp", {"tp": 2}, r"^config train.strategy=ddp conflicts with the parallel section"),
        (8, "auto", {"dp_replicate": 4, "dp_shard": 1, "tp": 2},
         r"replicas of a tensor- or context-parallel model are trained through FSDP here; set "
         r"parallel.dp_shard=4 parallel.dp_replicate=1"),
    ],
)  # fmt: skip
def test_layouts_the_world_cannot_hold_are_refused_in_one_line(
    world: int, strategy: str, section: dict[str, int], message: str
) -> None:
    with pytest.raises(UsageError, match=message) as caught:
        sizes(world, strategy, **section)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("parallel.tp=0", r"parallel.tp=0 must be >= 1"),
        ("parallel.dp_shard=-2", r"parallel.dp_shard=-2 must be >= -1"),
        ("parallel.tp_plan=mine", r"parallel.tp_plan='mine' is not one of: auto; pass a plan"),
        ("parallel.pp=2", r"'parallel.pp' is unknown"),
    ],
)
def test_bad_parallel_keys(override: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        load(TrainerConfig, overrides=[override])


def test_data_ranks_count_each_tensor_parallel_group_once() -> None:
    """Row-major with tp last: ranks 2k and 2k+1 split one model copy and read one batch."""
    sized = Sizes(1, 2, 2)
    got = [ParallelLayout(sized, env(4, rank=r), torch.device("cpu")).data_shard for r in range(4)]
    assert got == [(0, 2), (0, 2), (1, 2), (1, 2)]
    shard_ranks = [ParallelLayout(Sizes(2, 2, 1), env(4, rank=r), torch.device("cpu")).shard_rank
                   for r in range(4)]  # fmt: skip
    assert shard_ranks == [0, 1, 0, 1]  # replicas of a shard draw the same init_weights values


def test_a_split_model_needs_sharded_checkpoints() -> None:
    layout = ParallelLayout(Sizes(1, 2, 2), env(4), torch.device("cpu"))
    config = load(TrainerConfig, overrides=["parallel.tp=2"])
    with pytest.raises(UsageError, match=r"tp=2 splits .* add checkpoint.sharded=true"):
        check_checkpoint_form(layout, config.checkpoint)
    check_checkpoint_form(ParallelLayout(Sizes(4, 1, 1), env(4), torch.device("cpu")),
                          config.checkpoint)  # fmt: skip  # DDP: whole copies


def test_wrap_options_follow_the_train_section() -> None:
    train = TrainConfig(compile=True, fsdp_units=("Block",), ddp_bucket_mb=5.0, precision="bf16")
    options = WrapOptions.of(train)
    assert options.compile and options.units == ("Block",) and options.ddp_bucket_mb == 5.0
    assert options.precision == "bf16"
    with pytest.raises(UsageError, match="activation_checkpointing"):
        WrapOptions(activation_checkpointing="some")


def test_activation_checkpointing_with_compile_under_tp_is_refused_before_anything_runs() -> None:
    from torch import nn

    from phalanx.train.parallelize import wrap_model

    layout = ParallelLayout(Sizes(1, 2, 2), env(4), torch.device("cpu"))
    options = WrapOptions(compile=True, activation_checkpointing="full")
    with pytest.raises(
        UsageError,
        match=r"activation_checkpointing=full with train.compile=true "
        r"under parallel.tp=2 .*keep one of the two",
    ):
        wrap_model(nn.Linear(2, 2), layout, options=options)
