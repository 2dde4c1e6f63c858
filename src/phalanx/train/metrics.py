"""Metrics accumulated on the device and reduced across ranks at logging points only.

    metrics.add("loss", loss)                 # mean over every value of every rank
    metrics.add("tokens", n, reduce="sum")
    metrics.add("grad_norm", norm, reduce="max")
    metrics.add("ids", ids, reduce="cat")     # all values of all ranks, concatenated
    values = metrics.compute()                # collectives here, then the buffers reset

`add` launches no kernel in a training step: a tensor already on the metrics' device is kept
by reference (detached) and a Python number is summed on the host; the kept values are folded
into one running value per name every FOLD_EVERY adds and at compute(). That keeps the step's
launch count what the user's own code costs (issue #17). `compute` costs one all-reduce per
reduction kind used (plus one all-gather for `cat`). All ranks must call compute() together
with the same names added.
"""

from __future__ import annotations

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
        series = self._series.setdefault(name, _Series(reduce))
        if series.kind != reduce:
            raise UsageError(f"metric {name!r} was added with reduce={series.kind!r} before")
        if not isinstance(value, torch.Tensor):
            if reduce == "cat":
                value = torch.tensor([float(value)], dtype=torch.float64)
            else:
                series.host = _combine_host(reduce, series.host, float(value))
                series.count += 1
                return
        series.pending.append(value.detach().reshape(-1))
        series.count += value.numel()
        if len(series.pending) >= FOLD_EVERY:
            _fold(series, self.device)

    def _agree_on_names(self) -> None:
        """Ranks that saw no value of a name (e.g. an empty eval shard) add an empty series."""
        if not _distributed():
            return
        kinds: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(kinds, {n: s.kind for n, s in self._series.items()})
        for theirs in kinds:
            for name, kind in theirs.items():
                self._series.setdefault(name, _Series(kind))

    def compute(self) -> dict[str, Any]:
        """Reduce across ranks, return plain Python values, reset."""
        self._agree_on_names()
        for series in self._series.values():
            _fold(series, self.device)
        out: dict[str, Any] = {}
        by_kind: dict[str, list[str]] = {}
        for name in sorted(self._series):
            by_kind.setdefault(self._series[name].kind, []).append(name)
        local = self._local_values([n for n in self._series if self._series[n].kind != "cat"])
        additive = by_kind.get("mean", []) + by_kind.get("sum", [])
        if additive:
            counts = [float(self._series[n].count) for n in additive]
            stacked = torch.tensor(
                [local[n] for n in additive] + counts, dtype=torch.float64, device=self.device
            )
            values = _all_reduce(stacked, dist.ReduceOp.SUM).tolist()
            k = len(additive)
            for i, name in enumerate(additive):
                total, count = values[i], values[k + i]
                out[name] = total / max(count, 1) if self._series[name].kind == "mean" else total
        for kind, op in (("min", dist.ReduceOp.MIN), ("max", dist.ReduceOp.MAX)):
            names = by_kind.get(kind, [])
            if names:
                mine = torch.tensor(
                    [local[n] for n in names], dtype=torch.float64, device=self.device
                )
                out.update(zip(names, _all_reduce(mine, op).tolist(), strict=True))
        for name in by_kind.get("cat", []):
            folded = self._series[name].folded
            out[name] = _all_gather_cat(folded if folded is not None else torch.zeros(0))
        self._series = {}
        return out

    def _local_values(self, names: list[str]) -> dict[str, float]:
        """This rank's value of each sum/mean/min/max series (neutral if it saw none); the
        device parts reach the host in one copy."""
        on_device = [n for n in names if self._series[n].folded is not None]
        folded = [self._series[n].folded for n in on_device]
        copied = torch.stack(folded).tolist() if folded else []  # type: ignore[arg-type]
        device_values = dict(zip(on_device, copied, strict=True))
        out: dict[str, float] = {}
        for name in names:
            series = self._series[name]
            value = series.host
            if name in device_values:
                value = _combine_host(series.kind, value, device_values[name])
            neutral = {"min": float("inf"), "max": float("-inf")}.get(series.kind, 0.0)
            out[name] = neutral if value is None else value
        return out


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
        values = torch.cat(pending).to(torch.float64)  # two launches for all of them
    else:
        values = torch.cat([t.to(device, torch.float64) for t in pending])
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
    if _distributed():
        dist.all_reduce(tensor, op=op)
    return tensor


def _all_gather_cat(local: torch.Tensor) -> list[float]:
    """Rank-ordered concatenation; ranks may hold different numbers of values."""
    if not _distributed():
        return local.tolist()
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, local.cpu().tolist())
    return [v for part in parts for v in part]
