"""Context parallelism's decisions that need no process group: the config keys (a mapping from
YAML, the command line or dotted keys), the sizes with cp, data ranks, the refusals, the batch
checks and the positions made before the split. The split itself on real ranks:
tests/distributed/test_parallel.py (bad layouts)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from phalanx.config import load
from phalanx.config.parallel import ParallelConfig
from phalanx.config.training import TrainerConfig
from phalanx.errors import UsageError
from phalanx.train.context_parallel import _length, check_context_parallel, positions
from phalanx.train.layout import ParallelLayout, Sizes, resolve_sizes
from tests.pure.test_parallel_layout import env

DIMS = {"input_ids": 1, "labels": 1, "position_ids": 1}


@pytest.mark.parametrize(
    "overrides",
    [
        ["parallel.cp_seq_dims={input_ids: 1, labels: 1}"],
        ["parallel.cp_seq_dims.input_ids=1", "parallel.cp_seq_dims.labels=1"],
    ],
)
def test_cp_seq_dims_from_the_command_line(overrides: list[str]) -> None:
    config = load(TrainerConfig, overrides=["parallel.cp=2", *overrides])
    assert config.parallel.cp == 2 and config.parallel.cp_seq_dims == {"input_ids": 1, "labels": 1}
    assert config.parallel.is_set


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["parallel.cp=0"], r"parallel.cp=0 must be >= 1"),
        (["parallel.cp=2"], r"parallel.cp=2 needs parallel.cp_seq_dims, the batch tensors"),
        (["parallel.cp_seq_dims=[1]"], r"parallel.cp_seq_dims=\[1\] is not a mapping"),
        (["parallel.cp_seq_dims.input_ids=x"], r"parallel.cp_seq_dims.input_ids='x' is not an int"),
        (["parallel.cp_seq_dims.input_ids=-1"], r"each dimension is an int >= 0"),
        (["parallel.cp_seq_dims.position_ids=1"], r"names only position_ids"),
    ],
)
def test_bad_cp_keys(overrides: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        load(TrainerConfig, overrides=overrides)


def sizes(world: int, **section: int) -> Sizes:
    parallel = ParallelConfig(cp_seq_dims={"input_ids": 1}, **section)
    return resolve_sizes(parallel, strategy="auto", hsdp_shard_size=0, env=env(world))


def test_cp_joins_the_layout_and_shares_a_data_rank() -> None:
    got = sizes(8, cp=2, tp=2)
    assert (got.dp_replicate, got.dp_shard, got.cp, got.tp, got.kind) == (1, 2, 2, 2, "sharded")
    assert str(got) == "dp_replicate=1 x dp_shard=2 x cp=2 x tp=2"
    with pytest.raises(UsageError, match=r"cp=3 x tp=1 is 6 ranks, but the job has 4"):
        sizes(4, dp_shard=2, cp=3)
    with pytest.raises(UsageError, match=r"context-parallel model are trained through FSDP"):
        sizes(4, dp_replicate=2, dp_shard=1, cp=2)
    # Row-major, tp last then cp: ranks 4k..4k+3 train on one batch.
    shards = [ParallelLayout(got, env(8, rank=r), torch.device("cpu")).data_shard for r in range(8)]
    assert shards == [(0, 2)] * 4 + [(1, 2)] * 4
    cp_only = ParallelLayout(Sizes(1, 1, 1, cp=2), env(2), torch.device("cpu"))
    assert cp_only.fsdp and cp_only.ranks_per_batch == 2  # cp ranks average their gradients


def test_cp_is_refused_where_torch_has_no_ring_attention() -> None:
    layout = ParallelLayout(Sizes(1, 1, 1, cp=2), env(2), torch.device("cpu"))
    with pytest.raises(UsageError, match=r"^parallel.cp=2 needs CUDA GPUs: .* use parallel.cp=1"):
        check_context_parallel(nn.Linear(2, 2), layout)
    model = nn.Linear(2, 2)
    model.config = type("Config", (), {"_attn_implementation": "eager"})()  # type: ignore[assignment]
    on_gpus = ParallelLayout(Sizes(1, 1, 1, cp=2), env(2), torch.device("cuda", 0))
    with pytest.raises(UsageError, match=r"attn_implementation='eager'; build it with .*'sdpa'"):
        check_context_parallel(model, on_gpus)
    check_context_parallel(model, ParallelLayout(Sizes(1, 2, 1), env(2), torch.device("cpu")))


def test_the_batch_is_checked_before_it_is_split() -> None:
    ids = torch.zeros(2, 12, dtype=torch.long)
    assert _length({"input_ids": ids, "labels": ids}, DIMS, parts=4) == 12
    for batch, message in (
        ({"input_ids": ids}, r"names labels \(dimension 1\), but the batch's labels is missing"),
        ({"input_ids": ids, "labels": ids[0]}, r"labels is of shape \(12,\)"),
        ({"input_ids": ids, "labels": ids[:, :8]}, r"the lengths differ: \{'input_ids': 12"),
        ({"input_ids": ids[:, :10], "labels": ids[:, :10]}, r"length is 10; make it a multiple"),
    ):
        with pytest.raises(UsageError, match=message):
            _length(batch, DIMS, parts=4)


def test_positions_are_made_for_the_whole_sequence_before_the_split() -> None:
    ids = torch.zeros(3, 8, dtype=torch.long)
    made = positions({"input_ids": ids}, DIMS, 8)
    assert made.shape == (3, 8) and made.is_contiguous()  # split in place: a real tensor
    assert made[2].tolist() == list(range(8))
