"""Seeding: repeatable main-process streams, distinct deterministic worker streams, worker count."""

from __future__ import annotations

import pickle
import random

import numpy
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from phalanx import UsageError
from phalanx.data import default_num_workers, seed_everything, worker_init_fn, worker_seed


def draws() -> tuple[list[float], float, float]:
    return torch.rand(3).tolist(), random.random(), float(numpy.random.rand())


def test_same_seed_gives_the_same_draws_everywhere() -> None:
    assert seed_everything(1234) == 1234
    first = draws()
    seed_everything(1234)
    assert draws() == first


def test_rank_offsets_the_seed() -> None:
    assert seed_everything(1234, rank=3) == 1237
    on_rank_3 = draws()
    seed_everything(1234)
    assert draws() != on_rank_3


@pytest.mark.parametrize("seed", [-1, 2**32])
def test_seed_out_of_range_is_a_usage_error(seed: int) -> None:
    with pytest.raises(UsageError, match=r"not in 0..4294967295"):
        seed_everything(seed)
    with pytest.raises(UsageError, match=r"not in 0..4294967295"):
        worker_init_fn(seed)


def test_worker_seeds_differ_across_ranks_workers_and_epochs() -> None:
    grid = [(rank, worker, epoch) for rank in range(8) for worker in range(8) for epoch in range(4)]
    seeds = {worker_seed(7, *ids) for ids in grid}
    assert len(seeds) == 8 * 8 * 4
    assert worker_seed(7, 1, 2, 3) == worker_seed(7, 1, 2, 3)
    assert worker_seed(7, 1, 2) != worker_seed(8, 1, 2)
    assert all(0 <= seed < 2**32 for seed in seeds)


def test_worker_init_fn_pickles_for_spawned_workers() -> None:
    fn = worker_init_fn(5, rank=1, epoch=2)
    assert pickle.loads(pickle.dumps(fn)) == fn


class RandomDraws(Dataset[tuple[int, float, float, float]]):
    """Reports which worker served an index and what it drew from each library."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> tuple[int, float, float, float]:
        info = torch.utils.data.get_worker_info()
        worker = -1 if info is None else info.id
        return worker, torch.rand(()).item(), random.random(), float(numpy.random.rand())


def worker_draws(seed: int, rank: int) -> dict[int, list[tuple[float, float, float]]]:
    init = worker_init_fn(seed, rank)
    loader = DataLoader(RandomDraws(), batch_size=None, num_workers=2, worker_init_fn=init)
    by_worker: dict[int, list[tuple[float, float, float]]] = {}
    for worker, *values in loader:
        by_worker.setdefault(worker, []).append(tuple(values))  # type: ignore[arg-type]
    return by_worker


@pytest.mark.timeout(60)
def test_real_workers_draw_repeatable_and_distinct_streams() -> None:
    torch.manual_seed(0)
    first = worker_draws(seed=3, rank=0)
    torch.manual_seed(99)  # the main process's state must not matter
    assert worker_draws(seed=3, rank=0) == first
    assert sorted(first) == [0, 1]
    assert first[0][0] != first[1][0]
    for library in range(3):
        assert first[0][0][library] != first[1][0][library]
    assert worker_draws(seed=3, rank=1)[0] != first[0]


@pytest.mark.parametrize(
    ("num_cpus", "local_world_size", "expected"),
    [(2, 1, 1), (1, 1, 0), (16, 2, 7), (16, 8, 1), (4, 8, 0), (128, 1, 8), (64, 4, 8)],
)
def test_default_num_workers(num_cpus: int, local_world_size: int, expected: int) -> None:
    assert default_num_workers(local_world_size, num_cpus=num_cpus) == expected


def test_default_num_workers_reads_the_affinity_mask() -> None:
    assert 0 <= default_num_workers(1) <= 8
    with pytest.raises(UsageError, match="local_world_size=0"):
        default_num_workers(0)
