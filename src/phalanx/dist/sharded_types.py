"""Is this an FSDP2 module, a DTensor, a DCP error? Answered without importing torch's modules
for them until something else has.

torch.distributed.fsdp, .tensor and .checkpoint cost ~0.6 s of CPU to import (DTensor's op
tables, sympy), in every rank, fork server and DataLoader worker that imports phalanx.train or
the Checkpointer. A run that shards imports them where it shards or writes shards; until then
no module can be an FSDPModule, no tensor a DTensor, no error a CheckpointException.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TypeGuard

from torch import nn

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

_FSDP = "torch.distributed.fsdp"
_DTENSOR = "torch.distributed.tensor"
_DCP = "torch.distributed.checkpoint"


def is_fsdp_module(module: nn.Module) -> bool:
    if _FSDP not in sys.modules:
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def is_dtensor(value: object) -> TypeGuard[DTensor]:
    if _DTENSOR not in sys.modules:
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def dcp_errors(*others: type[BaseException]) -> tuple[type[BaseException], ...]:
    """`others` and torch.distributed.checkpoint's own error type once DCP is imported, for an
    `except` clause (evaluated when an exception arrives there)."""
    if _DCP not in sys.modules:
        return others
    from torch.distributed.checkpoint.api import CheckpointException

    return (*others, CheckpointException)
