"""The per-step control all-reduce: the host-side flags every rank must agree on, in ONE call.

Flags: "I have no data left", "stop requested" (a signal, a NaN stop, a time limit) and "my
background checkpoint write is still running" (so all ranks commit it together). They are
host values, so the all-reduce runs on CPU tensors: through the default group when it is gloo,
through a gloo side group when the default is NCCL. Either way no CUDA stream is synchronised,
so a training step keeps the GPU queue full (checked with torch.cuda.set_sync_debug_mode).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Agreement:
    """What all ranks agreed on after one control all-reduce."""

    all_have_data: bool
    any_stop: bool
    all_writes_done: bool = True


class ControlPlane:
    """Create on every rank (group creation is collective), then call agree() once per step."""

    def __init__(self) -> None:
        self._group = None
        if dist.is_initialized() and dist.get_backend() != "gloo":
            self._group = dist.new_group(backend="gloo")
        self._flags = torch.zeros(3, dtype=torch.int32)

    def agree(self, *, has_data: bool, stop: bool, writing: bool = False) -> Agreement:
        """All ranks learn whether every rank has data, whether any rank wants to stop and
        whether every rank's background write has finished."""
        self._flags[0] = 0 if has_data else 1
        self._flags[1] = 1 if stop else 0
        self._flags[2] = 1 if writing else 0
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(self._flags, op=dist.ReduceOp.MAX, group=self._group)
        return Agreement(
            all_have_data=not bool(self._flags[0]),
            any_stop=bool(self._flags[1]),
            all_writes_done=not bool(self._flags[2]),
        )
