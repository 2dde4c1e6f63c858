"""The wrappers a model may wear (DDP, torch.compile) and the way back to the user's module.

phalanx.train.parallelize puts them on; here: DDP's construction, `unwrap`, the state dict
without wrapper prefixes (`module.`, `_orig_mod.`: checkpoints load into a plain model), and the
one-line advice when DDP, chosen by train.strategy=auto, runs out of GPU memory.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from phalanx.checkpoint.checkpointer import module_state_dict
from phalanx.errors import UsageError

if TYPE_CHECKING:
    pass


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


def ddp_wrap(
    model: nn.Module, device: torch.device, *, static_graph: bool, bucket_mb: float,
    buffers: bool,
) -> DistributedDataParallel:  # fmt: skip
    """DDP with gradients as views of its buckets (no copy per step; stable addresses for the
    gradient norm's CUDA graph, phalanx.train.grad_norm)."""
    return DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None,
        gradient_as_bucket_view=True, static_graph=static_graph, bucket_cap_mb=bucket_mb,
        **ddp_buffer_sync(buffers),
    )  # fmt: skip


def ddp_buffer_sync(every_forward: bool) -> dict[str, Any]:
    """DDP's keyword for skipping the buffer copy before each forward: torch 2.13 renamed
    broadcast_buffers to forward_sync_buffers and warns on the old name (the new one still
    syncs at construction, which keeps every rank's start identical). Default: nothing."""
    if every_forward:
        return {}
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


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
