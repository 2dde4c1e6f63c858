"""The Trainer's training data: its loader, and how many optimizer steps an epoch holds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch.utils.data import IterableDataset

from phalanx.data.loader import make_iterable_loader, make_train_loader
from phalanx.data.sampler import GlobalOrderSampler

if TYPE_CHECKING:
    from phalanx.train.trainer import Trainer


def train_loader(trainer: Trainer) -> Any:
    """A loader that continues at the trainer's data position (epoch, global sample index)."""
    data, env = trainer.config.data, trainer.env
    workers = None if data.num_workers < 0 else data.num_workers
    pin = data.pin_memory and trainer.handle.device.type == "cuda"
    if isinstance(trainer.train_data, IterableDataset):
        return make_iterable_loader(
            trainer.train_data, env=env, batch_size=data.batch_size,
            seed=trainer.config.train.seed, num_workers=workers, collate_fn=trainer.collate_fn,
            pin_memory=pin, worker_start=data.worker_start,
        )  # fmt: skip
    return make_train_loader(
        trainer.train_data, env=env, batch_size=data.batch_size, seed=trainer.config.train.seed,
        shuffle=data.shuffle, drop_last=data.drop_last, num_workers=workers,
        collate_fn=trainer.collate_fn, pin_memory=pin,
        start=(trainer.state.epoch, trainer.state.global_index), worker_start=data.worker_start,
    )  # fmt: skip


def steps_per_epoch(sampler: GlobalOrderSampler, grad_accum: int) -> int:
    """Optimizer steps in one epoch: full global batches, plus the last partial one when
    every rank gets a sample of it (a step needs data on all ranks)."""
    size, batch, world = sampler.dataset_len, sampler.batch_size, sampler.world_size
    micro = size // (batch * world)
    if not sampler.drop_last and size % (batch * world) > (world - 1) * batch:
        micro += 1
    return micro // grad_accum
