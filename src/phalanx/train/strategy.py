"""Model wrapping: single device, DDP or FSDP2, then torch.compile as torch recommends.

For DDP the DDP-wrapped module is compiled, so TorchDynamo's DDPOptimizer splits graphs at
bucket boundaries and communication overlaps the backward pass. FSDP2 shards the model in place
(phalanx.train.fsdp). State dicts never carry wrapper prefixes (`module.`, `_orig_mod.`):
checkpoints load into a plain model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from phalanx.checkpoint.checkpointer import module_state_dict
from phalanx.checkpoint.pretrained import Read, load_pretrained
from phalanx.dist.process_group import Dist
from phalanx.errors import UsageError
from phalanx.train.activation_checkpoint import checkpoint_units
from phalanx.train.fsdp import shard_model, shard_new_model
from phalanx.train.meta_init import (
    InitFn,
    ModelFactory,
    build_on_meta,
    check_resettable,
    init_whole,
    is_factory,
    materialize,
    seeded,
)


def resolve_strategy(requested: str, world_size: int) -> str:
    """'auto' becomes ddp with several ranks, single otherwise."""
    if requested == "auto":
        return "ddp" if world_size > 1 else "single"
    return requested


def wrap_model(
    model: nn.Module | ModelFactory,
    handle: Dist,
    *,
    strategy: str,
    compile: bool = False,
    static_graph: bool = False,
    bucket_mb: float = 25.0,
    fsdp_units: tuple[str, ...] = (),
    fsdp_reshard: bool = True,
    precision: str = "fp32",
    activation_checkpointing: str = "none",
    init_weights: InitFn | None = None,
    seed: int = 0,
    pretrained: Path | str | None = None,
    pretrained_read: Read = "slices",
) -> nn.Module:
    """Move `model` to the rank's device and wrap it for `strategy` (single, ddp or fsdp).

    `model` may be a factory (`lambda: MyModel(cfg)`): built on the meta device, then given
    storage on the rank's device and initialised from `seed` (each module's reset_parameters(),
    or `init_weights(model)`), sharded on the way under FSDP (phalanx.train.meta_init).
    `pretrained` (a torch.save file, .safetensors file or directory of them) replaces that
    initialisation: each rank reads its own shards into storage for its shards only
    (phalanx.checkpoint.pretrained). With `init_weights` too, keys the file lacks keep
    init_weights' values. An instance is loaded before it is wrapped.
    """
    chosen = resolve_strategy(strategy, handle.env.world_size)
    fresh = is_factory(model)
    if fresh:
        model = build_on_meta(cast(ModelFactory, model))
        if pretrained is not None:
            init_weights = _pretrained_init(pretrained, init_weights, pretrained_read)
    elif init_weights is not None:
        raise UsageError(
            "init_weights initialises a model built by phalanx; pass model=lambda: MyModel(...) "
            "or initialise the instance yourself"
        )
    elif pretrained is not None:
        load_pretrained(cast(nn.Module, model), pretrained, read=pretrained_read)
    model = cast(nn.Module, model)
    checkpoint_units(model, fsdp_units, activation_checkpointing)
    if chosen == "fsdp":
        if fresh:
            sharded = shard_new_model(
                model, device=handle.device, unit_names=fsdp_units, precision=precision,
                reshard=fsdp_reshard, init_weights=init_weights, seed=seed, rank=handle.env.rank,
            )  # fmt: skip
        else:
            sharded = shard_model(
                model.to(handle.device), unit_names=fsdp_units, precision=precision,
                reshard=fsdp_reshard,
            )  # fmt: skip
        return _maybe_compile(sharded, compile)
    if fresh:
        _materialize_whole(model, handle.device, init_weights, seed)
    model = model.to(handle.device)
    wrapped: nn.Module = model
    if chosen == "ddp":
        device_ids = [handle.device.index] if handle.device.type == "cuda" else None
        wrapped = DistributedDataParallel(
            model,
            device_ids=device_ids,
            gradient_as_bucket_view=True,
            static_graph=static_graph,
            bucket_cap_mb=bucket_mb,
        )
    return _maybe_compile(wrapped, compile)


def _materialize_whole(
    model: nn.Module, device: torch.device, init_weights: InitFn | None, seed: int
) -> None:
    """Single and DDP hold the whole model anyway: storage for all of it, then the same
    initialisation as under FSDP (every rank from `seed`; DDP broadcasts rank 0's regardless)."""
    with seeded(seed, device):
        if init_weights is None:
            check_resettable(model)
            materialize(model, device)
        else:
            init_whole(model, device, init_weights)


def _pretrained_init(path: Path | str, init_weights: InitFn | None, read: Read) -> InitFn:
    """The file's weights, over init_weights' when both are given (then the file may lack
    keys: a new head); called on the model once it has (sharded) storage."""

    def init(model: nn.Module) -> None:
        if init_weights is not None:
            init_weights(model)
        load_pretrained(model, path, read=read, strict=init_weights is None)

    return init


def _maybe_compile(model: nn.Module, compile: bool) -> nn.Module:
    return cast(nn.Module, torch.compile(model)) if compile else model


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
