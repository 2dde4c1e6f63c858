"""DataLoaders for training and evaluation, built from the samplers and seeding of this package.

Thin on purpose: everything here is a plain `torch.utils.data.DataLoader`; a user who needs
other options builds one from `GlobalOrderSampler` / `EvalSampler` and `worker_init_fn` directly.
The training loader's sampler is `loader.sampler` (a GlobalOrderSampler): call `set_epoch`, and
save `state(global_index_after(steps))` in checkpoints.

Workers start through a fork server by default (`worker_start="forkserver"`), never by forking
the training process: that process runs threads (gloo's, the hang watch, pin memory, a checkpoint
writer), and a child forked while one of them holds a lock can wait on it forever. CPython 3.11
does exactly that when a thread is creating or deleting its thread state at the moment of fork
(the child blocks on the interpreter's HEAD_LOCK in `PyOS_AfterFork_Child`;
benchmarks/fork_stress.py reproduces it). The server is one clean, single-threaded process that
imported the training script once; workers fork from it in milliseconds. The price: the data
set, collate function and worker_init_fn must be picklable (see `start_workers`).
"""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Callable, Iterator, Sized
from typing import Any, TypeVar

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from phalanx.config.training import WORKER_STARTS
from phalanx.data.eval import EvalSampler
from phalanx.data.iterable import ShardedIterable
from phalanx.data.sampler import GlobalOrderSampler, mix_seed
from phalanx.data.seeding import default_num_workers, worker_init_fn
from phalanx.dist.forking import start_forkserver
from phalanx.env import ClusterEnv
from phalanx.errors import UsageError

T = TypeVar("T")

Collate = Callable[[list[T]], Any]


def check_worker_start(worker_start: str) -> None:
    if worker_start not in WORKER_STARTS:
        raise UsageError(
            f"worker_start={worker_start!r} is not a start method; use one of "
            f"{', '.join(WORKER_STARTS)} (forkserver is safe beside threads and fast)"
        )


def start_workers(loader: DataLoader[T]) -> Iterator[Any]:
    """`iter(loader)`, with a one-line UsageError when a worker cannot receive the data set.

    A fork server or spawned worker gets the data set, collate_fn and worker_init_fn pickled;
    a lambda or a class defined inside a function cannot be, and Python's own error names
    neither the loader nor the fix.
    """
    try:
        with warnings.catch_warnings():
            # torch's own hint about pickling (and Python 3.14) is replaced by the line below.
            warnings.filterwarnings("ignore", message="Got pickle error", category=UserWarning)
            return iter(loader)
    except (pickle.PicklingError, AttributeError, TypeError) as error:
        if "pickle" not in str(error).lower():
            raise
        method = loader.multiprocessing_context
        start = method.get_start_method() if method is not None else "default"
        raise UsageError(
            f"DataLoader workers ({start} start) need a picklable data set, collate_fn and "
            f"worker_init_fn, but: {error}; define them at module level (no lambdas or local "
            "classes), or set data.num_workers=0, or data.worker_start=fork (unsafe beside threads)"
        ) from None


def _dataset_len(dataset: Dataset[T], what: str) -> int:
    if isinstance(dataset, IterableDataset) or not isinstance(dataset, Sized):
        raise UsageError(
            f"{what} needs a map-style dataset with __len__ and __getitem__, got "
            f"{type(dataset).__name__}; for a stream use DataLoader(ShardedIterable(...)) directly"
        )
    return len(dataset)


def _loader(
    dataset: Dataset[T],
    sampler: Sampler[int] | None,
    *,
    env: ClusterEnv,
    rank: int,
    batch_size: int,
    seeding: tuple[int, int],
    num_workers: int | None,
    collate_fn: Collate[T] | None,
    pin_memory: bool | None,
    persistent: bool,
    worker_start: str,
) -> DataLoader[T]:
    seed, epoch = seeding
    workers = default_num_workers(env.local_world_size) if num_workers is None else num_workers
    if workers < 0:
        raise UsageError(f"num_workers={workers} must be >= 0 (0 loads in the main process)")
    check_worker_start(worker_start)
    if workers and worker_start == "forkserver":
        start_forkserver()  # its imports now, so that workers start in milliseconds
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=False,  # the sampler already decided which samples this rank gets
        num_workers=workers,
        collate_fn=collate_fn,
        pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
        worker_init_fn=worker_init_fn(seed, rank, epoch=epoch) if workers else None,
        persistent_workers=persistent and workers > 0,
        multiprocessing_context=worker_start if workers else None,
        # Each new iterator draws its workers' base seed from this generator; without one it
        # draws from the global torch RNG and shifts the main process's dropout stream.
        generator=torch.Generator().manual_seed(mix_seed(seed, rank)),
    )


