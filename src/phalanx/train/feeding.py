"""The Trainer's data: its training and evaluation loaders, how many optimizer steps an epoch
holds, the feed that copies the next step's batches to the device while the current step runs,
and the start-up advice about worker processes."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from phalanx.config.training import TrainerConfig
from phalanx.data.cost import CostAdvice
from phalanx.data.loader import (
    make_eval_loader,
    make_iterable_loader,
    make_train_loader,
    start_workers,
)  # fmt: skip
from phalanx.data.sampler import GlobalOrderSampler
from phalanx.env import ClusterEnv
from phalanx.train.step import to_device

log = logging.getLogger("phalanx.train")


def train_loader(
    dataset: Dataset[Any], *, config: TrainerConfig, env: ClusterEnv, device: torch.device,
    collate_fn: Callable[[list[Any]], Any] | None, start: tuple[int, int],
    ranks: tuple[int, int] | None = None,
) -> Any:  # fmt: skip
    """A loader that continues at `start` = (epoch, global sample index), over the data ranks
    `ranks` = (this one, their number; default every rank)."""
    data = config.data
    workers = None if data.num_workers < 0 else data.num_workers
    pin = data.pin_memory and device.type == "cuda"
    if isinstance(dataset, IterableDataset):
        return make_iterable_loader(
            dataset, env=env, batch_size=data.batch_size, seed=config.train.seed,
            num_workers=workers, collate_fn=collate_fn, pin_memory=pin,
            worker_start=data.worker_start, ranks=ranks,
        )  # fmt: skip
    return make_train_loader(
        dataset, env=env, batch_size=data.batch_size, seed=config.train.seed,
        shuffle=data.shuffle, drop_last=data.drop_last, num_workers=workers,
        collate_fn=collate_fn, pin_memory=pin, start=start, worker_start=data.worker_start,
        ranks=ranks,
    )  # fmt: skip


def eval_loader(
    dataset: Dataset[Any], config: TrainerConfig, env: ClusterEnv,
    collate_fn: Callable[[list[Any]], Any] | None, ranks: tuple[int, int],
) -> DataLoader[Any]:  # fmt: skip
    """A loader over this rank's shard of the evaluation data (built anew for each evaluation)."""
    data = config.data
    return make_eval_loader(
        dataset, env=env, batch_size=data.eval_batch_size or data.batch_size,
        collate_fn=collate_fn, worker_start=data.worker_start,
        num_workers=None if data.num_workers < 0 else data.num_workers, ranks=ranks,
    )  # fmt: skip


class WorkerAdvice:
    """Starts the training loader's workers; the first time (since it was made or closed), when
    phalanx chose the worker count (`data.num_workers=-1`) and on rank 0 only, a `CostAdvice`
    times the data set's samples beside the run and logs whether batches would cost less made
    in the training process."""

    def __init__(self, config: TrainerConfig, env: ClusterEnv) -> None:
        self._wanted = config.data.num_workers < 0 and env.is_main_process
        self._pending = self._wanted
        self._advice: CostAdvice | None = None

    def start(self, loader: DataLoader[Any]) -> Iterator[Any]:
        batches = start_workers(loader)  # a data set the workers cannot receive fails here
        # Map-style data batched by the loader (a stream's samples cannot be read twice).
        timeable = not isinstance(loader.dataset, IterableDataset) and loader.batch_size is not None
        if self._pending and timeable and loader.num_workers > 0:
            self._advice = CostAdvice(loader, log.info)
        self._pending = False
        return batches

    def close(self) -> None:
        """Waits briefly for a pending answer (a short run may end first), ends the child; the
        next start() (another fit()) may advise again."""
        advice, self._advice, self._pending = self._advice, None, self._wanted
        if advice is not None:
            advice.close()


def steps_per_epoch(sampler: GlobalOrderSampler, grad_accum: int) -> int:
    """Optimizer steps in one epoch: full global batches, plus the last partial one when
    every rank gets a sample of it (a step needs data on all ranks)."""
    size, batch, world = sampler.dataset_len, sampler.batch_size, sampler.world_size
    micro = size // (batch * world)
    if not sampler.drop_last and size % (batch * world) > (world - 1) * batch:
        micro += 1
    return micro // grad_accum


def common_steps_left(sampler: GlobalOrderSampler, grad_accum: int) -> int:
    """Optimizer steps every rank can still take from the sampler's position: the same number
    on every rank, so the Trainer needs no per-step agreement about data (map-style data)."""
    rest = sampler.end_index - sampler.start_index
    full, tail = divmod(rest, sampler.global_batch_size)
    # A short last batch counts when even the last rank gets a sample of it.
    micro = full + (1 if tail > (sampler.world_size - 1) * sampler.batch_size else 0)
    return micro // grad_accum


class DeviceFeed:
    """The micro-batches of one optimizer step at a time, moved to `device`.

    `prefetch()` takes the next step's batches from the loader and starts their host-to-device
    copy; on CUDA on a side stream, so the copy overlaps the step being computed instead of
    queueing behind it. `take()` hands them over (the compute stream waits for the copy on the
    GPU, not on the host). Batches are counted as consumed by the caller once a step ran, so a
    prefetched batch never moves the resume position.
    """

    def __init__(self, it: Iterator[Any], device: torch.device, per_step: int) -> None:
        self._it, self._device, self._per_step = it, device, per_step
        self._stream = (
            torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
            if device.type == "cuda"
            else None
        )
        self._ready: list[Any] | None = None

    def prefetch(self) -> None:
        batches = []
        for _ in range(self._per_step):
            try:
                batches.append(next(self._it))
            except StopIteration:
                break
        if self._stream is None:
            self._ready = [to_device(b, self._device) for b in batches]
            return
        with torch.cuda.stream(self._stream):
            self._ready = [to_device(b, self._device) for b in batches]

    def take(self) -> list[Any]:
        """This step's micro-batches (fewer than per_step, or none, at the end of the data)."""
        if self._ready is None:
            self.prefetch()
        batches, self._ready = self._ready, None
        assert batches is not None
        if self._stream is not None:
            current = torch.cuda.current_stream(self._device)
            current.wait_stream(self._stream)
            _record_on(batches, current)  # their memory is the side stream's until then
        return batches


def _record_on(batch: Any, stream: torch.cuda.Stream) -> None:
    if isinstance(batch, torch.Tensor):
        if batch.device.type == "cuda":
            batch.record_stream(stream)
    elif isinstance(batch, Mapping):
        for value in batch.values():
            _record_on(value, stream)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            _record_on(value, stream)


def sampler_of(loader: Any) -> GlobalOrderSampler | None:
    """The training loader's sampler for map-style data (None: iterable data)."""
    return loader.sampler if isinstance(loader.sampler, GlobalOrderSampler) else None
