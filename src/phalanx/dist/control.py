"""The control all-reduce: the host-side flags every rank must agree on, in ONE call.

Flags: "I have no data left", "stop requested" (a signal, a NaN stop, a time limit) and "my
background checkpoint write is still running" (so all ranks commit it together). They are
host values, so the all-reduce runs on CPU tensors, through a gloo group of its own: no CUDA
stream is synchronised (checked with torch.cuda.set_sync_debug_mode) and, on CPU, it never
queues behind DDP's gradient all-reduces.

`agree()` is the blocking form: every rank waits for the slowest. The Trainer uses `post()`
where the data need no agreement (map-style data: every rank knows the step count): the
all-reduce runs in the background and its verdict is read one step later, after the next
step's kernels are launched, so no rank's launch thread waits for its peers (issue #17).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Agreement:
    """What all ranks agreed on after one control all-reduce."""

    all_have_data: bool
    any_stop: bool
    all_writes_done: bool = True


class PendingAgreement:
    """A posted control all-reduce; `wait()` returns its Agreement (every rank must wait)."""

    def __init__(self, flags: torch.Tensor | list[bool], work: Any) -> None:
        self._flags, self._work = flags, work

    def wait(self) -> Agreement:
        if self._work is not None:
            self._work.wait()
            self._work = None
        values = self._flags.tolist() if isinstance(self._flags, torch.Tensor) else self._flags
        return Agreement(
            all_have_data=not values[0], any_stop=bool(values[1]), all_writes_done=not values[2]
        )


class ControlPlane:
    """Create on every rank (group creation is collective), then call agree() once per step
    (or post() and, one step later, wait on what it returned)."""

    def __init__(self) -> None:
        self._group = None
        self._distributed = dist.is_initialized() and dist.get_world_size() > 1
        if self._distributed:
            self._group = dist.new_group(backend="gloo")

    @property
    def group(self) -> Any:
        """The gloo group the flags travel on (None in a single process): host values only."""
        return self._group

    def post(self, *, has_data: bool = True, stop: bool, writing: bool = False) -> PendingAgreement:
        """Start the all-reduce of this rank's flags; every rank must post in the same order."""
        if not self._distributed:  # one process: its flags are the verdict, no tensor needed
            return PendingAgreement([not has_data, stop, writing], None)
        flags = torch.tensor([not has_data, stop, writing], dtype=torch.int32)
        work = dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        return PendingAgreement(flags, work)

    def agree(self, *, has_data: bool, stop: bool, writing: bool = False) -> Agreement:
        """All ranks learn whether every rank has data, whether any rank wants to stop and
        whether every rank's background write has finished."""
        return self.post(has_data=has_data, stop=stop, writing=writing).wait()