def make_train_loader(
    dataset: Dataset[T],
    *,
    env: ClusterEnv,
    batch_size: int,
    seed: int,
    shuffle: bool = True,
    drop_last: bool = False,
    num_workers: int | None = None,
    collate_fn: Collate[T] | None = None,
    pin_memory: bool | None = None,
    start: tuple[int, int] = (0, 0),
    worker_start: str = "forkserver",
    ranks: tuple[int, int] | None = None,
) -> DataLoader[T]:
    """A training DataLoader of this rank's share of the global order, resumable on any world size.

    `batch_size` is per rank; `start=(epoch, global_index)` is a position saved from
    `loader.sampler.state(...)`. `num_workers=None` takes `default_num_workers`; workers are
    persistent (no restart cost per epoch) and seeded per (seed, rank, worker). `pin_memory=None`
    pins when CUDA is available; `worker_start` is one of WORKER_STARTS. With drop_last=False
    ranks may get different numbers of batches in the last step; see GlobalOrderSampler.
    `ranks` = (data rank, data ranks) where ranks share batches (phalanx.ParallelLayout).
    """
    epoch, global_index = start
    rank, world_size = ranks or (env.rank, env.world_size)
    sampler = GlobalOrderSampler(
        _dataset_len(dataset, "make_train_loader"),
        rank=rank,
        world_size=world_size,
        batch_size=batch_size,
        seed=seed,
        shuffle=shuffle,
        drop_last=drop_last,
        start_index=global_index,
        epoch=epoch,
    )
    return _loader(
        dataset,
        sampler,
        env=env,
        rank=rank,
        batch_size=batch_size,
        seeding=(seed, epoch),
        num_workers=num_workers,
        collate_fn=collate_fn,
        pin_memory=pin_memory,
        persistent=True,
        worker_start=worker_start,
    )


def make_eval_loader(
    dataset: Dataset[T],
    *,
    env: ClusterEnv,
    batch_size: int,
    num_workers: int | None = None,
    collate_fn: Collate[T] | None = None,
    pin_memory: bool | None = None,
    seed: int = 0,
    worker_start: str = "forkserver",
    ranks: tuple[int, int] | None = None,
) -> DataLoader[T]:
    """An evaluation DataLoader over this rank's unpadded contiguous shard (see EvalSampler).

    Every sample is evaluated once in all; shards differ in length by at most one sample, and
    `loader.sampler.num_steps(batch_size)` is the lock-step batch count for all ranks. Workers
    are not persistent: between evaluations they would hold memory next to the training workers.
    """
    if batch_size < 1:
        raise UsageError(f"batch_size={batch_size} must be >= 1 (it is the per-rank batch size)")
    rank, world_size = ranks or (env.rank, env.world_size)
    sampler = EvalSampler(_dataset_len(dataset, "make_eval_loader"), rank, world_size)
    return _loader(
        dataset,
        sampler,
        env=env,
        rank=rank,
        batch_size=batch_size,
        seeding=(seed, 0),
        num_workers=num_workers,
        collate_fn=collate_fn,
        pin_memory=pin_memory,
        persistent=False,
        worker_start=worker_start,
    )


def make_iterable_loader(
    dataset: IterableDataset[T],
    *,
    env: ClusterEnv,
    batch_size: int,
    seed: int,
    num_workers: int | None = None,
    collate_fn: Collate[T] | None = None,
    pin_memory: bool | None = None,
    worker_start: str = "forkserver",
    ranks: tuple[int, int] | None = None,
) -> DataLoader[T]:
    """A training DataLoader over a stream, sharded across ranks AND this rank's workers.

    Each item goes to exactly one (rank, worker); shards may differ in length, and the Trainer's
    has-data flag ends the epoch for all ranks when the first one runs dry. A stream has no
    global index, so a resume restarts its epoch (map-style data sets resume exactly).
    """
    if batch_size < 1:
        raise UsageError(f"batch_size={batch_size} must be >= 1 (it is the per-rank batch size)")
    rank, world_size = ranks or (env.rank, env.world_size)
    sharded = ShardedIterable(dataset, rank=rank, world_size=world_size)
    return _loader(
        sharded, None, env=env, rank=rank, batch_size=batch_size, seeding=(seed, 0),
        num_workers=num_workers, collate_fn=collate_fn, pin_memory=pin_memory, persistent=False,
        worker_start=worker_start,
    )  # fmt: skip
