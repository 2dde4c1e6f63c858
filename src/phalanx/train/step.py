"""One optimizer step: micro-batches with accumulation, clipping, the NaN guard, the update.

Reads top to bottom like a hand-written loop; the Trainer calls it, a user loop may too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from phalanx.dist.sharded_types import is_fsdp_module
from phalanx.errors import UsageError
from phalanx.train.grad_norm import GradNorm, clip_grads_, full_norm
from phalanx.train.guard import NanGuard, masked_step
from phalanx.train.metrics import Metrics
from phalanx.train.phases import PhaseClock
from phalanx.train.precision import Precision
from phalanx.train.strategy import ddp_module, unwrap

StepOutput = torch.Tensor | Mapping[str, torch.Tensor]
StepFn = Callable[[nn.Module, Any], StepOutput]


def split_output(out: object) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(loss, extra metrics) from a step function's result, or a one-line error."""
    if isinstance(out, torch.Tensor):
        loss, extra = out, {}
    elif isinstance(out, Mapping) and isinstance(out.get("loss"), torch.Tensor):
        loss, extra = out["loss"], {k: v for k, v in out.items() if k != "loss"}
    else:
        raise UsageError(
            f"train_step must return the loss tensor or a dict with a 'loss' tensor; got "
            f"{type(out).__name__}"
        )
    if loss.numel() != 1:
        raise UsageError(f"train_step's loss must be a scalar; got shape {tuple(loss.shape)}")
    return loss, extra


def batch_size_of(batch: object) -> int:
    """Samples in a batch: the leading dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, Mapping):
        return batch_size_of(next(iter(batch.values()))) if batch else 0
    if isinstance(batch, Sequence) and batch:
        return batch_size_of(batch[0])
    return 1


def to_device(batch: Any, device: torch.device) -> Any:
    """Tensors anywhere in nested tuples/lists/dicts moved to `device` (asynchronously)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


