"""Model wrapping: single device, DDP, FSDP2 or HSDP (FSDP2 on a 2-D mesh), then torch.compile
as torch recommends.

For DDP the DDP-wrapped module is compiled, so TorchDynamo's DDPOptimizer splits graphs at
bucket boundaries and communication overlaps the backward pass. Under FSDP and HSDP each unit's
forward is compiled before sharding, the root is not (phalanx.train.compiling). FSDP2 shards the
model in place (phalanx.train.fsdp). State dicts never carry wrapper prefixes (`module.`,
`_orig_mod.`): checkpoints load into a plain model.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from phalanx.checkpoint.checkpointer import module_state_dict
from phalanx.checkpoint.pretrained import Read, load_pretrained
from phalanx.config.training import SHARDED_STRATEGIES
from phalanx.dist.process_group import Dist
from phalanx.errors import UsageError
from phalanx.train.activation_checkpoint import checkpoint_units
from phalanx.train.compiling import compile_units
from phalanx.train.fsdp import shard_model, shard_new_model
from phalanx.train.hsdp import hsdp_mesh
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

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


def resolve_strategy(requested: str, world_size: int) -> str:
    """'auto' becomes ddp with several ranks, single otherwise."""
    if requested == "auto":
        return "ddp" if world_size > 1 else "single"
    return requested


def ddp_oom_message(error: BaseException, *, requested: str, world_size: int) -> str | None:
    """The one-line fix for a GPU out-of-memory error of a run that strategy=auto put on DDP;
    None for any other error or a strategy the user chose."""
    if not isinstance(error, torch.OutOfMemoryError) or requested != "auto":
        return None
    if resolve_strategy(requested, world_size) != "ddp":
        return None
    return (
        "DDP ran out of GPU memory (train.strategy=auto chose ddp: every rank holds the whole "
        "model, its gradients and optimizer state); set train.strategy=fsdp "
        "checkpoint.sharded=true to shard them over the ranks"
    )


@contextlib.contextmanager
def explain_ddp_oom(requested: str, world_size: int) -> Iterator[None]:
    """Turn an out-of-memory error inside into ddp_oom_message's UsageError, where it applies."""
    try:
        yield
    except torch.OutOfMemoryError as error:
        message = ddp_oom_message(error, requested=requested, world_size=world_size)
        if message is None:
            raise
        raise UsageError(message) from error


def wrap_model(
    model: nn.Module | ModelFactory,
    handle: Dist,
    *,
    strategy: str,
    compile: bool = False,
    compile_mode: str = "default",
    static_graph: bool = False,
    bucket_mb: float = 25.0,
    broadcast_buffers: bool = True,
    fsdp_units: tuple[str, ...] = (),
    fsdp_reshard: bool = True,
    precision: str = "fp32",
    activation_checkpointing: str = "none",
    init_weights: InitFn | None = None,
    seed: int = 0,
    hsdp_shard_size: int = 0,
    pretrained: Path | str | None = None,
    pretrained_read: Read = "slices",
) -> nn.Module:
    """Move `model` to the rank's device and wrap it for `strategy` (single, ddp, fsdp or hsdp:
    sharded within groups of `hsdp_shard_size` ranks, 0: a node's, replicated across them).

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
    model, init_weights = _built(model, init_weights, pretrained, pretrained_read)
    checkpoint_units(model, fsdp_units, activation_checkpointing)
    if chosen in SHARDED_STRATEGIES:
        mesh = hsdp_mesh(handle.env, hsdp_shard_size, handle.device) if chosen == "hsdp" else None
        if compile:  # per unit, before sharding (phalanx.train.compiling)
            compile_units(model, fsdp_units, compile_mode)
        return _shard(
            model, handle, fresh=fresh, mesh=mesh, unit_names=fsdp_units, precision=precision,
            reshard=fsdp_reshard, init_weights=init_weights, seed=seed,
        )  # fmt: skip
    if fresh:
        _materialize_whole(model, handle.device, init_weights, seed)
    model = model.to(handle.device)
    if chosen == "ddp":
        model = _ddp(model, handle.device, static_graph, bucket_mb, broadcast_buffers)
    return _maybe_compile(model, compile, compile_mode)


def _shard(
    model: nn.Module, handle: Dist, *, fresh: bool, mesh: DeviceMesh | None,
    unit_names: tuple[str, ...], precision: str, reshard: bool, init_weights: InitFn | None,
    seed: int,
) -> nn.Module:  # fmt: skip
    """FSDP2 (or HSDP on `mesh`): a factory's model gets storage shard by shard, an instance is
    moved to the device and sharded."""
    if fresh:
        return shard_new_model(
            model, device=handle.device, unit_names=unit_names, precision=precision,
            reshard=reshard, init_weights=init_weights, seed=seed, rank=handle.env.rank, mesh=mesh,
        )  # fmt: skip
    return shard_model(
        model.to(handle.device), unit_names=unit_names, precision=precision, reshard=reshard,
        mesh=mesh,
    )  # fmt: skip


def _ddp(
    model: nn.Module, device: torch.device, static_graph: bool, bucket_mb: float, buffers: bool
) -> DistributedDataParallel:
    """DDP with gradients as views of its buckets (no copy per step; stable addresses for the
    gradient norm's CUDA graph, phalanx.train.grad_norm)."""
    return DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None,
        gradient_as_bucket_view=True, static_graph=static_graph, bucket_cap_mb=bucket_mb,
        **ddp_buffer_sync(buffers),
    )  # fmt: skip


def _built(
    model: nn.Module | ModelFactory,
    init_weights: InitFn | None,
    pretrained: Path | str | None,
    read: Read,
) -> tuple[nn.Module, InitFn | None]:
    """A factory's model on meta, with the initialiser its storage will get (pretrained weights
    included); an instance as it is, pretrained weights already loaded."""
    if is_factory(model):
        built = build_on_meta(cast(ModelFactory, model))
        if pretrained is not None:
            init_weights = _pretrained_init(pretrained, init_weights, read)
        return built, init_weights
    if init_weights is not None:
        raise UsageError(
            "init_weights initialises a model built by phalanx; pass model=lambda: MyModel(...) "
            "or initialise the instance yourself"
        )
    model = cast(nn.Module, model)
    if pretrained is not None:
        load_pretrained(model, pretrained, read=read)
    return model, None


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


def ddp_buffer_sync(every_forward: bool) -> dict[str, Any]:
    """DDP's keyword for skipping the buffer copy before each forward: torch 2.13 renamed
    broadcast_buffers to forward_sync_buffers and warns on the old name (the new one still
    syncs at construction, which keeps every rank's start identical). Default: nothing."""
    if every_forward:
        return {}
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def _maybe_compile(model: nn.Module, compile: bool, mode: str) -> nn.Module:
    return cast(nn.Module, torch.compile(model, mode=mode)) if compile else model


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

    Sharded (train.strategy=fsdp or hsdp): the whole state, gathered to CPU on rank 0 and empty
    on the others; a collective, so every rank must call it."""
    return module_state_dict(unwrap(model))


def ddp_module(model: nn.Module) -> DistributedDataParallel | None:
    """The DDP wrapper under an optional compile wrapper, or None."""
    inner = cast(nn.Module, model._orig_mod) if hasattr(model, "_orig_mod") else model
    return inner if isinstance(inner, DistributedDataParallel) else None
