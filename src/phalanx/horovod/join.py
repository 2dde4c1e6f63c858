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

import torch
import torch.distributed as dist

from phalanx.horovod import gather, reduce
from phalanx.horovod.protocol import Descriptor, check, exchange
from phalanx.horovod.runtime import RUNTIME


def join(device: int = -1) -> int:
    """Contribute zeros to the peers' collectives until every rank has joined; returns the rank
    that joined last (the same on every rank)."""
    handle = RUNTIME.require()
    if handle.env.world_size == 1:
        return handle.env.rank
    RUNTIME.joined = True
    try:
        while True:
            states = exchange(False)
            if not any(states):
                break
            box: list[Descriptor | None] = [None]
            dist.broadcast_object_list(box, src=states.index(True), group=RUNTIME.object_group())
            check(box[0], states)
            assert box[0] is not None
            _serve(box[0])
    finally:
        RUNTIME.joined = False
    last = RUNTIME.last_active or list(range(handle.env.world_size))
    return max(last)


def _device_for(device_type: str) -> torch.device:
    return torch.device("cpu") if device_type == "cpu" else RUNTIME.require().device


def _serve(message: Descriptor) -> None:
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
