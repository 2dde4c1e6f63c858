"""The one mutable object behind phalanx.horovod's module-level API.

Horovod's API is a set of module functions (`hvd.rank()`, `hvd.allreduce_async(t)` then
`hvd.synchronize(handle)`), so the state those calls share -- the process group handle, pending
async handles, whether this rank has joined, which warnings were shown -- has to live somewhere
a module function can reach. It lives here, in one explicit object (RUNTIME) instead of loose
globals; `reset()` returns it to the state before `init()` (used by `shutdown()`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from phalanx.dist.process_group import Dist
from phalanx.errors import UsageError


@dataclass
class Pending:
    """An async collective: the torch Work (None once done) and what turns it into the result."""

    work: Any
    finish: Callable[[], Any]


@dataclass
class Runtime:
    handle: Dist | None = None
    """What phalanx.init() set up (None before hvd.init())."""
    owns_group: bool = False
    """True when hvd.init() created the process group (so hvd.shutdown() destroys it)."""
    cpu_group: Any = None
    """A gloo group for CPU tensors when the default group is NCCL (None: use the default)."""
    fusion_threshold_bytes: int = 128 * 1024 * 1024
    """Bucket size of DistributedOptimizer's fused reductions (HOROVOD_FUSION_THRESHOLD)."""
    pending: dict[int, Pending] = field(default_factory=dict)
    next_handle: int = 0
    last_active: list[int] | None = None
    """The ranks that were active in the latest collective (join() returns the highest)."""
    joined: bool = False
    """True while this rank is inside hvd.join(), serving its peers' collectives with zeros."""
    warned: set[str] = field(default_factory=set)

    def require(self) -> Dist:
        if self.handle is None:
            raise UsageError("phalanx.horovod is not initialised; call hvd.init() first")
        return self.handle

    def group_for(self, tensor: torch.Tensor) -> Any:
        """The group that can move `tensor`: the gloo side group for CPU tensors under NCCL."""
        self.require()
        if tensor.device.type == "cpu" and self.cpu_group is not None:
            return self.cpu_group
        return None

    def object_group(self) -> Any:
        """Picklable objects and control messages always travel over gloo (no GPU sync)."""
        self.require()
        return self.cpu_group

    def add_pending(self, work: Any, finish: Callable[[], Any]) -> int:
        handle = self.next_handle
        self.next_handle += 1
        self.pending[handle] = Pending(work=work, finish=finish)
        return handle

    def reset(self) -> None:
        for spec in dataclasses.fields(self):
            if spec.name != "warned":
                default = Runtime.__dataclass_fields__[spec.name]
                value = (
                    default.default_factory()
                    if default.default_factory is not dataclasses.MISSING
                    else default.default
                )
                setattr(self, spec.name, value)


RUNTIME = Runtime()


def world_size() -> int:
    return RUNTIME.require().env.world_size


def world_rank() -> int:
    return RUNTIME.require().env.rank


def is_group_ready() -> bool:
    return RUNTIME.handle is not None and dist.is_initialized()
