"""Output head + cross-entropy without the full logits: `linear_cross_entropy(hidden, weight,
labels)` equals `F.cross_entropy(hidden @ weight.T, labels)` (mean over the labelled tokens)
without ever holding the whole (tokens × vocabulary) logits. At a 128k vocabulary the full fp32
logits (and their gradient) are 4 × 128k bytes per token — often the largest tensors of a step.
One chunked computation in plain torch: the logits a chunk of tokens at a time, in fp32, each
chunk turned into its share of the gradients at once; torch.compile'd on CUDA (the default
there: at 8192 tokens × 4096 × 128k on an H100, faster than the plain loss with a third of its
memory — benchmarks/fused_loss.py), eager elsewhere. Liger's fused kernel (Triton) is an option
for the least memory (a tenth of the plain loss's, at some speed at large vocabularies).
Every kernel computes the gradients in the forward (the backward only scales them), so no
logits are recomputed; the loss must be used once, as a scalar.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any, Literal

import torch
import torch.nn.functional as F

from phalanx.errors import UsageError

IGNORE_INDEX = -100
Kernel = Literal["auto", "compiled", "chunked", "liger"]
KERNELS = ("auto", "compiled", "chunked", "liger")


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    chunk_tokens: int = 2048,
    ignore_index: int = IGNORE_INDEX,
    kernel: Kernel = "auto",
) -> torch.Tensor:
    """Mean cross-entropy of `hidden @ weight.T (+ bias)` against `labels` over the tokens whose
    label is not `ignore_index`. hidden: (..., dim); weight: (vocab, dim); labels: hidden's
    leading shape. Gradients flow to hidden, weight and bias. kernel: auto (compiled on CUDA,
    else chunked), compiled (chunked under torch.compile), chunked (eager; `chunk_tokens` a
    chunk; the default 2048 is what benchmarks/fused_loss.py measured) or liger (Liger's fused
    kernel: CUDA, liger-kernel installed)."""
    if labels.shape != hidden.shape[:-1]:
        raise UsageError(
            f"linear_cross_entropy: labels {tuple(labels.shape)} must match hidden's leading "
            f"dimensions {tuple(hidden.shape[:-1])}"
        )
    if chunk_tokens < 1:
        raise UsageError(f"linear_cross_entropy: chunk_tokens={chunk_tokens} must be >= 1")
    flat = hidden.reshape(-1, hidden.shape[-1])
    chosen = _kernel(kernel, hidden)
    if chosen == "liger":
        from liger_kernel.transformers.fused_linear_cross_entropy import (  # type: ignore[import-not-found]
            LigerFusedLinearCrossEntropyLoss,
        )

        liger = LigerFusedLinearCrossEntropyLoss(ignore_index=ignore_index)
        return liger(weight, flat, labels.reshape(-1), bias)  # type: ignore[no-any-return]
    run = _compiled_chunked() if chosen == "compiled" else _chunked
    return run(flat, weight, bias, labels.reshape(-1), chunk_tokens, ignore_index)


def _kernel(kernel: str, hidden: torch.Tensor) -> str:
    """The kernel that runs: auto resolved, liger checked."""
    if kernel not in KERNELS:
        raise UsageError(f"linear_cross_entropy: kernel={kernel!r} is not one of {KERNELS}")
    if kernel == "auto":
        return "compiled" if hidden.is_cuda else "chunked"
    if kernel == "liger" and not (hidden.is_cuda and _liger_installed()):
        raise UsageError(
            "linear_cross_entropy: kernel='liger' needs a CUDA tensor and liger-kernel "
            "(pip install liger-kernel); kernel='chunked' runs anywhere"
        )
    return kernel


def _chunked(
    flat: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
    chunk_tokens: int, ignore_index: int,
) -> torch.Tensor:  # fmt: skip
    loss: torch.Tensor = _LinearCrossEntropy.apply(  # type: ignore[no-untyped-call]
        flat, weight, bias, labels, chunk_tokens, ignore_index
    )
    return loss


@functools.cache
def _compiled_chunked() -> Any:
    """One compiled wrapper per process (its graphs are cached by torch per input shape)."""
    return torch.compile(_chunked)


@functools.cache
def _liger_installed() -> bool:
    """Looked up once per process, not at every step's loss."""
    return importlib.util.find_spec("liger_kernel") is not None


def _chunk_grads(
    rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
    ignore_index: int, scale: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """One chunk: its summed loss and d(loss·scale)/d(logits), in fp32."""
    logits = (rows @ weight.t()).float()
    if bias is not None:
        logits = logits + bias.float()
    valid = labels != ignore_index
    target = torch.where(valid, labels, 0)
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(1, target.unsqueeze(1)).squeeze(1)
    loss = ((lse - picked) * valid).sum()
    grad = torch.softmax(logits, dim=-1)
    grad.scatter_add_(1, target.unsqueeze(1), -torch.ones_like(picked).unsqueeze(1))
    grad.mul_((valid.float() * scale).unsqueeze(1))
    return loss, grad


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
        labels: torch.Tensor, chunk_tokens: int, ignore_index: int,
    ) -> torch.Tensor:  # fmt: skip
        count = (labels != ignore_index).sum().clamp(min=1)
        scale = 1.0 / count.float()
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32)
        grad_bias = None if bias is None else torch.zeros_like(bias, dtype=torch.float32)
        for start in range(0, hidden.shape[0], chunk_tokens):
            rows = hidden[start : start + chunk_tokens]
            loss, grad = _chunk_grads(
                rows, weight, bias, labels[start : start + chunk_tokens], ignore_index, scale
            )
            total += loss
            grad = grad.to(weight.dtype)  # the two gradient matmuls at the inputs' precision
            grad_hidden[start : start + chunk_tokens] = (grad @ weight).to(hidden.dtype)
            grad_weight += grad.t() @ rows.to(weight.dtype)
            if grad_bias is not None:
                grad_bias += grad.float().sum(0)
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
        ctx.grad_bias = None if bias is None or grad_bias is None else grad_bias.to(bias.dtype)
        return total * scale

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        grad_hidden, grad_weight = ctx.saved_tensors
        grad_bias = None if ctx.grad_bias is None else ctx.grad_bias * grad_out
        return grad_hidden * grad_out, grad_weight * grad_out, grad_bias, None, None, None


def reference_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
    bias: torch.Tensor | None = None, ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:  # fmt: skip
    """The plain computation linear_cross_entropy replaces (full fp32 logits), for comparison."""
    logits = F.linear(hidden, weight, bias).float()
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=ignore_index
    )
