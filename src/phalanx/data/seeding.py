"""Seeds for the main process and for DataLoader workers, and a default worker count.

Random streams per process:
- main process of rank r: `seed_everything(seed, rank=r)` seeds python, numpy and torch (CPU and
  every CUDA device) with `seed + r`: ranks draw different dropout masks, the run is repeatable.
- worker w of rank r: `worker_init_fn(seed, rank=r)` reseeds the worker with a hash of
  (seed, rank, w, epoch). torch alone seeds workers from a number drawn from the main process's
  RNG when the iterator starts, so worker streams would depend on everything the main process
  drew before (model init, dropout) and change when a run resumes mid-way.
"""

from __future__ import annotations

import importlib.util
import os
import random
import signal
from dataclasses import dataclass

import torch

from phalanx.data.sampler import mix_seed
from phalanx.errors import UsageError

MAX_SEED = 2**32 - 1
"""numpy's legacy global seeding accepts 0..2**32-1; all seeds here stay in that range."""

MAX_DEFAULT_WORKERS = 8
"""More workers per rank rarely help (the GPU, not decoding, is then the bound) and each one
holds a copy of the dataset object and prefetched batches in memory."""


def _seed_all(seed: int) -> None:
    random.seed(seed)
    # torch.manual_seed also seeds every CUDA device (lazily, once CUDA initialises).
    torch.manual_seed(seed)
    if importlib.util.find_spec("numpy") is not None:
        import numpy

        numpy.random.seed(seed % (MAX_SEED + 1))


def seed_everything(seed: int, rank: int = 0) -> int:
    """Seed python's `random`, numpy (when installed) and torch with `seed + rank`; return it.

    Pass `rank=0` on every rank for identical streams everywhere. The seed is not exported to the
    environment: pass it to whatever needs it.
    """
    if not 0 <= seed <= MAX_SEED:
        raise UsageError(f"seed={seed} not in 0..{MAX_SEED}; pick a seed in that range")
    if rank < 0:
        raise UsageError(f"rank={rank} must be >= 0; pass env.rank")
    effective = (seed + rank) % (MAX_SEED + 1)
    _seed_all(effective)
    return effective


def worker_seed(seed: int, rank: int, worker_id: int, epoch: int = 0) -> int:
    """The seed of DataLoader worker `worker_id` of `rank`: distinct per (seed, rank, worker,
    epoch), the same in every run."""
    return mix_seed(seed, rank, worker_id, epoch) % (MAX_SEED + 1)


@dataclass(frozen=True)
class WorkerSeeder:
    """A picklable `worker_init_fn` (spawned workers receive it pickled; a closure would fail)."""

    seed: int
    rank: int
    epoch: int = 0

    def __call__(self, worker_id: int) -> None:
        # SLURM signals every process of a step: the workers leave preemption signals to the
        # training process, which stops them itself (a worker killed by SIGUSR2 would crash it).
        for signum in (signal.SIGUSR2, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)
        _seed_all(worker_seed(self.seed, self.rank, worker_id, self.epoch))


def worker_init_fn(seed: int, rank: int = 0, *, epoch: int = 0) -> WorkerSeeder:
    """A DataLoader `worker_init_fn` giving each worker its `worker_seed` (python, numpy, torch).

    Workers run it when they start. With `persistent_workers=True` (make_train_loader) they start
    once and their streams continue across epochs, so each epoch draws new augmentations. Without
    persistent workers they restart every epoch with the same seeds: pass the current `epoch`
    and build the loader anew, or every epoch repeats the previous one's augmentations.
    A resumed run repeats the data order exactly; augmentation draws repeat only from the start
    of an epoch (the workers' RNG state is not checkpointed).
    """
    if not 0 <= seed <= MAX_SEED:
        raise UsageError(f"seed={seed} not in 0..{MAX_SEED}; pick a seed in that range")
    return WorkerSeeder(seed, rank, epoch)


def available_cpus() -> int:
    """CPUs this process may run on: the affinity mask (SLURM's or the container's allocation),
    not the machine's core count, which oversubscribes a shared node."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # macOS has no affinity mask


def default_num_workers(local_world_size: int, *, num_cpus: int | None = None) -> int:
    """DataLoader workers per rank: the rank's share of the CPUs, minus one for the rank itself.

    `num_cpus` defaults to `available_cpus()`, shared by the `local_world_size` ranks of the node,
    and the result lies in 0..MAX_DEFAULT_WORKERS (0 loads in the main process). Under
    `srun --cpu-bind` the affinity is already per task and this is conservative: pass
    `num_workers` yourself to use all of it.
    """
    if local_world_size < 1:
        raise UsageError(f"local_world_size={local_world_size} must be >= 1")
    cpus = available_cpus() if num_cpus is None else num_cpus
    return max(0, min(MAX_DEFAULT_WORKERS, cpus // local_world_size - 1))
