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

from typing import TYPE_CHECKING, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from phalanx.dist.sharded_types import is_dtensor, is_fsdp_module
from phalanx.errors import UsageError
from phalanx.train.meta_init import (
    InitFn,
    check_resettable,
    find_ties,
    init_whole,
    materialize,
    seeded,
)

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy

# torch's FSDP2 modules are imported where a model is sharded (phalanx.dist.sharded_types).


def shard_units(model: nn.Module, unit_names: tuple[str, ...]) -> list[nn.Module]:
    """The modules to shard one by one (root excluded), outermost first, none inside another
    (fully_shard on a module that an outer unit already manages would fail).

    Named classes: the modules of those classes. Default: the children of every nn.ModuleList.
    """
    if unit_names:
        found = {type(m).__name__ for m in model.modules()}
        missing = [name for name in unit_names if name not in found]
        if missing:
            raise UsageError(
                f"train.fsdp_units names {missing}, which the model does not contain; "
                f"its module classes are {sorted(found)}"
            )
        candidates = [m for m in model.modules() if type(m).__name__ in unit_names]
    else:
        lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
        candidates = [child for modules in lists for child in modules.children()]
    units: list[nn.Module] = []
    for module in candidates:  # model.modules() order: an outer module comes before its parts
        if module is not model and not any(_contains(unit, module) for unit in units):
            units.append(module)
    return units


def _contains(outer: nn.Module, inner: nn.Module) -> bool:
    return any(m is inner for m in outer.modules())


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


def shard_model(
    model: nn.Module,
    *,
    unit_names: tuple[str, ...],
    precision: str,
    reshard: bool,
    mesh: DeviceMesh | None = None,
) -> nn.Module:
    """Apply fully_shard to every unit, then to the root; the model's parameters become DTensors.

    `model` must already be on the rank's device, on every rank. `mesh`: None shards over all
    ranks; a 2-D ("replicate", "shard") mesh is HSDP (phalanx.train.hsdp).
    """
    from torch.distributed.fsdp import fully_shard

    policy = _policy(precision)
    _check_plain(model)
    units = shard_units(model, unit_names)
    check_ties(model, units)
    broadcast_from_rank0(model)
    for unit in units:
        fully_shard(unit, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
    _shard_root(model, policy, mesh)
    return model


def shard_new_model(
    model: nn.Module,
    *,
    device: torch.device,
    unit_names: tuple[str, ...],
    precision: str,
    reshard: bool,
    init_weights: InitFn | None,
    seed: int,
    rank: int,
    mesh: DeviceMesh | None = None,
) -> nn.Module:
    """Shard a model built on the meta device (a factory's), materialise and initialise it
    without a full copy on any rank.

    reset_parameters(): unit by unit, each sharded (its full copy freed) as soon as it is
    initialised, all ranks drawing from `seed`: the values do not depend on the world size.
    init_weights: shard on meta, then storage for the shards only and the user's function on
    DTensors, each rank drawing from seed + rank (torch gives no offset-based DTensor random
    init on CPU; where it does (CUDA), it syncs rank 0's generator and takes over); under HSDP
    from seed + the rank's place in its shard group, so that the replicas of a shard agree.
    """
    from torch.distributed.fsdp import fully_shard

    policy = _policy(precision)
    _check_plain(model)
    units = shard_units(model, unit_names)
    check_ties(model, units)
    if init_weights is None:
        check_resettable(model)
        unit_ids = {id(unit) for unit in units}

        def shard_unit(module: nn.Module) -> None:
            if id(module) in unit_ids:
                fully_shard(module, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)

        with seeded(seed, device):
            materialize(model, device, after=shard_unit)
        _shard_root(model, policy, mesh)
        return model
    for unit in units:
        fully_shard(unit, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
    _shard_root(model, policy, mesh)
    with seeded(seed + (rank if mesh is None else mesh.get_local_rank("shard")), device):
        init_whole(model, device, init_weights)
    return model


def _policy(precision: str) -> MixedPrecisionPolicy:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision not in ("fp32", "bf16"):
        raise UsageError(f"precision={precision!r} with FSDP: use fp32 or bf16")
    return MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if precision == "bf16" else None,
        reduce_dtype=torch.float32 if precision == "bf16" else None,
    )


def _check_plain(model: nn.Module) -> None:
    if any(is_fsdp_module(m) for m in model.modules()):
        raise UsageError(
            "the model was already sharded with fully_shard; pass the plain model and let "
            "train.strategy=fsdp shard it (train.fsdp_units chooses the units)"
        )


def _shard_root(model: nn.Module, policy: MixedPrecisionPolicy, mesh: DeviceMesh | None) -> None:
    from torch.distributed.fsdp import fully_shard

    # The root's parameters are needed again right after forward (by backward): keep them.
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)


def reshard_all(model: nn.Module) -> None:
    """Free every gathered parameter. A forward without backward (evaluation) leaves the root's
    parameters gathered (it does not reshard after forward); saves and memory want shards."""
    for module in model.modules():
        if is_fsdp_module(module):
            cast("FSDPModule", module).reshard()


def full_norm(norm: torch.Tensor) -> torch.Tensor:
    """The global gradient norm as a plain tensor (sharded gradients give a partial DTensor)."""
    return norm.full_tensor() if is_dtensor(norm) else norm
