"""Metrics accumulated on the device and reduced across ranks at logging points only.

    metrics.add("loss", loss)                 # mean over every value of every rank
    metrics.add("tokens", n, reduce="sum")
    metrics.add("grad_norm", norm, reduce="max")
    metrics.add("ids", ids, reduce="cat")     # all values of all ranks, concatenated
    values = metrics.compute()                # collectives here, then the buffers reset

`add` never syncs with the host; `compute` costs one all-reduce per reduction kind used (plus one
all-gather for `cat`). All ranks must call compute() together with the same names added.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from phalanx.errors import UsageError

REDUCTIONS = ("mean", "sum", "min", "max", "cat")


class Metrics:
    """Named running values on one device; see the module docstring."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._kinds: dict[str, str] = {}
        self._sums: dict[str, torch.Tensor] = {}
        self._counts: dict[str, torch.Tensor] = {}
        self._cats: dict[str, list[torch.Tensor]] = {}

    def add(self, name: str, value: torch.Tensor | float, *, reduce: str = "mean") -> None:
        if reduce not in REDUCTIONS:
            raise UsageError(f"metric {name!r}: reduce={reduce!r} is not one of {REDUCTIONS}")
        if self._kinds.setdefault(name, reduce) != reduce:
            raise UsageError(f"metric {name!r} was added with reduce={self._kinds[name]!r} before")
        if isinstance(value, torch.Tensor):
            tensor = value.detach().to(self.device, torch.float64).reshape(-1)
        else:
            # Python numbers become device tensors by a fill kernel, not a host-to-device copy
            # (a copy from pageable memory would synchronise the stream).
            tensor = torch.full((1,), float(value), dtype=torch.float64, device=self.device)
        if reduce == "cat":
            self._cats.setdefault(name, []).append(tensor)
            return
        if reduce in ("mean", "sum"):
            part = tensor.sum()
        else:
            part = tensor.min() if reduce == "min" else tensor.max()
        if name not in self._sums:
            self._sums[name] = part
            self._counts[name] = torch.zeros((), dtype=torch.float64, device=self.device)
        elif reduce in ("mean", "sum"):
            self._sums[name] = self._sums[name] + part
        else:
            pick = torch.minimum if reduce == "min" else torch.maximum
            self._sums[name] = pick(self._sums[name], part)
        self._counts[name] = self._counts[name] + tensor.numel()

    def _agree_on_names(self) -> None:
        """Ranks that saw no value of a name (e.g. an empty eval shard) add a neutral one."""
        if not _distributed():
            return
        kinds: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(kinds, self._kinds)
        neutral = {"min": float("inf"), "max": float("-inf")}
        for theirs in kinds:
            for name, kind in theirs.items():
                if name in self._kinds:
                    continue
                self._kinds[name] = kind
                if kind == "cat":
                    self._cats[name] = [torch.zeros(0, dtype=torch.float64, device=self.device)]
                    continue
                fill = neutral.get(kind, 0.0)
                self._sums[name] = torch.tensor(fill, dtype=torch.float64, device=self.device)
                self._counts[name] = torch.zeros((), dtype=torch.float64, device=self.device)

    def compute(self) -> dict[str, Any]:
        """Reduce across ranks, return plain Python values, reset."""
        self._agree_on_names()
        out: dict[str, Any] = {}
        by_kind: dict[str, list[str]] = {}
        for name in sorted(self._sums):
            by_kind.setdefault(self._kinds[name], []).append(name)
        additive = by_kind.get("mean", []) + by_kind.get("sum", [])
        if additive:
            stacked = torch.stack(
                [self._sums[n] for n in additive] + [self._counts[n] for n in additive]
            )
            values = _all_reduce(stacked, dist.ReduceOp.SUM).tolist()
            k = len(additive)
            for i, name in enumerate(additive):
                total, count = values[i], values[k + i]
                out[name] = total / max(count, 1) if self._kinds[name] == "mean" else total
        for kind, op in (("min", dist.ReduceOp.MIN), ("max", dist.ReduceOp.MAX)):
            names = by_kind.get(kind, [])
            if names:
                values = _all_reduce(torch.stack([self._sums[n] for n in names]), op).tolist()
                out.update(zip(names, values, strict=True))
        for name in sorted(self._cats):
            out[name] = _all_gather_cat(torch.cat(self._cats[name]))
        self._kinds, self._sums, self._counts, self._cats = {}, {}, {}, {}
        return out


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
