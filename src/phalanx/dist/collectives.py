"""Small collectives users need between training steps, on torch's default process group.

Each is ONE collective (one host sync), safe on gloo and NCCL; all ranks must call them in the
same order, as with any collective.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from phalanx.env import ClusterEnv
from phalanx.errors import UsageError

T = TypeVar("T")
REDUCE_OPS = ("mean", "sum", "min", "max")


def _require_group() -> None:
    if not dist.is_initialized():
        raise UsageError("no process group: call phalanx.init() (or use phalanx.distributed())")


def _collective_device() -> torch.device:
    """NCCL reduces CUDA tensors only; gloo reduces CPU tensors."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def barrier() -> None:
    """Wait until every rank arrives."""
    _require_group()
    if dist.get_backend() == "nccl":
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def all_reduce_scalars(values: Mapping[str, float], *, op: str = "mean") -> dict[str, float]:
    """Reduce a dict of scalars across ranks in one all-reduce; every rank gets the result.

    All ranks must pass the same keys. `op` is one of mean, sum, min, max.
    """
    _require_group()
    if op not in REDUCE_OPS:
        raise UsageError(f"op={op!r} is unknown; valid: {', '.join(REDUCE_OPS)}")
    keys = sorted(values)
    tensor = torch.tensor(
        [float(values[k]) for k in keys], dtype=torch.float64, device=_collective_device()
    )
    torch_op = {
        "mean": dist.ReduceOp.SUM,
        "sum": dist.ReduceOp.SUM,
        "min": dist.ReduceOp.MIN,
        "max": dist.ReduceOp.MAX,
    }[op]
    dist.all_reduce(tensor, op=torch_op)
    if op == "mean":
        tensor /= dist.get_world_size()
    return dict(zip(keys, tensor.tolist(), strict=True))


def broadcast_object(obj: T, *, src: int = 0) -> T:
    """Every rank returns `src`'s object (pickled: only for trusted, small values)."""
    _require_group()
    box: list[Any] = [obj]
    dist.broadcast_object_list(box, src=src, device=_collective_device())
    return box[0]  # type: ignore[no-any-return]


def all_gather_object(obj: T) -> list[T]:
    """The object of every rank, in rank order, on every rank."""
    _require_group()
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def gather_object(obj: T, *, dst: int = 0) -> list[T] | None:
    """The object of every rank, in rank order, on rank `dst`; None elsewhere."""
    _require_group()
    rank = dist.get_rank()
    out: list[Any] | None = [None] * dist.get_world_size() if rank == dst else None
    dist.gather_object(obj, out, dst=dst)
    return out


@contextmanager
def main_process_first(env: ClusterEnv, *, local: bool = False) -> Iterator[None]:
    """Run the body on the main process first, then on all others (e.g. download, then read).

    `local=False`: global rank 0 goes first (shared file systems). `local=True`: local rank 0
    of each node goes first (node-local disks). A failure on the main process still releases
    the others, which then fail on their own attempt instead of hanging.
    """
    first = env.is_local_main_process if local else env.is_main_process
    if not first:
        barrier()
    try:
        yield
    finally:
        if first:
            barrier()
