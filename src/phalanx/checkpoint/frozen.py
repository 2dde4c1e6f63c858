"""Frozen parameters (`requires_grad=False`: a LoRA run's base model) are left out of checkpoints.

They never change during training, and the run's script rebuilds them at every start (from
pretrained files or the seed), so writing them again at every save only costs I/O and disk:
for a 70B LoRA run ~140 GB per save against an adapter of ~1 GB. Each checkpoint records instead
which parameters were frozen and a fingerprint of their values (per tensor: the sum and the sum
of squares, in float64); a resume recomputes it on the rebuilt model and refuses, in one line,
a base that changed. `checkpoint.save_frozen=true` writes them as before.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from phalanx.errors import UsageError


def frozen_names(model: nn.Module) -> list[str]:
    return [name for name, p in model.named_parameters() if not p.requires_grad]


def fingerprint(model: nn.Module) -> dict[str, Any] | None:
    """{"names": frozen parameter names, "sums": [sum, sum of squares] of each}; None without
    frozen parameters. A collective for split parameters (DTensor reductions): call it on every
    rank."""
    names, sums = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            continue
        values = param.detach().double()
        pair: Any = torch.stack([values.sum(), values.square().sum()])
        pair = pair.full_tensor() if hasattr(pair, "full_tensor") else pair
        names.append(name)
        sums.append([float(v) for v in pair.cpu()])
    return {"names": names, "sums": sums} if names else None


def _same(a: list[float], b: list[float]) -> bool:
    """Equal up to float64 summation order (another world size shards a tensor differently):
    the sum of squares relatively, the sum against the tensor's norm (it may cancel to ~0)."""
    norm = math.sqrt(max(a[1], 0.0))
    return math.isclose(a[1], b[1], rel_tol=1e-9, abs_tol=1e-30) and abs(a[0] - b[0]) <= (
        1e-9 * norm + 1e-30
    )


def check_unchanged(recorded: dict[str, Any], now: dict[str, Any] | None, step_dir: Path) -> None:
    """Refuse to resume `step_dir` (saved without its frozen parameters) into a model whose
    frozen parameters are not those it was trained with."""
    now = now or {"names": [], "sums": []}
    if recorded["names"] != now["names"]:
        gone = sorted(set(recorded["names"]) - set(now["names"]))[:2]
        raise UsageError(
            f"checkpoint {step_dir} was trained with {len(recorded['names'])} frozen parameter(s) "
            f"this model does not freeze the same way (e.g. {gone or now['names'][:2]}); resume "
            "with the model it was trained with, or start afresh (checkpoint.resume=never)"
        )
    changed = [
        name
        for name, a, b in zip(now["names"], recorded["sums"], now["sums"], strict=True)
        if not _same(a, b)
    ]
    if changed:
        raise UsageError(
            f"the frozen parameters differ from those checkpoint {step_dir} was trained with "
            f"({len(changed)} of {len(now['names'])}, e.g. {changed[0]}): the base model changed "
            "or is another one; resume with the base it was trained on, or start afresh "
            "(checkpoint.resume=never)"
        )
