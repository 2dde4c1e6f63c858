"""Picklable objects, model parameters and optimizer state, sent from one rank to all."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from phalanx.errors import UsageError
from phalanx.horovod.gather import broadcast_raw
from phalanx.horovod.process_sets import global_process_set, refuse_process_set
from phalanx.horovod.protocol import negotiate
from phalanx.horovod.runtime import RUNTIME


def broadcast_object(
    obj: Any, root_rank: int = 0, name: str | None = None, process_set: Any = global_process_set
) -> Any:
    """root_rank's `obj` on every rank (pickled)."""
    refuse_process_set(process_set)
    negotiate("broadcast_object", dict)
    if RUNTIME.require().env.world_size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=root_rank, group=RUNTIME.object_group())
    return box[0]


def allgather_object(
    obj: Any, name: str | None = None, process_set: Any = global_process_set
) -> list[Any]:
    """Every rank's `obj`, in rank order."""
    refuse_process_set(process_set)
    negotiate("allgather_object", dict)
    out: list[Any] = [None] * RUNTIME.require().env.world_size
    dist.all_gather_object(out, obj, group=RUNTIME.object_group())
    return out


def _broadcast_tensors(tensors: list[torch.Tensor], root_rank: int) -> None:
    """One broadcast per (dtype, device) instead of one per tensor."""
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault((tensor.dtype, tensor.device), []).append(tensor)
    with torch.no_grad():
        for members in groups.values():
            flat = torch.cat([t.reshape(-1) for t in members])
            broadcast_raw(flat, root_rank)
            offset = 0
            for t in members:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()


def broadcast_parameters(params: Any, root_rank: int = 0) -> None:
    """Overwrite every rank's tensors with root_rank's: a state_dict, or (name, tensor) pairs
    such as model.named_parameters(). Sorted by name, so every rank sends the same order."""
    if isinstance(params, Mapping):
        items = sorted(params.items())
    elif isinstance(params, Iterable):
        items = list(params)
    else:
        raise UsageError(
            f"broadcast_parameters takes a dict or (name, tensor) pairs, not {params!r}"
        )
    tensors = [p for _, p in items if torch.is_tensor(p)]
    _broadcast_tensors(tensors, root_rank)


def _create_state(optimizer: torch.optim.Optimizer) -> None:
    """Give an optimizer its state by one step on zero gradients, parameters left unchanged.

    Horovod takes such a step too; here parameters and gradients are restored afterwards, so
    weight decay cannot move the parameters on some ranks."""
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    saved = [(p.detach().clone(), p.grad) for p in params]
    for p in params:
        p.grad = torch.zeros_like(p)
    step = getattr(optimizer, "_phalanx_local_step", optimizer.step)
    step()
    with torch.no_grad():
        for p, (value, grad) in zip(params, saved, strict=True):
            p.copy_(value)
            p.grad = grad


def _split(value: Any, tensors: list[torch.Tensor]) -> Any:
    """Replace tensors in a nested state by placeholders (shape, dtype), collecting them."""
    if torch.is_tensor(value):
        tensors.append(value)
        return ("__tensor__", tuple(value.shape), value.dtype, value.device.type)
    if isinstance(value, dict):
        return {k: _split(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_split(v, tensors) for v in value)
    return value


def _fill(skeleton: Any, tensors: list[torch.Tensor], device: torch.device) -> Any:
    """The inverse of _split: empty tensors (CPU ones stay on the CPU) where placeholders are."""
    if isinstance(skeleton, tuple) and len(skeleton) == 4 and skeleton[0] == "__tensor__":
        where = torch.device("cpu") if skeleton[3] == "cpu" else device
        tensor = torch.empty(skeleton[1], dtype=skeleton[2], device=where)
        tensors.append(tensor)
        return tensor
    if isinstance(skeleton, dict):
        return {k: _fill(v, tensors, device) for k, v in skeleton.items()}
    if isinstance(skeleton, (list, tuple)):
        return type(skeleton)(_fill(v, tensors, device) for v in skeleton)
    return skeleton


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer, root_rank: int = 0, model: Any = None
) -> None:
    """Every rank's optimizer takes root_rank's state and hyperparameters (lr, betas, step...).

    An optimizer without state yet (before its first step) gets one first, on every rank."""
    if not optimizer.state_dict()["state"]:
        _create_state(optimizer)
    mine: list[torch.Tensor] = []
    skeleton = _split(optimizer.state_dict(), mine)
    skeleton = broadcast_object(skeleton, root_rank)
    device = RUNTIME.require().device
    received: list[torch.Tensor] = []
    state = _fill(skeleton, received, device)
    if RUNTIME.require().env.rank == root_rank:
        for target, source in zip(received, mine, strict=True):
            target.copy_(source)
    _broadcast_tensors(received, root_rank)
    optimizer.load_state_dict(state)
