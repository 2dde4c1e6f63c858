"""The Trainer's training data: its loader, and how many optimizer steps an epoch holds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset

from phalanx.config.training import TrainerConfig
from phalanx.data.loader import make_iterable_loader, make_train_loader
from phalanx.data.sampler import GlobalOrderSampler
from phalanx.env import ClusterEnv


def train_loader(
    dataset: Dataset[Any], *, config: TrainerConfig, env: ClusterEnv, device: torch.device,
    collate_fn: Callable[[list[Any]], Any] | None, start: tuple[int, int],
) -> Any:  # fmt: skip
    """A loader that continues at `start` = (epoch, global sample index)."""
    data = config.data
    workers = None if data.num_workers < 0 else data.num_workers
    pin = data.pin_memory and device.type == "cuda"
    if isinstance(dataset, IterableDataset):
        return make_iterable_loader(
            dataset, env=env, batch_size=data.batch_size, seed=config.train.seed,
            num_workers=workers, collate_fn=collate_fn, pin_memory=pin,
            worker_start=data.worker_start,
        )  # fmt: skip
    return make_train_loader(
        dataset, env=env, batch_size=data.batch_size, seed=config.train.seed,
        shuffle=data.shuffle, drop_last=data.drop_last, num_workers=workers,
        collate_fn=collate_fn, pin_memory=pin, start=start, worker_start=data.worker_start,
    )  # fmt: skip


def steps_per_epoch(sampler: GlobalOrderSampler, grad_accum: int) -> int:
    """Optimizer steps in one epoch: full global batches, plus the last partial one when
    every rank gets a sample of it (a step needs data on all ranks)."""
    size, batch, world = sampler.dataset_len, sampler.batch_size, sampler.world_size
    micro = size // (batch * world)
    if not sampler.drop_last and size % (batch * world) > (world - 1) * batch:
        micro += 1
    return micro // grad_accum
