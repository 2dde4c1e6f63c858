"""SyncBatchNorm: batch statistics over the whole global batch, on CPU (gloo) and GPU.

torch.nn.SyncBatchNorm refuses CPU tensors; this one sums per-channel count, sum and sum of
squares with one autograd-aware allreduce, so the backward pass is synchronised as well.
"""

from __future__ import annotations

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from phalanx.horovod import ops
from phalanx.horovod.reduce import allreduce
from phalanx.horovod.runtime import RUNTIME


class SyncBatchNorm(_BatchNorm):
    """Drop-in for torch.nn.BatchNorm1d/2d/3d whose training statistics span all ranks."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        single = RUNTIME.handle is None or RUNTIME.handle.env.world_size == 1
        if not self.training or single:
            return super().forward(input)
        dims = [d for d in range(input.dim()) if d != 1]
        count = torch.full((1,), input.numel() / input.shape[1], dtype=input.dtype,
                           device=input.device)  # fmt: skip
        stats = torch.cat([input.sum(dims), (input * input).sum(dims), count])
        total = allreduce(stats, op=ops.Sum)
        channels = input.shape[1]
        n = total[-1]
        mean = total[:channels] / n
        var = total[channels : 2 * channels] / n - mean * mean
        self._update_running(mean.detach(), var.detach(), n.detach())
        shape = [1, channels] + [1] * (input.dim() - 2)
        out = (input - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out

    def _update_running(self, mean: torch.Tensor, var: torch.Tensor, n: torch.Tensor) -> None:
        if not self.track_running_stats or self.running_mean is None:
            return
        assert self.running_var is not None and self.num_batches_tracked is not None
        self.num_batches_tracked.add_(1)
        momentum = self.momentum
        if momentum is None:  # cumulative moving average, as torch's BatchNorm
            momentum = 1.0 / float(self.num_batches_tracked)
        unbiased = var * n / (n - 1).clamp(min=1)
        with torch.no_grad():
            self.running_mean.mul_(1 - momentum).add_(mean, alpha=momentum)
            self.running_var.mul_(1 - momentum).add_(unbiased, alpha=momentum)
