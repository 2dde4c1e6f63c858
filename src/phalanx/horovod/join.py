"""hvd.join(): a rank that ran out of data keeps serving its peers' collectives with zeros.

torch.distributed matches collectives by call order, so a finished rank must take part in
every collective its peers still issue. Each phalanx.horovod collective therefore starts with
one small control all-reduce, "who is still active?". While every rank is active that is all it
costs. Once a rank has joined, the lowest active rank also broadcasts a description of the
collective (kind, shapes, dtypes, op), and each joined rank runs the same collective with zeros
(an allreduce) or no rows (an allgather). When nobody is active any more, join() returns on
every rank with the same value: the rank that joined last.
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


def _exchange(active: bool) -> list[bool]:
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
    states = _exchange(True)
    if all(states):
        return
    root = states.index(True)
    message = {"kind": kind, **describe()} if RUNTIME.require().env.rank == root else None
    box = [message]
    dist.broadcast_object_list(box, src=root, group=RUNTIME.object_group())
    _check(box[0], states)


def _check(message: Descriptor | None, states: list[bool]) -> None:
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


def join(device: int = -1) -> int:
    """Contribute zeros to the peers' collectives until every rank has joined; returns the rank
    that joined last (the same on every rank)."""
    handle = RUNTIME.require()
    if handle.env.world_size == 1:
        return handle.env.rank
    RUNTIME.joined = True
    try:
        while True:
            states = _exchange(False)
            if not any(states):
                break
            box: list[Descriptor | None] = [None]
            dist.broadcast_object_list(box, src=states.index(True), group=RUNTIME.object_group())
            _check(box[0], states)
            assert box[0] is not None
            _serve(box[0])
    finally:
        RUNTIME.joined = False
    last = RUNTIME.last_active or list(range(handle.env.world_size))
    return max(last)


def _device_for(device_type: str) -> torch.device:
    return torch.device("cpu") if device_type == "cpu" else RUNTIME.require().device


def _serve(message: Descriptor) -> None:
    # Imported here: the collectives import negotiate() from this module.
    from phalanx.horovod import gather, reduce

    kind = message["kind"]
    device = _device_for(message["device"]) if "device" in message else None
    if kind == "allreduce":
        zeros = [
            torch.zeros(shape, dtype=getattr(torch, dtype), device=device)
            for shape, dtype in message["tensors"]
        ]
        works = [reduce.launch_allreduce(z, message["op"], 1.0, 1.0)[0] for z in zeros]
        for work in works:
            if work is not None:
                work.wait()
    elif kind == "allgather":
        empty = torch.zeros((0, *message["trailing"]), dtype=getattr(torch, message["dtype"]))
        gather.allgather_rows(empty.to(device))
    elif kind == "broadcast":
        shape, dtype = message["tensors"][0]
        buffer = torch.zeros(shape, dtype=getattr(torch, dtype))
        buffer = buffer.to(device)
        dist.broadcast(buffer, src=message["root_rank"], group=RUNTIME.group_for(buffer))
    else:
        dist.barrier(group=RUNTIME.object_group())


def dtype_name(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")
