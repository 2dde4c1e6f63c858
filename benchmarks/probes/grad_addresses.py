"""Do the Trainer's gradients keep their addresses at 1 GPU, so that GradNorm replays its graph?

    [PROBE_RING=1] torchrun --standalone --nproc_per_node=1 \\
        benchmarks/probes/grad_addresses.py [step_pairs args]

Runs `step_pairs.py` with `GradNorm.__call__` wrapped to record, every step, whether the norm
was replayed and how many gradients moved since the previous step (and their sizes). With
PROBE_RING=1, `Metrics.add` keeps 0-dim device values in a preallocated per-name ring (one
copy a value) instead of by reference: the idea tested in issue #17, session 17 (it did not
make the gradients stay). A diagnosis, not a benchmark; it patches phalanx's classes in this
process only.
"""

from __future__ import annotations

import collections
import os
import sys
from pathlib import Path
from typing import Any

import torch

# step_pairs.py and its helpers live one folder up.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import step_pairs

from phalanx.train import grad_norm, metrics

Row = tuple[bool, list[int] | None]  # (replayed, sizes of the gradients that moved)


def watch(rows: list[Row]) -> Any:
    original = grad_norm.GradNorm.__call__

    def call(self: Any, grads: list[torch.Tensor], **kw: Any) -> Any:
        where = [g.data_ptr() for g in grads]
        before = getattr(self, "_probe_where", None)
        replayed = self._graph is not None and where == self._where
        replayed = replayed and kw.get("max_norm", 0.0) == self._clip
        moved = None
        if before is not None:
            moved = [g.numel() for g, a, b in zip(grads, where, before, strict=True) if a != b]
        self._probe_where = where
        rows.append((replayed, moved))
        return original(self, grads, **kw)

    return call


def ring_add(self: Any, name: str, value: Any, *, reduce: str = "mean") -> None:
    """Metrics.add with 0-dim device values copied into a ring of FOLD_EVERY slots."""
    keep = isinstance(value, torch.Tensor) and value.dim() == 0 and value.device == self.device
    if keep and reduce != "cat":
        rings = self.__dict__.setdefault("_probe_rings", {})
        ring = rings.get(name)
        if ring is None or ring.dtype != value.dtype:
            ring = rings[name] = torch.empty(metrics.FOLD_EVERY, dtype=value.dtype,
                                             device=self.device)  # fmt: skip
        series = self._series.get(name)
        slot = ring[len(series.pending) if series is not None else 0]
        slot.copy_(value.detach())
        value = slot
    ORIGINAL_ADD(self, name, value, reduce=reduce)


ORIGINAL_ADD = metrics.Metrics.add


def main() -> None:
    rows: list[Row] = []
    grad_norm.GradNorm.__call__ = watch(rows)  # type: ignore[method-assign]
    if os.environ.get("PROBE_RING") == "1":
        metrics.Metrics.add = ring_add  # type: ignore[method-assign]
    try:
        step_pairs.main()
    finally:
        late = rows[30:]
        print(
            f"PROBE ring={os.environ.get('PROBE_RING', '0')}: {len(rows)} steps, replayed "
            f"{sum(r for r, _ in rows)}; after step 30: {sum(r for r, _ in late)}/{len(late)}"
        )
        counts = collections.Counter(len(m) for _, m in rows if m is not None)
        print("PROBE gradients moved per step (count: steps):", dict(sorted(counts.items())))
        for i, (replayed, moved) in enumerate(rows[25:35], 25):
            sizes = sorted(set(moved or []))[:8]
            print(f"PROBE step {i}: replayed {replayed}, moved {len(moved or [])}, sizes {sizes}")


if __name__ == "__main__":
    main()
