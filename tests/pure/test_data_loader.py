"""make_train_loader / make_eval_loader: thin DataLoaders over the samplers, per rank, no groups."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from phalanx import UsageError
from phalanx.data import (
    EvalSampler,
    GlobalOrderSampler,
    ShardedIterable,
    global_order,
    make_eval_loader,
    make_train_loader,
)
from tests.support.envtables import single_node

Loader = DataLoader[tuple[torch.Tensor, ...]]


def dataset(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(n))


def stream(loaders: list[Loader]) -> list[int]:
    """All ranks' samples, step by step and rank by rank, as the global order consumes them."""
    per_rank = [[batch[0].tolist() for batch in loader] for loader in loaders]
    steps = max(len(batches) for batches in per_rank)
    return [i for step in range(steps) for b in per_rank if step < len(b) for i in b[step]]


def train_loaders(n: int, world_size: int, **kw: Any) -> list[Loader]:
    return [
        make_train_loader(
            dataset(n), env=single_node(r, world_size), batch_size=4, seed=1, num_workers=0, **kw
        )
        for r in range(world_size)
    ]


def test_train_loaders_of_all_ranks_consume_the_global_order() -> None:
    loaders = train_loaders(30, 3)
    assert isinstance(loaders[0].sampler, GlobalOrderSampler)
    assert stream(loaders) == global_order(30, seed=1, epoch=0).tolist()
    assert [len(loader) for loader in loaders] == [3, 3, 2]  # the has-data flag covers rank 2


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_train_loader_resumes_from_a_start_position(world_size: int) -> None:
    loaders = train_loaders(30, world_size, start=(2, 13))
    assert stream(loaders) == global_order(30, seed=1, epoch=2).tolist()[13:]


def test_set_epoch_on_the_loaders_sampler_changes_the_order() -> None:
    (loader,) = train_loaders(30, 1)
    first = stream([loader])
    assert isinstance(loader.sampler, GlobalOrderSampler)
    loader.sampler.set_epoch(1)
    assert stream([loader]) == global_order(30, seed=1, epoch=1).tolist() != first


def test_iterating_does_not_shift_the_main_random_stream() -> None:
    (loader,) = train_loaders(30, 1)
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    list(loader)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.timeout(60)
def test_workers_are_persistent_and_yield_the_same_batches() -> None:
    loader = make_train_loader(
        dataset(30), env=single_node(0, 1), batch_size=4, seed=1, num_workers=2
    )
    assert loader.persistent_workers and loader.worker_init_fn is not None
    assert stream([loader]) == global_order(30, seed=1, epoch=0).tolist()


def test_eval_loaders_cover_every_sample_once() -> None:
    loaders = [
        make_eval_loader(dataset(10), env=single_node(r, 3), batch_size=3, num_workers=0)
        for r in range(3)
    ]
    assert isinstance(loaders[0].sampler, EvalSampler)
    seen = Counter(i for loader in loaders for batch in loader for i in batch[0].tolist())
    assert seen == Counter(range(10))
    assert not loaders[0].persistent_workers


def test_streams_are_refused_with_the_way_to_shard_them() -> None:
    stream_dataset = ShardedIterable(range(10), rank=0, world_size=1)
    with pytest.raises(UsageError, match=r"map-style dataset .* ShardedIterable"):
        make_train_loader(stream_dataset, env=single_node(0, 1), batch_size=2, seed=0)  # type: ignore[arg-type]


def test_negative_worker_count_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="num_workers=-1"):
        make_eval_loader(dataset(4), env=single_node(0, 1), batch_size=2, num_workers=-1)
