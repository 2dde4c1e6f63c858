"""A frozen base model in 4-bit NormalFloat (train.quantize_base=nf4): QLoRA's storage for the
base of an adapter run, through torchao's NF4Tensor, which FSDP2 shards and all-gathers in its
4-bit form (torchao implements the split and FSDP2's all-gather hooks for it).

Which weights: those of nn.Linear layers that do not train (requires_grad=False), except the
vocabulary projection (its logits feed the loss directly: float8.head_names) and peft's adapters
(frozen too in a model loaded for inference), and only where the tensor splits into whole
scale blocks on every shard (64 × 256 values each: NF4's double-quantized scales). Embeddings,
norms and the adapters keep their dtype.

Order: the swap happens on the meta device, before sharding, so that FSDP2 splits NF4 tensors
itself and knows them as such; the values come in when the pretrained weights are read
(checkpoint.pretrained): each tensor is quantized whole on the rank's device and then cut, so
every shard shares the tensor's one scaler mean (each shard quantized alone would have its own,
which the all-gather cannot carry). So a quantized base needs its values from `train.init_from`
and a model from a factory.
"""

from __future__ import annotations

import importlib.util
from typing import cast

import torch
from torch import nn

from phalanx.checkpoint.nf4 import BLOCK, SCALER_BLOCK
from phalanx.errors import UsageError
from phalanx.train.adapter_init import adapter_names
from phalanx.train.float8 import head_names


def check_quantize_base(
    mode: str, *, factory: bool, pretrained: bool, kind: str, precision: str, tp: int
) -> None:
    """One line where train.quantize_base cannot run as configured; before any work."""
    if mode == "none":
        return
    if mode != "nf4":
        raise UsageError(f"train.quantize_base={mode!r} is not one of: none, nf4")
    if importlib.util.find_spec("torchao") is None:
        raise UsageError(
            "train.quantize_base=nf4 needs torchao: pip install 'phalanx[fp8]' (or torchao), "
            "or use train.quantize_base=none"
        )
    if not (factory and pretrained):
        raise UsageError(
            "train.quantize_base=nf4 quantizes the base as its weights are read: pass "
            "model=lambda: ... (a factory) and train.init_from=PATH"
        )
    if kind == "ddp" or precision == "fp8" or tp > 1:
        what = "DDP" if kind == "ddp" else "train.precision=fp8" if tp == 1 else f"tp={tp}"
        raise UsageError(
            f"train.quantize_base=nf4 does not compose with {what}; use train.strategy=fsdp "
            "(or one process) with bf16 or fp32"
        )


def quantizable(model: nn.Module, shards: int) -> list[str]:
    """Qualified names of the Linear layers whose weights go to NF4 (module docstring); works on
    the meta device."""
    skip = head_names(model) | {name.rpartition(".")[0] for name in adapter_names(model)}
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
        and name not in skip
        and not module.weight.requires_grad
        and _splits(module.weight.shape, shards)
    ]


def _splits(shape: torch.Size, shards: int) -> bool:
    rows, cols = shape
    return rows % shards == 0 and (rows // shards) * cols % (BLOCK * SCALER_BLOCK) == 0


def quantize_frozen(model: nn.Module, shards: int = 1) -> list[str]:
    """Swap the chosen layers' weights (`quantizable`) for NF4 ones; returns their names. On the
    meta device (the Trainer's use) only the structure: the values come as the pretrained
    weights are read. On real weights, their values quantized: a run's model rebuilt outside
    phalanx (pass the run's shard count: it decides which layers were quantized)."""
    from torchao.quantization import to_nf4  # type: ignore[import-untyped]

    names = quantizable(model, shards)
    if not names:
        raise UsageError(
            "train.quantize_base=nf4 found no frozen nn.Linear layer to quantize (each needs "
            f"rows × columns per shard divisible by {BLOCK * SCALER_BLOCK}); freeze the base "
            "(an adapter model) or use train.quantize_base=none"
        )
    for name in names:
        linear = cast(nn.Linear, model.get_submodule(name))
        weight = to_nf4(linear.weight.detach(), BLOCK, SCALER_BLOCK)
        linear.weight = nn.Parameter(weight, requires_grad=False)
    return names
