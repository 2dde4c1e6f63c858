"""NaN/inf guard: a non-finite loss or gradient on ANY rank is seen by all ranks, on the device.

Agreement: with DDP the gradients are already averaged, so a NaN gradient on one rank is a NaN
global norm on every rank; a non-finite LOSS on one rank is added by one tiny device all-reduce
(MAX of a 0/1 flag). No value reaches the host except at logging points.

Policies:
- skip: the optimizer update is masked. Fused optimizers (Adam/AdamW/SGD with fused=True) take
  the flag as `found_inf` and skip on the device, state and step count included, as GradScaler
  does; other optimizers need one host read of the flag per step.
- stop: the update is masked the same way; at the next logging point every rank stops together
  with a message naming the first bad step and the ranks whose loss was non-finite.
- count: the update is applied anyway; the count is reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from phalanx.errors import UsageError


class NonFiniteError(RuntimeError):
    """Raised on every rank at once when nan_policy='stop' saw a non-finite value."""


@dataclass
class GuardReport:
    events: int
    first_step: int
    loss_ranks: list[int]


class NanGuard:
    """Per-step bookkeeping of non-finite values, kept on the device.

    A step costs about ten tiny kernels and, with several ranks, one 1-byte all-reduce:
    `observe_loss` only keeps a reference; `agree` checks the step's losses and gradient norm
    and updates the counters in place (issue #17 counted ~20 launches before)."""

    _NEVER = torch.iinfo(torch.int64).max  # first_step until a bad step is seen

    def __init__(self, policy: str, device: torch.device, *, rank: int, world_size: int) -> None:
        if policy not in ("skip", "stop", "count"):
            raise UsageError(f"nan_policy={policy!r} is not one of: skip, stop, count")
        self.policy, self.rank, self.world_size = policy, rank, world_size
        self.events = torch.zeros((), dtype=torch.int64, device=device)
        self._first = torch.full((), self._NEVER, dtype=torch.int64, device=device)
        self.loss_bad_ever = torch.zeros((), dtype=torch.int64, device=device)
        self._losses: list[torch.Tensor] = []

    def observe_loss(self, loss: torch.Tensor) -> None:
        """Remember a micro-batch loss of this rank for the step's check (no kernel, no sync)."""
        self._losses.append(loss.detach())

    def agree(self, grad_norm: torch.Tensor, step: int, *, include_grads: bool) -> torch.Tensor:
        """The step's global verdict: a 0-dim bool tensor, True when any rank saw non-finite."""
        losses, self._losses = self._losses, []
        if len(losses) == 1:
            finite = torch.isfinite(losses[0]).reshape(())
        elif losses:
            finite = torch.isfinite(torch.stack([t.reshape(()) for t in losses])).all()
        else:  # no loss observed (a hand loop calling agree() alone)
            finite = torch.ones((), dtype=torch.bool, device=self.events.device)
        loss_bad = finite.logical_not_()
        self.loss_bad_ever.logical_or_(loss_bad)
        bad = loss_bad
        if include_grads:
            bad = torch.isfinite(grad_norm).logical_not_().logical_or_(loss_bad)
        if dist.is_initialized() and self.world_size > 1:
            flag = bad.to(torch.uint8)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            bad = flag.bool()
        self.events.add_(bad)
        torch.minimum(self._first, torch.where(bad, step, self._NEVER), out=self._first)
        return bad

    @property
    def first_step(self) -> torch.Tensor:
        """The first step with a non-finite value; -1 when there was none."""
        return torch.where(self._first == self._NEVER, -1, self._first)

    @property
    def masks_update(self) -> bool:
        return self.policy in ("skip", "stop")

    def report(self) -> GuardReport:
        """Host read, at logging points: counts, first bad step and which ranks' loss was bad."""
        flags = [int(self.loss_bad_ever.item())]
        if dist.is_initialized() and self.world_size > 1:
            gathered = [torch.zeros_like(self.loss_bad_ever) for _ in range(self.world_size)]
            dist.all_gather(gathered, self.loss_bad_ever)
            flags = [int(t.item()) for t in gathered]
        ranks = [r for r, f in enumerate(flags) if f]
        return GuardReport(
            events=int(self.events.item()), first_step=int(self.first_step.item()), loss_ranks=ranks
        )

    def maybe_stop(self) -> GuardReport:
        """At a logging point: under policy stop, raise NonFiniteError on every rank if needed."""
        report = self.report()
        if self.policy == "stop" and report.events:
            where = (
                f"loss on rank(s) {report.loss_ranks}"
                if report.loss_ranks
                else ("gradients (after all-reduce)")
            )
            raise NonFiniteError(
                f"non-finite {where} at step {report.first_step}; stopping all ranks "
                "(train.nan_policy=stop; use skip to drop such steps, count to only count them)"
            )
        return report


def masked_step(optimizer: torch.optim.Optimizer, bad: torch.Tensor) -> bool:
    """Run optimizer.step() unless `bad`; True when the mask was applied on the device."""
    if getattr(optimizer, "_step_supports_amp_scaling", False):
        # Fused optimizers read these attributes (GradScaler's protocol) and skip on device.
        optimizer.grad_scale = None  # type: ignore[attr-defined]
        optimizer.found_inf = bad.to(torch.float32)  # type: ignore[attr-defined]
        try:
            optimizer.step()
        finally:
            del optimizer.grad_scale  # type: ignore[attr-defined]
            del optimizer.found_inf  # type: ignore[attr-defined]
        return True
    if not bool(bad.item()):  # host read: the optimizer cannot skip on its own
        optimizer.step()
    return False


def host_read_warning(optimizer: torch.optim.Optimizer, policy: str, device: torch.device) -> str:
    """The one-line warning for a setup whose guard reads the device every step ('' if none):
    skip/stop on CUDA with an optimizer that cannot skip an update on the device by itself."""
    if policy == "count" or device.type != "cuda":
        return ""
    if getattr(optimizer, "_step_supports_amp_scaling", False):
        return ""
    return (
        f"train.nan_policy={policy} with {type(optimizer).__name__} (not fused) reads the "
        "device once per step to skip non-finite updates, which stalls the GPU queue; pass "
        "fused=True (Adam, AdamW, SGD) or use train.nan_policy=count"
    )
