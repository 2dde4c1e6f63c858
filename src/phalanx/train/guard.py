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
    """Per-step bookkeeping of non-finite values, kept on the device."""

    def __init__(self, policy: str, device: torch.device, *, rank: int, world_size: int) -> None:
        if policy not in ("skip", "stop", "count"):
            raise UsageError(f"nan_policy={policy!r} is not one of: skip, stop, count")
        self.policy, self.rank, self.world_size = policy, rank, world_size
        self.events = torch.zeros((), dtype=torch.int64, device=device)
        self.first_step = torch.full((), -1, dtype=torch.int64, device=device)
        self.loss_bad_ever = torch.zeros((), dtype=torch.int64, device=device)
        self._loss_bad = torch.zeros((), dtype=torch.bool, device=device)

    def observe_loss(self, loss: torch.Tensor) -> None:
        """Remember a non-finite micro-batch loss on this rank (device op, no sync)."""
        self._loss_bad |= ~torch.isfinite(loss.detach())

    def agree(self, grad_norm: torch.Tensor, step: int, *, include_grads: bool) -> torch.Tensor:
        """The step's global verdict: a 0-dim bool tensor, True when any rank saw non-finite."""
        self.loss_bad_ever |= self._loss_bad.to(torch.int64)
        bad = self._loss_bad.clone()
        if include_grads:
            bad |= ~torch.isfinite(grad_norm)
        if dist.is_initialized() and self.world_size > 1:
            flag = bad.to(torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            bad = flag.bool()
        self.events += bad.to(torch.int64)
        self.first_step = torch.where(
            bad & (self.first_step < 0), torch.full_like(self.first_step, step), self.first_step
        )
        self._loss_bad.zero_()
        return bad

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
