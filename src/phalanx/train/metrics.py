"""Metrics accumulated on the device and reduced across ranks at logging points only.

    metrics.add("loss", loss)                 # mean over every value of every rank
    metrics.add("tokens", n, reduce="sum")
    metrics.add("grad_norm", norm, reduce="max")
    metrics.add("ids", ids, reduce="cat")     # all values of all ranks, concatenated
    values = metrics.compute()                # collectives here, then the buffers reset

`add` launches no kernel in a training step: a tensor already on the metrics' device is kept
by reference (detached) and a Python number is summed on the host; the kept values are folded
into one running value per name every FOLD_EVERY adds and at compute(). That keeps the step's
launch count what the user's own code costs (issue #17). `compute` costs an exchange of the
names (a CPU all-gather on a gloo group when given one), at most two all-reduces on the device
and one read from it (plus one all-gather for `cat`). All ranks must call compute() together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from phalanx.errors import UsageError

REDUCTIONS = ("mean", "sum", "min", "max", "cat")
FOLD_EVERY = 64
"""Kept tensors per name before they are folded into the running value (bounds memory)."""


@dataclass
class _Series:
    """One name's values since the last compute()."""

    kind: str
    pending: list[torch.Tensor] = field(default_factory=list)  # device values, not yet folded
    folded: torch.Tensor | None = None  # float64 running sum / min / max (or all, for cat)
    host: float | None = None  # Python numbers' running sum / min / max
    count: int = 0


class Metrics:
    """Named running values on one device; see the module docstring."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._series: dict[str, _Series] = {}

    def add(self, name: str, value: torch.Tensor | float, *, reduce: str = "mean") -> None:
        if reduce not in REDUCTIONS:
            raise UsageError(f"metric {name!r}: reduce={reduce!r} is not one of {REDUCTIONS}")
        series = self._series.get(name)
        if series is None:
            series = self._series[name] = _Series(reduce)
        elif series.kind != reduce:
            raise UsageError(f"metric {name!r} was added with reduce={series.kind!r} before")
        if not isinstance(value, torch.Tensor):
            if reduce == "cat":
                value = torch.tensor([float(value)], dtype=torch.float64)
            else:
                series.host = _combine_host(reduce, series.host, float(value))
                series.count += 1
                return
        # Kept by reference (see the module docstring) and flattened when folded.
        series.pending.append(value.detach())
        series.count += value.numel()
        if len(series.pending) >= FOLD_EVERY:
            _fold(series, self.device)

    def _agree_on_names(self, group: Any) -> None:
        """Ranks that saw no value of a name (e.g. an empty eval shard) add an empty series."""
        if not _distributed():
            return
        kinds: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(kinds, {n: s.kind for n, s in self._series.items()}, group=group)
        for theirs in kinds:
            for name, kind in theirs.items():
                self._series.setdefault(name, _Series(kind))

    def compute(self, *, names_group: Any = None) -> dict[str, Any]:
        """Reduce across ranks, return plain Python values, reset.

        One read from the device, after two all-reduces on it (sum: totals and counts; min:
        minima and negated maxima), so the GPU's queue drains once per logging point.
        `names_group`: a CPU (gloo) group for agreeing on the names, which then costs no
        device work either (the Trainer passes its control group); default: the default group.
        """
        self._agree_on_names(names_group)
        for series in self._series.values():
            _fold(series, self.device)
        reduced = [n for n in sorted(self._series) if self._series[n].kind != "cat"]
        out: dict[str, Any] = dict(self._reduce(reduced)) if reduced else {}
        for name in sorted(set(self._series) - set(reduced)):
            folded = self._series[name].folded
            out[name] = _all_gather_cat(folded if folded is not None else torch.zeros(0))
        self._series = {}
        return out

    def _reduce(self, names: list[str]) -> dict[str, float]:
        """Each sum/mean/min/max series over all ranks. Slots, in the same order on every rank:
        totals and counts (summed), then minima and negated maxima (min-reduced)."""
        additive, mins, maxs = (
            [n for n in names if self._series[n].kind in kinds]
            for kinds in (("mean", "sum"), ("min",), ("max",))
        )
        host = [self._host_or(n, 0.0) for n in additive]
        host += [float(self._series[n].count) for n in additive]
        host += [self._host_or(n, math.inf) for n in mins]
        host += [-self._host_or(n, -math.inf) for n in maxs]
        local = host_to_device(host, self.device)
        k, m = len(additive), len(mins)
        for part, group, neutral, combine in (
            (local[:k], additive, 0.0, torch.add),
            (local[2 * k : 2 * k + m], mins, math.inf, torch.minimum),
            (local[2 * k + m :], maxs, -math.inf, _min_negated),
        ):
            if any(self._series[n].folded is not None for n in group):
                part.copy_(combine(part, self._stacked(group, neutral)))
        _all_reduce(local[: 2 * k], dist.ReduceOp.SUM)
        _all_reduce(local[2 * k :], dist.ReduceOp.MIN)
        values = local.tolist()  # the one read from the device
        out = {}
        for i, name in enumerate(additive):
            total, count = values[i], values[k + i]
            out[name] = total / max(count, 1) if self._series[name].kind == "mean" else total
        out.update(zip(mins, values[2 * k : 2 * k + m], strict=True))
        out.update((n, -v) for n, v in zip(maxs, values[2 * k + m :], strict=True))
        return out

    def _stacked(self, names: list[str], neutral: float) -> torch.Tensor:
        """The names' device values as one tensor; `neutral` where this rank has none."""
        filler = torch.full((), neutral, dtype=torch.float64, device=self.device)
        folded = [self._series[n].folded for n in names]
        return torch.stack([filler if f is None else f for f in folded])

    def _host_or(self, name: str, neutral: float) -> float:
        host = self._series[name].host
        return neutral if host is None else host


