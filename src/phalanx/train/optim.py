"""Optimizer and learning-rate schedule set-up: factories, linear LR scaling, warm-up."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeAlias, cast

import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from phalanx.config.training import SHARDED_STRATEGIES, TrainConfig
from phalanx.errors import UsageError

OptimizerArg: TypeAlias = Optimizer | Callable[[Iterator[nn.Parameter]], Optimizer]
"""An optimizer, or a factory over the wrapped model's parameters (required for FSDP/HSDP, whose
parameters are replaced by shards after the model is given)."""
SchedulerArg: TypeAlias = LRScheduler | Callable[[Optimizer], LRScheduler]
"""A learning-rate scheduler, or a factory over the optimizer the Trainer built."""


def build_optimizer(
    optimizer: OptimizerArg, model: nn.Module, train: TrainConfig, world_size: int
) -> Optimizer:
    """An Optimizer (as given, or from a factory over the wrapped model's parameters)."""
    if isinstance(optimizer, torch.optim.Optimizer) and train.strategy in SHARDED_STRATEGIES:
        raise UsageError(
            f"train.strategy={train.strategy} replaces the model's parameters with shards, so an "
            "optimizer built before would update nothing; pass a factory: optimizer=lambda params: "
            "torch.optim.AdamW(params, lr=...)"
        )
    if not isinstance(optimizer, torch.optim.Optimizer):
        if not callable(optimizer):
            raise UsageError("optimizer must be a torch.optim.Optimizer or a factory(params)")
        optimizer = optimizer(model.parameters())
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise UsageError("the optimizer factory must return a torch.optim.Optimizer")
    if train.lr_scaling == "linear":
        # Same per-sample step size as one rank: the global batch is world_size times larger.
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * world_size
    return optimizer


def build_scheduler(
    scheduler: SchedulerArg | None, optimizer: Optimizer, train: TrainConfig
) -> LRScheduler | None:
    """The user's scheduler (instance or factory), with linear warm-up in front if asked for."""
    user: LRScheduler | None = None
    # Duck-typed on `step` rather than isinstance: schedulers outside torch's class tree work too.
    if scheduler is not None and not callable(getattr(scheduler, "step", None)):
        if not callable(scheduler):
            raise UsageError("scheduler must be an LRScheduler or a factory(optimizer)")
        user = scheduler(optimizer)
    elif scheduler is not None:
        if train.lr_scaling == "linear":
            raise UsageError(
                "train.lr_scaling=linear changes learning rates after your scheduler captured "
                "them; pass the scheduler as a factory: scheduler=lambda opt: ..."
            )
        user = cast(LRScheduler, scheduler)
    if not train.warmup_steps:
        return user
    warm = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / train.warmup_steps)
    )
    if user is None:
        return warm
    return torch.optim.lr_scheduler.SequentialLR(
        optimizer, [warm, user], milestones=[train.warmup_steps]
    )
