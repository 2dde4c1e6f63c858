"""Sharding of streams (IterableDataset) across ranks and DataLoader worker processes.

A DataLoader with N workers runs N copies of an IterableDataset; without sharding each rank and
each worker yields the whole stream, so every item is trained on world_size * N times. Here item i
goes to exactly one (rank, worker): shard `rank * num_workers + worker_id` of
`world_size * num_workers` takes items i with i % num_shards == shard.

Shards may differ in length, and a stream's length is unknown in advance: a rank that runs dry
early sends has-data = 0 to the Trainer's lock-step loop instead of leaving a collective waiting.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import TypeVar

from torch.utils.data import IterableDataset, get_worker_info

from phalanx.errors import UsageError

T = TypeVar("T")


def _check(shard: int, num_shards: int) -> None:
    if num_shards < 1:
        raise UsageError(f"world_size={num_shards} must be >= 1; pass env.world_size")
    if not 0 <= shard < num_shards:
        raise UsageError(f"rank={shard} not in 0..{num_shards - 1}; pass env.rank")


def shard_iterable(iterable: Iterable[T], rank: int, world_size: int) -> Iterator[T]:
    """Items number rank, rank + world_size, ... of `iterable` (round robin, no padding).

    Every shard reads (and skips) the whole source: cheap for lines or file names, wasteful for
    decoded samples; shard a list of files and decode only your own.
    """
    _check(rank, world_size)
    return itertools.islice(iterable, rank, None, world_size)


def worker_shard(rank: int, world_size: int) -> tuple[int, int]:
    """(shard, num_shards) of the calling DataLoader worker, or of the main process (0 workers)."""
    _check(rank, world_size)
    info = get_worker_info()
    num_workers, worker_id = (1, 0) if info is None else (info.num_workers, info.id)
    return rank * num_workers + worker_id, world_size * num_workers


class ShardedIterable(IterableDataset[T]):
    """An IterableDataset yielding this (rank, worker)'s share of `source`.

    `source` must be iterable again for each epoch (a list, or an object whose `__iter__` opens
    its files anew), since every worker iterates its own copy. Every item of `source` is yielded
    by exactly one (rank, worker) pair, whatever the number of workers.
    """

    def __init__(self, source: Iterable[T], *, rank: int, world_size: int) -> None:
        _check(rank, world_size)
        self.source = source
        self.rank = rank
        self.world_size = world_size

    def __iter__(self) -> Iterator[T]:
        shard, num_shards = worker_shard(self.rank, self.world_size)
        return shard_iterable(self.source, shard, num_shards)
