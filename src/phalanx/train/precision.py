"""One switch for numeric precision: fp32, bf16 autocast, fp16 autocast + GradScaler; fp8 is
bf16 autocast here, its float8 layers are swapped in by the parallelize pipeline (float8.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class Precision:
    """Autocast context, loss scaling and the optimizer step for one precision mode."""

    def __init__(self, mode: str, device: torch.device) -> None:
        self.mode = mode
        self.device_type = device.type
        # fp8: bf16 autocast around torchao's float8 layers.
        low = {"bf16": torch.bfloat16, "fp8": torch.bfloat16, "fp16": torch.float16}
        self.dtype = low.get(mode)
        self.scaler = torch.amp.GradScaler(device.type) if mode == "fp16" else None
        # fp16 overflow skips counted on the device; read at logging points only.
        self.scaler_skips = torch.zeros((), dtype=torch.int64, device=device)

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.dtype is None:
            yield
            return
        with torch.autocast(self.device_type, dtype=self.dtype):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()  # type: ignore[no-untyped-call]

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients to their true scale before clipping or measuring them."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """optimizer.step(); with fp16 the scaler skips steps whose gradients overflowed."""
        if self.scaler is None:
            optimizer.step()
            return
        # _get_scale_async reads the scale tensor without a host sync (get_scale() syncs).
        before = self.scaler._get_scale_async()
        before = before.clone() if before is not None else None
        self.scaler.step(optimizer)
        self.scaler.update()
        after = self.scaler._get_scale_async()
        if before is not None and after is not None:
            # The scale only shrinks after an overflow, i.e. after a skipped step.
            self.scaler_skips += (after < before).to(self.scaler_skips.device, torch.int64)
