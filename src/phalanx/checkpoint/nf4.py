"""NF4 tensors (torchao's 4-bit NormalFloat, train.quantize_base=nf4) given their values: the
whole tensor is quantized, then cut into the rows a rank holds, so that every shard shares the
tensor's one scale mean (FSDP2's all-gather of NF4 shards keeps one rank's mean for all)."""

from __future__ import annotations

import sys
from typing import Any

import torch

BLOCK = 64
"""Values per NF4 scale."""
SCALER_BLOCK = 256
"""Scales per double-quantization block: a shard holds whole blocks of BLOCK × SCALER_BLOCK."""


def is_nf4(tensor: torch.Tensor) -> bool:
    """Whether `tensor` (or a DTensor's local part) is a torchao NF4Tensor."""
    if "torchao" not in sys.modules:  # no NF4 tensor without torchao imported
        return False
    from torchao.quantization import NF4Tensor  # type: ignore[import-untyped]

    return isinstance(getattr(tensor, "_local_tensor", tensor), NF4Tensor)


def fill_nf4(target: Any, whole: torch.Tensor, *, first_row: int) -> None:
    """Quantize `whole` (the tensor's full values) on `target`'s device and copy the rows this
    rank holds, from `first_row`, into `target` (an NF4 parameter, or a DTensor of NF4 shards)."""
    from torchao.quantization import to_nf4

    # The DTensor's own local tensor: `to_local()` returns a new NF4 object over the same parts.
    local = getattr(target, "_local_tensor", target)
    quantized = to_nf4(whole.to(local.device, local.dtype), BLOCK, SCALER_BLOCK)
    rows = local.shape[0]
    part = quantized if rows == whole.shape[0] else torch.split(quantized, rows)[first_row // rows]
    # torchao's empty_like (storage for a meta NF4 tensor) gives its three sharded parts
    # storage but leaves the scale mean and the code book on meta, where copy_ cannot write.
    local.scaler_mean, local.nf4 = part.scaler_mean.clone(), part.nf4.clone()
    local.copy_(part)