def _min_negated(slots: torch.Tensor, maxima: torch.Tensor) -> torch.Tensor:
    return torch.minimum(slots, maxima.neg())


def host_to_device(
    values: list[float] | list[int], device: torch.device, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """Host numbers as a tensor on `device`; on CUDA copied from pinned memory without
    waiting (torch.tensor(..., device=cuda) waits for the stream, draining the GPU's queue)."""
    host = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def _combine_host(kind: str, old: float | None, new: float) -> float:
    if old is None:
        return new
    if kind == "min":
        return min(old, new)
    if kind == "max":
        return max(old, new)
    return old + new


def _fold(series: _Series, device: torch.device) -> None:
    """The pending tensors combined (in float64, on `device`) into the running value."""
    if not series.pending:
        return
    pending = series.pending
    if all(t.device == device and t.dtype == pending[0].dtype for t in pending):
        # Two launches for all of them; scalars (the usual values) need no reshape each.
        scalars = all(t.dim() == 0 for t in pending)
        joined = torch.stack(pending) if scalars else torch.cat([t.reshape(-1) for t in pending])
        values = joined.to(torch.float64)
    else:
        values = torch.cat([t.reshape(-1).to(device, torch.float64) for t in pending])
    series.pending = []
    if series.kind == "cat":
        parts = [values] if series.folded is None else [series.folded, values]
        series.folded = torch.cat(parts)
        return
    if series.kind in ("mean", "sum"):
        part = values.sum()
    elif values.numel() == 0:
        return
    else:
        part = values.min() if series.kind == "min" else values.max()
    if series.folded is None:
        series.folded = part
    elif series.kind in ("mean", "sum"):
        series.folded = series.folded + part
    else:
        pick = torch.minimum if series.kind == "min" else torch.maximum
        series.folded = pick(series.folded, part)


def _distributed() -> bool:
    return dist.is_initialized() and dist.get_world_size() > 1


def _all_reduce(tensor: torch.Tensor, op: Any) -> torch.Tensor:
    if _distributed() and tensor.numel():
        dist.all_reduce(tensor, op=op)
    return tensor


def _all_gather_cat(local: torch.Tensor) -> list[float]:
    """Rank-ordered concatenation; ranks may hold different numbers of values."""
    if not _distributed():
        return local.tolist()
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, local.cpu().tolist())
    return [v for part in parts for v in part]
