"""Evaluation shards count every sample once; streams are split across ranks and workers."""

from __future__ import annotations

from collections import Counter

import pytest
from torch.utils.data import DataLoader

from phalanx import UsageError
from phalanx.data import EvalSampler, ShardedIterable, eval_num_steps, eval_shard, shard_iterable


def test_three_ranks_evaluate_each_of_ten_samples_exactly_once() -> None:
    shards = [list(EvalSampler(10, rank, 3)) for rank in range(3)]
    assert shards == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert Counter(i for shard in shards for i in shard) == Counter(range(10))


@pytest.mark.parametrize(("n", "world_size"), [(0, 1), (1, 4), (5, 8), (10, 3), (97, 7), (64, 8)])
def test_shards_are_contiguous_unpadded_and_balanced(n: int, world_size: int) -> None:
    shards = [eval_shard(n, rank, world_size) for rank in range(world_size)]
    assert [i for shard in shards for i in shard] == list(range(n))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_lock_step_count_is_that_of_the_longest_shard() -> None:
    assert eval_num_steps(10, 3, 2) == 2  # shards 4, 3, 3
    assert eval_num_steps(10, 3, 4) == 1
    assert eval_num_steps(2, 4, 8) == 1  # two ranks have nothing at all
    assert eval_num_steps(0, 4, 8) == 0
    assert EvalSampler(10, 2, 3).num_steps(3) == 2


def test_eval_loader_batches_cover_the_shard() -> None:
    loaders = [
        DataLoader(list(range(10)), batch_size=3, sampler=EvalSampler(10, r, 3)) for r in range(3)
    ]
    batches = [[b.tolist() for b in loader] for loader in loaders]
    assert batches == [[[0, 1, 2], [3]], [[4, 5, 6]], [[7, 8, 9]]]


@pytest.mark.parametrize("world_size", [0, -1])
def test_bad_world_size_is_a_usage_error(world_size: int) -> None:
    with pytest.raises(UsageError, match="world_size"):
        eval_shard(10, 0, world_size)
    with pytest.raises(UsageError, match="world_size"):
        ShardedIterable(range(3), rank=0, world_size=world_size)


def test_shard_iterable_round_robin() -> None:
    assert [list(shard_iterable(range(10), r, 3)) for r in range(3)] == [
        [0, 3, 6, 9],
        [1, 4, 7],
        [2, 5, 8],
    ]
    with pytest.raises(UsageError, match=r"rank=3 not in 0\.\.2"):
        shard_iterable(range(10), 3, 3)


def test_without_workers_a_rank_gets_its_round_robin_share() -> None:
    dataset = ShardedIterable(range(7), rank=1, world_size=2)
    assert list(DataLoader(dataset, batch_size=None)) == [1, 3, 5]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_every_item_once_across_ranks_and_two_workers(world_size: int) -> None:
    items = [f"line {i}" for i in range(101)]
    seen: Counter[str] = Counter()
    for rank in range(world_size):
        dataset = ShardedIterable(items, rank=rank, world_size=world_size)
        loader = DataLoader(dataset, batch_size=None, num_workers=2)
        seen.update(loader)
    assert seen == Counter(items)
