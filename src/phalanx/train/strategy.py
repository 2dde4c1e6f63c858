"""Model wrapping: single device, DDP or FSDP2, then torch.compile as torch recommends.

For DDP the DDP-wrapped module is compiled, so TorchDynamo's DDPOptimizer splits graphs at
bucket boundaries and communication overlaps the backward pass. FSDP2 shards the model in place
(phalanx.train.fsdp). State dicts never carry wrapper prefixes (`module.`, `_orig_mod.`):
checkpoints load into a plain model.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from phalanx.checkpoint.checkpointer import module_state_dict
from phalanx.dist.process_group import Dist
from phalanx.train.fsdp import shard_model


def resolve_strategy(requested: str, world_size: int) -> str:
    """'auto' becomes ddp with several ranks, single otherwise."""
    if requested == "auto":
        return "ddp" if world_size > 1 else "single"
    return requested


def wrap_model(
    model: nn.Module,
    handle: Dist,
    *,
    strategy: str,
    compile: bool = False,
    static_graph: bool = False,
    bucket_mb: float = 25.0,
    fsdp_units: tuple[str, ...] = (),
    fsdp_reshard: bool = True,
    precision: str = "fp32",
) -> nn.Module:
    """Move `model` to the rank's device and wrap it for `strategy` (single, ddp or fsdp)."""
    model = model.to(handle.device)
    wrapped: nn.Module = model
    chosen = resolve_strategy(strategy, handle.env.world_size)
    if chosen == "fsdp":
        wrapped = shard_model(
            model, unit_names=fsdp_units, precision=precision, reshard=fsdp_reshard
        )
    elif chosen == "ddp":
        device_ids = [handle.device.index] if handle.device.type == "cuda" else None
        wrapped = DistributedDataParallel(
            model,
            device_ids=device_ids,
            gradient_as_bucket_view=True,
            static_graph=static_graph,
            bucket_cap_mb=bucket_mb,
        )
    if compile:
        wrapped = cast(nn.Module, torch.compile(wrapped))
    return wrapped


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside compile and DDP wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = cast(nn.Module, model._orig_mod)
        elif isinstance(model, DistributedDataParallel):
            model = model.module
        else:
            return model


def model_state_dict(model: nn.Module) -> dict[str, Any]:
    """The user's module's state dict, keys free of wrapper prefixes.

    Sharded (train.strategy=fsdp): the whole state, gathered to CPU on rank 0 and empty on the
    others; a collective, so every rank must call it."""
    return module_state_dict(unwrap(model))


def ddp_module(model: nn.Module) -> DistributedDataParallel | None:
    """The DDP wrapper under an optional compile wrapper, or None."""
    inner = cast(nn.Module, model._orig_mod) if hasattr(model, "_orig_mod") else model
    return inner if isinstance(inner, DistributedDataParallel) else None
