"""Optimizer and learning-rate schedule set-up: factories, linear LR scaling, warm-up."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from phalanx.config.training import SHARDED_STRATEGIES, TrainConfig
from phalanx.errors import UsageError


def build_optimizer(
    optimizer: Any, model: nn.Module, train: TrainConfig, world_size: int
) -> torch.optim.Optimizer:
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


def build_scheduler(scheduler: Any, optimizer: torch.optim.Optimizer, train: TrainConfig) -> Any:
    """The user's scheduler (instance or factory), with linear warm-up in front if asked for."""
    if scheduler is not None and not callable(getattr(scheduler, "step", None)):
        if not callable(scheduler):
            raise UsageError("scheduler must be an LRScheduler or a factory(optimizer)")
        scheduler = scheduler(optimizer)
    elif scheduler is not None and train.lr_scaling == "linear":
        raise UsageError(
            "train.lr_scaling=linear changes learning rates after your scheduler captured them; "
            "pass the scheduler as a factory: scheduler=lambda opt: ..."
        )
    if not train.warmup_steps:
        return scheduler
    warm = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / train.warmup_steps)
    )
    if scheduler is None:
        return warm
    return torch.optim.lr_scheduler.SequentialLR(
        optimizer, [warm, scheduler], milestones=[train.warmup_steps]
    )
