"""Evaluation that counts every sample exactly once, on any number of ranks.

Each rank runs its own shard (no padding, so shards may differ in size; the unwrapped model
runs without collectives), eval_step returns per-sample values, and one reduction at the end
gives the mean over the whole data set — equal to a single-process evaluation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from phalanx.errors import UsageError
from phalanx.train.metrics import Metrics
from phalanx.train.precision import Precision
from phalanx.train.step import to_device

EvalFn = Callable[[nn.Module, Any], Mapping[str, torch.Tensor]]


def evaluate(
    model: nn.Module,
    batches: Iterable[Any],
    eval_step: EvalFn,
    *,
    device: torch.device,
    precision: Precision,
    max_batches: int | None = None,
) -> dict[str, float]:
    """Mean of every per-sample value eval_step returns, over all samples of all ranks."""
    metrics = Metrics(device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for i, batch in enumerate(batches):
                if max_batches is not None and i >= max_batches:
                    break
                with precision.autocast():
                    out = eval_step(model, to_device(batch, device))
                if not isinstance(out, Mapping):
                    raise UsageError(
                        "eval_step must return a dict of per-sample tensors, e.g. "
                        f"{{'accuracy': (pred == y).float()}}; got {type(out).__name__}"
                    )
                for name, value in out.items():
                    metrics.add(f"eval/{name}", value.float())
    finally:
        model.train(was_training)
    return metrics.compute()
