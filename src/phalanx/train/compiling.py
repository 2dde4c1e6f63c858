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

Under tensor parallelism a unit may receive the output of a split layer left eager (a Hugging
Face model's vocabulary-split embedding): a tensor whose all-reduce is still in flight
(torch's AsyncCollectiveTensor). Entering a compiled graph as it is, it loses its gradient on
torch 2.13 (the embedding's weight got a zero gradient, silently); a copy taken before the
graph (`settle_inputs`) keeps it. One copy of one activation per step: only the first unit's
input is such a tensor.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def compile_units(
    model: nn.Module, units: list[nn.Module], mode: str = "default", *, settle_inputs: bool = False
) -> list[nn.Module]:
    """Compile the forward of every unit (phalanx.train.units) in place, with torch.compile's
    `mode`; a model without units has only the root's forward compiled. Returns the compiled
    modules. `settle_inputs`: copy in-flight collective results before they enter (tensor
    parallelism, see the module docstring)."""
    units = units or [model]
    for unit in units:
        compiled = torch.compile(unit.forward, mode=mode)
        unit.forward = _settling(compiled) if settle_inputs else compiled
    return units


def _settling(forward: Callable[..., Any]) -> Callable[..., Any]:
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    def settle(value: Any) -> Any:
        return value.clone() if isinstance(value, AsyncCollectiveTensor) else value

    @functools.wraps(forward)  # keeps _torchdynamo_orig_callable: is_compiled still holds
    def call(*args: Any, **kwargs: Any) -> Any:
        return forward(*map(settle, args), **{k: settle(v) for k, v in kwargs.items()})

    return call


def is_compiled(module: nn.Module) -> bool:
    """Whether `module.forward` was replaced by a torch.compile'd function."""
    return hasattr(module.forward, "_torchdynamo_orig_callable")
