"""The CPU copy an async save writes from: allocated at the first save, refilled by later ones.

An async save first copies the state out of the training tensors ("staging"); training waits
for exactly that copy, then goes on while the copy is written. Allocating that copy (and, with
CUDA, pinning it) at every save would make training wait for the allocation too, so the buffers
live from one save to the next and are reallocated only when the state's layout changes (a new
parameter group, an optimizer that got its state at the first step).

Why not DCP's own stagers: `DefaultStager` failed its second staging on torch 2.11 (H100) with
`KeyError: <class 'type'>`, so it cannot be kept across saves there, and a fresh one per save
spent 0.8 s of a 1.5 GB save allocating and pinning; `BlockingAsyncStager`'s cache always pins
(an error without CUDA) and cannot place the copy in shared memory for a writer process.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.tensor import DTensor


class CachedStager(AsyncStager):
    """Stages a state dict into CPU buffers kept between calls (blocking: the copy is complete,
    and safe from the next optimizer step, when `stage` returns).

    `pin_memory` (CUDA only) makes the device-to-host copy run at full bus speed;
    `share_memory` puts the buffers in shared memory, for a writer in another process.
    Not thread-safe; the caller must not stage again while a write of the last copy runs.
    """

    _synchronize_after_execute = False

    def __init__(self, *, pin_memory: bool, share_memory: bool = False) -> None:
        self._pin = pin_memory
        self._share = share_memory
        self._buffers: dict[str, Any] | None = None
        self._layout: object = None

    def stage(self, state_dict: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        layout = layout_of(state_dict)
        if self._buffers is None or layout != self._layout:
            self._buffers = _create_cpu_state_dict(
                state_dict, pin_memory=self._pin, share_memory=self._share
            )
            self._layout = layout
        # Non-tensor leaves (learning rates, step counts) come from `state_dict`, tensors are
        # copied into the buffers; pinned copies are asynchronous until the synchronize.
        staged = _copy_state_dict(state_dict, self._buffers, non_blocking=self._pin)
        if self._pin:
            torch.cuda.synchronize()
        return staged

    @property
    def pinned(self) -> bool:
        """The copy is in page-locked memory."""
        return self._pin

    def synchronize_staging(self) -> None:
        """Nothing to wait for: `stage` returns once the copy is complete."""

    def close(self) -> None:
        """Release the buffers (and their pinned or shared memory)."""
        self._buffers = None
        self._layout = None


def layout_of(value: Any) -> object:
    """A comparable summary of a state dict's structure: keys, and each tensor's type, shape
    and dtype (for a DTensor also its local shard's shape); other leaves only by type."""
    if isinstance(value, dict):
        return tuple((key, layout_of(item)) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(layout_of(item) for item in value))
    if isinstance(value, DTensor):
        local = value.to_local()
        return ("DTensor", tuple(value.shape), tuple(local.shape), value.dtype)
    if isinstance(value, torch.Tensor):
        return ("Tensor", tuple(value.shape), value.dtype)
    return type(value).__name__
