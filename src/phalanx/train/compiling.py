"""`train.compile=true` under FSDP: each unit's forward is compiled, not the root.

Why per unit: FSDP2's hooks (all-gather before a unit's forward, reshard after, reduce-scatter
in the backward) stay outside the compiled graphs, in eager code, where they overlap with compute
as without compile; a compile of the root would trace through them. Why the `forward` and not
`module.compile()`: the latter compiles `Module.__call__`, hooks included; replacing `forward`
on the instance keeps module types, parameter names and state-dict keys those of the plain model
(no `_orig_mod.`). Identical blocks share one compiled graph: Dynamo guards on the code and the
tensors' properties, not on which block instance runs it, so 32 blocks compile once (tested).

Order, as torch recommends for FSDP2 (and torchtitan applies it): activation checkpointing
first (the compiled function then contains the checkpoint as one higher-order op, and the
recompute is compiled too), then compile, then `fully_shard`. DDP keeps one compile of the
DDP-wrapped module (its DDPOptimizer splits the graph at bucket boundaries).
"""

from __future__ import annotations

import torch
from torch import nn

from phalanx.train.fsdp import shard_units


def compile_units(
    model: nn.Module, unit_names: tuple[str, ...], mode: str = "default"
) -> list[nn.Module]:
    """Compile the forward of every FSDP unit (as `unit_names` picks them) in place, with
    torch.compile's `mode`; a model without units has only the root's forward compiled.
    Returns the compiled modules."""
    units = shard_units(model, unit_names) or [model]
    for unit in units:
        unit.forward = torch.compile(unit.forward, mode=mode)
    return units


def is_compiled(module: nn.Module) -> bool:
    """Whether `module.forward` was replaced by a torch.compile'd function."""
    return hasattr(module.forward, "_torchdynamo_orig_callable")
