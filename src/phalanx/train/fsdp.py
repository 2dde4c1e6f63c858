"""FSDP2 (`torch.distributed.fsdp.fully_shard`): parameters, gradients and optimizer state sharded
over all ranks.

What phalanx decides for the user, and why:
- Units. Each unit is all-gathered before its forward and freed after, so peak memory holds one
  unit's full parameters at a time. Default: every child of every `nn.ModuleList` (the blocks of
  a transformer), then the root for whatever is left; `train.fsdp_units` names classes instead.
- Same start as DDP. `fully_shard` keeps each rank's own values, and DDP broadcasts rank 0's; a
  model built with different seeds per rank would otherwise start as a patchwork of shards.
  Rank 0's parameters and buffers are broadcast first.
- Precision. bf16 all-gathers parameters in bf16 and reduce-scatters gradients in fp32 (FSDP2's
  MixedPrecisionPolicy); autocast still runs on top, so the ops autocast keeps in fp32
  (normalisation, softmax, losses) stay there, as under DDP. fp16 is refused: its GradScaler
  would have to agree on overflows across shards.
- Models from a factory (phalanx.train.meta_init) are built on the meta device and get storage
  unit by unit, each unit sharded right after it is initialised: no rank holds the whole model.
- The optimizer must be built after sharding (fully_shard replaces the parameters), hence a
  factory; and checkpoints are sharded (DCP): each rank writes its own shards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from phalanx.dist.sharded_types import is_fsdp_module
from phalanx.errors import UsageError
from phalanx.train.meta_init import find_ties

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy

# torch's FSDP2 modules are imported where a model is sharded (phalanx.dist.sharded_types).


def check_ties(model: nn.Module, units: list[nn.Module]) -> None:
    """Tied parameters must live in one FSDP unit: FSDP shards and gathers a unit's tensors
    together, and a tensor claimed by two units would be sharded twice."""
    paths = {id(m): name for name, m in model.named_modules()}
    unit_paths = [paths[id(unit)] for unit in units]
    for names in find_ties(model):
        owners = {_unit_of(name, unit_paths) for name in names}
        if len(owners) > 1:
            shown = sorted(owner or "<root>" for owner in owners)
            raise UsageError(
                f"parameters {' and '.join(names)} are one tied tensor, but train.fsdp_units "
                f"puts them in different FSDP units ({', '.join(shown)}); choose units that "
                "hold both or neither (the root then holds them)"
            )


def _unit_of(param_name: str, unit_paths: list[str]) -> str:
    """The unit (its path; '' for the root) that shards the parameter named `param_name`."""
    return next((u for u in unit_paths if param_name.startswith(u + ".")), "")


def broadcast_from_rank0(model: nn.Module) -> None:
    """Every rank gets rank 0's parameters and buffers (what DDP does at wrap time)."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor, src=0)


def unit_sharder(
    units: list[nn.Module], *, mesh: DeviceMesh | None, precision: str, reshard: bool
) -> Callable[[nn.Module], None]:
    """fully_shard for a module that is one of `units`, nothing for any other: the callback
    that shards each unit as soon as it is materialised (meta_init.materialize's `after`), or
    is called on each unit of a model that has storage already. `mesh`: None shards over every
    rank; a 2-D (dp_replicate, dp_shard) mesh is HSDP; a 1-D one the dp_shard ranks beside
    tensor parallelism (phalanx.train.layout)."""
    from torch.distributed.fsdp import fully_shard

    policy, unit_ids = _policy(precision), {id(unit) for unit in units}

    def shard(module: nn.Module) -> None:
        if id(module) in unit_ids:
            fully_shard(module, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)

    return shard


def shard_root(model: nn.Module, *, mesh: DeviceMesh | None, precision: str) -> None:
    """fully_shard on the root (after its units): whatever no unit holds."""
    from torch.distributed.fsdp import fully_shard

    # The root's parameters are needed again right after forward (by backward): keep them.
    fully_shard(model, mesh=mesh, mp_policy=_policy(precision), reshard_after_forward=False)


def check_shardable(model: nn.Module, units: list[nn.Module], precision: str) -> None:
    """Refuse, before anything is sharded: an FSDP model, ties across units, fp16."""
    _policy(precision)
    if any(is_fsdp_module(m) for m in model.modules()):
        raise UsageError(
            "the model was already sharded with fully_shard; pass the plain model and let "
            "train.strategy=fsdp shard it (train.fsdp_units chooses the units)"
        )
    check_ties(model, units)


def _policy(precision: str) -> MixedPrecisionPolicy:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision not in ("fp32", "bf16", "fp8"):
        raise UsageError(f"precision={precision!r} with FSDP: use fp32, bf16 or fp8")
    low = precision != "fp32"  # fp8: bf16 outside its float8 matmuls
    return MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if low else None,
        reduce_dtype=torch.float32 if low else None,
    )


def reshard_all(model: nn.Module) -> None:
    """Free every gathered parameter. A forward without backward (evaluation) leaves the root's
    parameters gathered (it does not reshard after forward); saves and memory want shards."""
    for module in model.modules():
        if is_fsdp_module(module):
            cast("FSDPModule", module).reshard()
