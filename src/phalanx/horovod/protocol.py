"""The negotiation every phalanx.horovod collective starts with, at the bottom of the package.

Each collective first runs one small control all-reduce, "who is still active?" (see
phalanx.horovod.join for why). The collectives (reduce, gather, objects, buckets) call
negotiate() from here and join() serves them from above, so no module imports its caller.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from phalanx.errors import UsageError
from phalanx.horovod.runtime import RUNTIME

Descriptor = dict[str, Any]

SERVED = ("allreduce", "allgather", "broadcast", "barrier")
"""Collectives a joined rank can take part in; others stop every rank with one line."""


def exchange(active: bool) -> list[bool]:
    """The control all-reduce: every rank says whether it is still active."""
    handle = RUNTIME.require()
    flags = torch.zeros(handle.env.world_size, dtype=torch.int32)
    flags[handle.env.rank] = int(active)
    dist.all_reduce(flags, group=RUNTIME.object_group())
    states = [bool(v) for v in flags.tolist()]
    if any(states):
        RUNTIME.last_active = [r for r, a in enumerate(states) if a]
    return states


def negotiate(kind: str, describe: Callable[[], Descriptor]) -> None:
    """Run by every active rank before a collective; a no-op on one rank."""
    if RUNTIME.require().env.world_size == 1:
        return
    states = exchange(True)
    if all(states):
        return
    root = states.index(True)
    message = {"kind": kind, **describe()} if RUNTIME.require().env.rank == root else None
    box = [message]
    dist.broadcast_object_list(box, src=root, group=RUNTIME.object_group())
    check(box[0], states)


def check(message: Descriptor | None, states: list[bool]) -> None:
    """Stop every rank with one line when joined ranks cannot serve the collective."""
    assert message is not None
    joined = [r for r, a in enumerate(states) if not a]
    if message["kind"] not in SERVED:
        raise UsageError(
            f"hvd.{message['kind']} was called while rank(s) {joined} had called hvd.join(); "
            f"only {', '.join(SERVED)} work then: call it before hvd.join() on every rank"
        )
    root = message.get("root_rank")
    if message["kind"] == "broadcast" and root is not None and not states[root]:
        raise UsageError(
            f"hvd.broadcast from rank {root}, which has already called hvd.join(); "
            "broadcast from a rank that is still active"
        )


def dtype_name(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")
