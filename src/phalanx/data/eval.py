"""EvalSampler: every sample evaluated exactly once, on exactly one rank.

torch's DistributedSampler pads the last ranks with repeated samples so that all shards are
equally long; an all-reduced metric then counts those samples twice (wrong accuracy on a data set
whose length is not a multiple of the world size). Here shards are contiguous and unpadded: their
lengths differ by at most one, and concatenating the ranks' results in rank order gives the data
set's order.
"""

from __future__ import annotations

from collections.abc import Iterator

from torch.utils.data import Sampler

from phalanx.data.sampler import check_rank
from phalanx.errors import UsageError


def eval_shard(dataset_len: int, rank: int, world_size: int) -> range:
    """The contiguous, unpadded slice of `range(dataset_len)` that `rank` evaluates."""
    check_rank(rank, world_size)
    if dataset_len < 0:
        raise UsageError(f"dataset_len={dataset_len} must be >= 0; pass len(dataset)")
    base, extra = divmod(dataset_len, world_size)
    # The first `extra` ranks take one sample more, so shard sizes differ by at most one.
    start = rank * base + min(rank, extra)
    return range(start, start + base + (rank < extra))


def eval_num_steps(dataset_len: int, world_size: int, batch_size: int) -> int:
    """Batches of the longest shard: the step count at which every rank has finished.

    Evaluation that runs collectives in the forward pass (FSDP) must keep ranks in lock step that
    long; a rank whose shard is exhausted then reports has-data = 0 instead of a batch.
    """
    if batch_size < 1:
        raise UsageError(f"batch_size={batch_size} must be >= 1 (it is the per-rank batch size)")
    longest = len(eval_shard(dataset_len, 0, world_size))
    return -(-longest // batch_size)


class EvalSampler(Sampler[int]):
    """Yields `eval_shard(dataset_len, rank, world_size)` in order; no shuffling, no padding."""

    def __init__(self, dataset_len: int, rank: int, world_size: int) -> None:
        self.dataset_len = dataset_len
        self.rank = rank
        self.world_size = world_size
        self.indices = eval_shard(dataset_len, rank, world_size)

    def num_steps(self, batch_size: int) -> int:
        """Lock-step batch count for all ranks (see `eval_num_steps`)."""
        return eval_num_steps(self.dataset_len, self.world_size, batch_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)