@dataclass
class StepParts:
    """What an optimizer step needs; built once by the Trainer."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    train_step: StepFn
    precision: Precision
    guard: NanGuard
    metrics: Metrics
    clip_grad_norm: float
    scheduler: LRScheduler | None = None
    fsdp_reduce_every_micro_batch: bool = False
    copy_outputs: bool = False
    """The model replays CUDA graphs (train.compile_mode): the next replay overwrites its
    outputs, so the metrics keep copies of the loss and extra values instead of references."""
    ranks_per_batch: int = 1
    """Ranks that train on the same batch (a data rank's tensor-parallel peers): the samples
    metric, summed over ranks, counts each batch once."""
    batch_context: Callable[[Any], contextlib.AbstractContextManager[None]] | None = None
    """The context a micro-batch's forward and backward run in: context parallelism's split
    of the batch and ring attention (phalanx.train.context_parallel); None: none."""
    grad_norm: GradNorm = field(default_factory=GradNorm)
    """The gradients' norm each step, replayed from a CUDA graph where it can be (grad_norm.py)."""
    clock: PhaseClock | None = None
    """Told when forward, backward and the optimizer begin (phalanx.train.phases); None: no one."""


@contextlib.contextmanager
def sync_debug(enabled: bool, device: torch.device) -> Iterator[None]:
    """train.sync_debug: inside, a hidden .item() or blocking copy is an error (CUDA only)."""
    if not (enabled and device.type == "cuda"):
        yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(0)


def _grads(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]


def optimizer_step(parts: StepParts, micro_batches: Iterable[Any], *, step: int) -> None:
    """Forward/backward every micro-batch, then one (guarded, clipped) optimizer update.

    Gradients are reduced on the last micro-batch only (DDP no_sync before it; FSDP
    set_requires_gradient_sync(False), unless parts.fsdp_reduce_every_micro_batch); each
    micro-loss is divided by their number, so k micro-batches equal one k-times-larger batch.
    """
    batches = list(micro_batches)
    carry = _gradients_carry_the_verdict(parts)
    for i, batch in enumerate(batches):
        split = parts.batch_context(batch) if parts.batch_context else contextlib.nullcontext()
        with _maybe_no_sync(parts, index=i, count=len(batches)), split:
            _phase(parts, "forward")
            with parts.precision.autocast():
                loss, extra = split_output(parts.train_step(parts.model, batch))
            to_backward = parts.guard.observe_loss(loss, carry=carry)
            # x / 1 == x bitwise: one launch fewer per step without accumulation.
            n = len(batches)
            _phase(parts, "backward")
            parts.precision.backward(to_backward / n if n > 1 else to_backward)
        # Kept by reference, no launch until a logging point; a copy when graphs would overwrite.
        kept = {"loss": loss, **extra}
        for name, value in kept.items():
            parts.metrics.add(name, value.detach().clone() if parts.copy_outputs else value)
        share = float(batch_size_of(batch)) / parts.ranks_per_batch
        parts.metrics.add("samples", share, reduce="sum")
    _phase(parts, "optimizer")
    _update(parts, step, carried=carry)


def _phase(parts: StepParts, name: str) -> None:
    if parts.clock is not None:
        parts.clock.switch(name)


def _gradients_carry_the_verdict(parts: StepParts) -> bool:
    """Whether a non-finite loss can reach every rank through the gradients (NanGuard): they
    are reduced across ranks (DDP or FSDP), no loss scaler decides about overflows, and a bad
    step's update is masked (under nan_policy=count it is applied: NaN gradients would ruin
    the weights that a loss-only inf leaves intact)."""
    guard = parts.guard
    if guard.world_size < 2 or parts.precision.scaler is not None or not guard.masks_update:
        return False
    return ddp_module(parts.model) is not None or is_fsdp_module(unwrap(parts.model))


def _maybe_no_sync(
    parts: StepParts, *, index: int, count: int
) -> contextlib.AbstractContextManager[Any]:
    """No gradient reduction in this micro-batch's backward unless it is the step's last.

    FSDP without it reduce-scatters every unit's gradients after every micro-batch; with it,
    each rank keeps the unsharded gradients (in the reduce dtype, fp32 under bf16) of the whole
    model until the last one: DDP's gradient memory, traded for k - 1 fewer reduce-scatters."""
    last = index == count - 1
    ddp = ddp_module(parts.model)
    if ddp is not None:
        return contextlib.nullcontext() if last else ddp.no_sync()
    root = unwrap(parts.model)
    if count > 1 and is_fsdp_module(root) and not parts.fsdp_reduce_every_micro_batch:
        root.set_requires_gradient_sync(last)  # type: ignore[operator]
    return contextlib.nullcontext()


def _update(parts: StepParts, step: int, *, carried: bool = False) -> None:
    opt = parts.optimizer
    parts.precision.unscale_(opt)
    grads = _grads(opt)
    clip = parts.clip_grad_norm
    params = [p for g in opt.param_groups for p in g["params"]] if clip > 0 else []
    norm, clipped = torch.zeros(()), True
    if grads:
        norm, clipped = parts.grad_norm(grads, clip_params=params, max_norm=clip)
        norm = full_norm(norm)
    if clip > 0 and not clipped:
        clip_grads_(params, clip, norm)
    # Under fp16 an overflow is the scaler's business (reported as scaler_skips), not a NaN event.
    fp16 = parts.precision.scaler is not None
    bad = parts.guard.agree(
        norm, step, include_grads=not fp16, carried=carried and bool(grads),
        decides=parts.guard.masks_update and not fp16,
    )  # fmt: skip
    if fp16:
        parts.precision.step(opt)
    elif parts.guard.masks_update:
        masked_step(opt, bad)
    else:
        opt.step()
    if parts.scheduler is not None:
        parts.scheduler.step()
    opt.zero_grad(set_to_none=True)
    parts.metrics.add("grad_norm", norm)
