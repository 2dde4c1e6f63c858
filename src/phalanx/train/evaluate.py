"""Evaluation that counts every sample exactly once, on any number of ranks.

Each rank runs its own shard (no padding, so shards may differ in size; the unwrapped model
runs without collectives), eval_step returns per-sample values, and one reduction at the end
gives the mean over the whole data set — equal to a single-process evaluation.

A sharded model (FSDP, tensor parallelism) runs collectives in every forward, so all ranks
must run the same number of forwards: with `lockstep_steps` a rank whose shard is done runs its
last batch again and drops the result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from phalanx.errors import UsageError
from phalanx.train.fsdp import reshard_all
from phalanx.train.metrics import Metrics
from phalanx.train.precision import Precision
from phalanx.train.step import to_device

EvalFn = Callable[[nn.Module, Any], Mapping[str, torch.Tensor]]


def evaluate(
    model: nn.Module,
    batches: Iterable[Any],
    eval_step: EvalFn,
    *,
    device: torch.device,
    precision: Precision,
    max_batches: int | None = None,
    lockstep_steps: int | None = None,
) -> dict[str, float]:
    """Mean of every per-sample value eval_step returns, over all samples of all ranks."""
    metrics = Metrics(device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for batch, counts in _schedule(batches, max_batches, lockstep_steps):
                with precision.autocast():
                    out = eval_step(model, to_device(batch, device))
                if not isinstance(out, Mapping):
                    raise UsageError(
                        "eval_step must return a dict of per-sample tensors, e.g. "
                        f"{{'accuracy': (pred == y).float()}}; got {type(out).__name__}"
                    )
                for name, value in out.items():
                    if counts:
                        # A copy, not a reference: a model compiled with CUDA graphs
                        # (train.compile_mode) overwrites its outputs on the next batch.
                        metrics.add(f"eval/{name}", value.to(torch.float32, copy=True))
    finally:
        model.train(was_training)
        reshard_all(model)
    return metrics.compute()


def _schedule(
    batches: Iterable[Any], max_batches: int | None, lockstep_steps: int | None
) -> Iterator[tuple[Any, bool]]:
    """(batch, counts) pairs: this rank's batches, then, in lock step, its last one again
    (not counted) until `lockstep_steps` forwards have run."""
    limits = [n for n in (max_batches, lockstep_steps) if n is not None]
    limit = min(limits) if limits else None
    last, done = None, 0
    for batch in batches:
        if limit is not None and done >= limit:
            return
        last, done = batch, done + 1
        yield batch, True
    if lockstep_steps is None or limit is None:
        return
    assert last is not None or done == limit, "every rank holds at least one eval sample"
    for _ in range(done, limit):
        yield last, False


def lockstep_steps(loader: Any, world_size: int) -> int:
    """For a sharded model (its forward runs collectives), the forward count every rank runs
    over `loader` (a make_eval_loader loader over `world_size` data ranks)."""
    sampler = loader.sampler
    if sampler.dataset_len < world_size:
        raise UsageError(
            f"eval_data has {sampler.dataset_len} samples for {world_size} ranks; with "
            "train.strategy=fsdp every rank needs at least one (all run each forward)"
        )
    return int(sampler.num_steps(loader.batch_size))
