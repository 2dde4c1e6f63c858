"""Activation checkpointing (`train.activation_checkpointing`): a checkpointed unit keeps only its
inputs from the forward and runs its forward again in the backward, trading compute for memory.

The units are the FSDP units (`train.fsdp_units`, default the children of every nn.ModuleList),
under DDP and single-device runs too. Each chosen unit's `forward` is replaced, on that instance,
by one that runs under torch's non-reentrant `torch.utils.checkpoint.checkpoint`:
- no wrapper module, so parameter names and checkpoints stay those of the plain model (torch's
  `checkpoint_wrapper` adds `_checkpoint_wrapped_module.` to every key);
- non-reentrant: works with DDP without `static_graph`, with inputs that need no gradient, and
  under torch.compile (traced as one higher-order op); RNG state is saved, so dropout recomputes
  the same mask;
- under FSDP the unit's gather hooks stay outside the checkpointed function: the recompute in
  the backward runs after FSDP's pre-backward gather, on full parameters.
"""

from __future__ import annotations

import functools
from typing import Any

import torch.utils.checkpoint
from torch import nn

from phalanx.config.training import checkpoint_every
from phalanx.errors import UsageError


def checkpoint_units(units: list[nn.Module], setting: str) -> int:
    """Checkpoint the `units` (phalanx.train.units) per `setting` (none, full, every:N: units
    N, 2N, ... counting from 1); returns how many were checkpointed."""
    every = checkpoint_every(setting)
    if every == 0:
        return 0
    if not units:
        raise UsageError(
            f"train.activation_checkpointing={setting} found no units: the model has no "
            "nn.ModuleList; name the block classes with train.fsdp_units=[Block]"
        )
    chosen = [unit for index, unit in enumerate(units, start=1) if index % every == 0]
    for unit in chosen:
        _checkpoint_forward(unit)
    return len(chosen)


def _checkpoint_forward(module: nn.Module) -> None:
    inner = module.forward

    @functools.wraps(inner)
    def forward(*args: Any, **kwargs: Any) -> Any:
        return torch.utils.checkpoint.checkpoint(inner, *args, use_reentrant=False, **kwargs)

    module.forward = forward
