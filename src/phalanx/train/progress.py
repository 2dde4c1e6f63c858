"""Throughput, MFU and the progress line rank 0 prints at logging points.

One plain line per logging point (no carriage returns: SLURM output files stay readable):
    step 120/2000 | epoch 1 | loss 0.5312 | 10.2k samples/s | MFU 41.3% | ETA 3m05s
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

import torch

log = logging.getLogger("phalanx.train")

# Dense bf16 tensor-core peak per GPU (vendor data sheets), for MFU.
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}


def peak_flops(device: torch.device) -> float | None:
    """Peak dense bf16 FLOP/s of this rank's GPU, or None (CPU, unknown GPU)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((value for key, value in PEAK_FLOPS.items() if key in name), None)


def _duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


class Throughput:
    """Samples per second between logging points, with tokens/s and MFU when the user says how."""

    def __init__(
        self,
        *,
        world_size: int,
        flops_per_sample: float | None,
        tokens_per_sample: float | None,
        peak: float | None,
    ) -> None:
        self.world_size, self.flops_per_sample = world_size, flops_per_sample
        self.tokens_per_sample, self.peak = tokens_per_sample, peak
        self._since = self._start = time.perf_counter()
        self._steps = 0

    def restart(self) -> None:
        self._since = self._start = time.perf_counter()
        self._steps = 0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent in the block (evaluation, checkpoints) counts for no throughput."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.exclude(time.perf_counter() - started)

    def exclude(self, seconds: float) -> None:
        """Time spent outside training (evaluation, checkpoints) counts for no throughput."""
        self._since += seconds
        self._start += seconds

    def count_step(self) -> None:
        self._steps += 1

    def eta(self, remaining_steps: int) -> float | None:
        """Seconds left at the mean step time of this fit so far."""
        if not self._steps or remaining_steps < 0:
            return None
        return (time.perf_counter() - self._start) / self._steps * remaining_steps

    def measure(self, samples: float) -> dict[str, float]:
        """`samples`: global samples trained since the last call (already reduced)."""
        now = time.perf_counter()
        elapsed, self._since = max(now - self._since, 1e-9), now
        out = {"samples_per_s": samples / elapsed}
        if self.tokens_per_sample:
            out["tokens_per_s"] = out["samples_per_s"] * self.tokens_per_sample
        if self.flops_per_sample and self.peak:
            out["mfu"] = (
                out["samples_per_s"] * self.flops_per_sample / (self.peak * self.world_size)
            )
        return out


def rate(per_s: float) -> str:
    """A throughput as people read it: 0.5, 950, 9215, 10.3k, 1.25M (never 1.027e+04)."""
    if per_s < 10_000:
        return f"{per_s:.0f}" if per_s >= 10 else f"{per_s:.3g}"
    for div, suffix in ((1e3, "k"), (1e6, "M"), (1e9, "G")):
        text = f"{per_s / div:.3g}"
        if "e" not in text:  # 999.999k rounds to 1e+03: the next unit reads better
            return text + suffix
    return f"{per_s / 1e12:.3g}T"


def progress_line(
    step: int, total: int | None, epoch: int, values: dict[str, Any], eta_s: float | None
) -> str:
    parts = [f"step {step}/{total}" if total else f"step {step}", f"epoch {epoch}"]
    for key in ("loss", "grad_norm"):
        if key in values:
            parts.append(f"{key} {values[key]:.4g}")
    if "samples_per_s" in values:
        parts.append(f"{rate(values['samples_per_s'])} samples/s")
    if "tokens_per_s" in values:
        parts.append(f"{rate(values['tokens_per_s'])} tokens/s")
    if "mfu" in values:
        parts.append(f"MFU {100 * values['mfu']:.1f}%")
    if eta_s is not None:
        parts.append(f"ETA {_duration(eta_s)}")
    return " | ".join(parts)
