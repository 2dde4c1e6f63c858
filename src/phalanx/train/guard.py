"""NaN/inf guard: a non-finite loss or gradient on ANY rank is seen by all ranks, on the device.

Agreement: with DDP the gradients are already averaged, so a NaN gradient on one rank is a NaN
global norm on every rank; a non-finite LOSS on one rank is added by one tiny device all-reduce
(MAX of a 0.0/1.0 flag) where the flag decides the update, or carried by the gradients (see
NanGuard); where it does not (count), the flags meet at logging points. No value reaches the
host except at logging points.

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
from phalanx.train.metrics import host_to_device


class NonFiniteError(RuntimeError):
    """Raised on every rank at once when nan_policy='stop' saw a non-finite value."""


@dataclass
class GuardReport:
    events: int
    first_step: int
    loss_ranks: list[int]


class NanGuard:
    """Per-step bookkeeping of non-finite values, kept on the device.

    A step costs a few tiny kernels (issue #17 counted ~20 launches at first): `observe_loss`
    checks the loss (one kernel, no sync); `agree` computes the step's verdict; the counters
    (events, first bad step, bad loss seen) are folded from the kept verdicts at logging
    points, or every FOLD_EVERY steps in a loop that never reports, so nothing grows without
    bound.

    Several ranks must reach the same verdict. Where the gradients are reduced across ranks
    (DDP, FSDP), no loss scaler runs and a bad step's update is masked (skip, stop), the
    gradients carry it: `observe_loss(carry=True)`
    returns the loss to backward as `loss * 1` (bitwise the loss) when finite and `loss * nan`
    when not, so a rank's non-finite loss makes its gradients NaN, the reduction spreads them
    to every rank, and each rank's verdict on the reduced gradients is the same without a
    collective of its own. A non-finite loss whose backward keeps the gradients finite
    (cross-entropy whose targets are all ignored is 0/0 = NaN, its gradient 0) cannot ride
    them: that step's update, finite, is applied on every rank, and the rank's own check is
    counted at the next fold (events, first step, and a stop under nan_policy=stop).
    Otherwise `agree` all-reduces the verdict (4 bytes) where it decides
    the update (skip, stop); where it does not (count, or fp16, whose scaler decides), the
    ranks' verdicts are kept as they are and agreed in one all-reduce when they are folded."""

    _NEVER = torch.iinfo(torch.int64).max  # first_step until a bad step is seen
    FOLD_EVERY = 256

    def __init__(self, policy: str, device: torch.device, *, rank: int, world_size: int) -> None:
        if policy not in ("skip", "stop", "count"):
            raise UsageError(f"nan_policy={policy!r} is not one of: skip, stop, count")
        self.policy, self.rank, self.world_size = policy, rank, world_size
        self.events = torch.zeros((), dtype=torch.int64, device=device)
        self._first = torch.full((), self._NEVER, dtype=torch.int64, device=device)
        self.loss_bad_ever = torch.zeros((), dtype=torch.int64, device=device)
        # found_inf values as fused optimizers take them: float32 whatever the default dtype.
        self._zero = torch.zeros((), dtype=torch.float32, device=device)
        self._losses: list[torch.Tensor] = []  # the step's micro-batch losses times 0 (or NaN)
        self._verdicts: list[tuple[int, torch.Tensor, torch.Tensor | None]] = []
        self._unagreed = False  # some kept verdict is still this rank's own

    def observe_loss(self, loss: torch.Tensor, *, carry: bool = False) -> torch.Tensor:
        """Check a micro-batch loss of this rank for the step's verdict (no sync); returns the
        loss to backward, which with `carry` makes the gradients NaN when the loss is not
        finite (see the class docstring)."""
        # x * 0 is 0 for every finite x and NaN for inf and NaN: one kernel where isfinite
        # launches four on CUDA, and it adds up with the other checks (see agree()).
        zeroed = loss.detach().reshape(()) * 0
        self._losses.append(zeroed)
        if not carry:
            return loss
        return loss * (zeroed + 1)  # x * 1 == x bitwise; x * NaN poisons the gradients

    def agree(
        self, grad_norm: torch.Tensor, step: int, *, include_grads: bool, carried: bool = False,
        decides: bool = True,
    ) -> torch.Tensor:  # fmt: skip
        """The step's global verdict: a 0-dim float32 tensor, 1.0 when any rank saw a
        non-finite value, else 0.0 (the `found_inf` a fused optimizer skips its update by).
        `carried`: the losses were observed with carry=True and `grad_norm` is the norm of
        gradients reduced across ranks, so every rank's verdict is already the same.
        `decides=False`: the caller applies or skips the update without this verdict (nan_policy
        count, a loss scaler), so it is only counted: returned as this rank's own, and agreed
        across ranks when the verdicts are folded (one all-reduce for many steps)."""
        losses, self._losses = self._losses, []
        loss_zeroed = sum(losses[1:], losses[0]) if losses else None
        carried = carried and include_grads
        # Fresh float32 sums, 0 (or -0) when every value checked is finite, NaN otherwise:
        # then 1.0 where not 0 (0-dim operands promote to the wider dtype).
        total = torch.mul(grad_norm, self._zero) if include_grads else None
        with_loss = None
        if loss_zeroed is not None:
            with_loss = torch.add(loss_zeroed, self._zero if total is None else total)
        if carried:
            # The update follows the reduced gradients, the same on every rank. A bad loss whose
            # backward kept them finite (cross-entropy with every target ignored: 0/0) is still
            # counted: from this rank's own check, agreed across ranks when folded.
            bad = counted = _flag(total, self._zero)
            if with_loss is not None and dist.is_initialized() and self.world_size > 1:
                counted, self._unagreed = _flag(with_loss, self._zero), True
        else:
            bad = counted = _flag(with_loss if with_loss is not None else total, self._zero)
            if dist.is_initialized() and self.world_size > 1:
                if decides:
                    dist.all_reduce(bad, op=dist.ReduceOp.MAX)
                else:
                    self._unagreed = True
        self._verdicts.append((step, counted, loss_zeroed))
        if len(self._verdicts) >= self.FOLD_EVERY:
            self._fold()
        return bad

    def _fold(self) -> None:
        """The kept verdicts added to the counters (a few launches for all of them). Collective
        when some verdict is not agreed yet: every rank folds at the same steps (every
        FOLD_EVERY steps and at logging points)."""
        if not self._verdicts:
            return
        steps, verdicts, loss_zeroed = zip(*self._verdicts, strict=True)
        self._verdicts = []
        stacked = torch.stack(verdicts)
        if self._unagreed:  # the agreed ones are equal on every rank: MAX keeps them
            dist.all_reduce(stacked, op=dist.ReduceOp.MAX)
            self._unagreed = False
        bad = stacked > 0
        self.events.add_(bad.sum())
        at = host_to_device(list(steps), self.events.device, torch.int64)
        torch.minimum(self._first, torch.where(bad, at, self._NEVER).min(), out=self._first)
        seen = [t for t in loss_zeroed if t is not None]
        if seen:
            self.loss_bad_ever.logical_or_(torch.stack(seen).isnan().any())

    @property
    def first_step(self) -> torch.Tensor:
        """The first step with a non-finite value; -1 when there was none. Like report(),
        call it on every rank: folding verdicts that are not agreed yet is a collective."""
        self._fold()
        return torch.where(self._first == self._NEVER, -1, self._first)

    @property
    def masks_update(self) -> bool:
        return self.policy in ("skip", "stop")

    def report(self) -> GuardReport:
        """Host read, at logging points: counts, first bad step and which ranks' loss was bad.
        One read from the device: the ranks' loss flags meet in one all-reduce (each rank's
        flag in its own slot), beside the counters every rank already shares."""
        self._fold()
        flags = torch.zeros(self.world_size, dtype=torch.int64, device=self.loss_bad_ever.device)
        flags[self.rank] = self.loss_bad_ever
        if dist.is_initialized() and self.world_size > 1:
            dist.all_reduce(flags)
        shared = torch.stack([self.events.reshape(()), self.first_step.reshape(())])
        events, first, *bad = torch.cat([shared, flags]).tolist()
        ranks = [r for r, f in enumerate(bad) if f]
        return GuardReport(events=int(events), first_step=int(first), loss_ranks=ranks)

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


def _flag(checked: torch.Tensor | None, zero: torch.Tensor) -> torch.Tensor:
    """1.0 (float32) where a `x * 0` sum is NaN, else 0.0; 0.0 when nothing was checked."""
    if checked is None:
        return zero.clone()
    return checked.to(torch.float32).ne_(0)  # .to is a no-op for float32: in place then


def masked_step(optimizer: torch.optim.Optimizer, bad: torch.Tensor) -> bool:
    """Run optimizer.step() unless `bad`; True when the mask was applied on the device."""
    if getattr(optimizer, "_step_supports_amp_scaling", False):
        # Fused optimizers read these attributes (GradScaler's protocol) and skip on device.
        optimizer.grad_scale = None  # type: ignore[attr-defined]
        found = bad if bad.dtype == torch.float32 else bad.to(torch.float32)
        optimizer.found_inf = found  # type: ignore[attr-defined]
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
