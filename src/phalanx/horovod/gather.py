"""allgather (any first dimension per rank), broadcast, alltoall, reducescatter, barrier.

These run at once and their *_async forms return an already finished handle: torch has no
asynchronous variable-size gather, and the results are the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from phalanx.errors import UsageError
from phalanx.horovod import ops
from phalanx.horovod.compression import Compression, Compressor
from phalanx.horovod.process_sets import global_process_set, refuse_process_set
from phalanx.horovod.protocol import dtype_name, negotiate
from phalanx.horovod.reduce import launch_allreduce
from phalanx.horovod.runtime import RUNTIME


def _size() -> int:
    return RUNTIME.require().env.world_size


def _rank() -> int:
    return RUNTIME.require().env.rank


def allgather_rows(tensor: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """Concatenate every rank's rows (first dimensions may differ); also returns the counts."""
    group = RUNTIME.group_for(tensor)
    count = torch.tensor([tensor.shape[0]], dtype=torch.int64, device=tensor.device)
    counts_t = [torch.empty_like(count) for _ in range(_size())]
    dist.all_gather(counts_t, count, group=group)
    counts = [int(c.item()) for c in counts_t]
    padded = tensor.new_zeros((max(counts), *tensor.shape[1:]))
    padded[: tensor.shape[0]] = tensor
    parts = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([part[:n] for part, n in zip(parts, counts, strict=True)]), counts


def _reduce_now(tensor: torch.Tensor, op: int) -> torch.Tensor:
    negotiate("allreduce", lambda: _describe_one(tensor, op))
    return launch_allreduce(tensor.detach().clone().contiguous(), op, 1.0, 1.0)[1]()


def _describe_one(tensor: torch.Tensor, op: int) -> dict[str, Any]:
    return {"tensors": [(tuple(tensor.shape), dtype_name(tensor))], "op": op,
            "device": tensor.device.type}  # fmt: skip


def _describe_rows(rows: torch.Tensor) -> dict[str, Any]:
    return {"trailing": tuple(rows.shape[1:]), "dtype": dtype_name(rows),
            "device": rows.device.type}  # fmt: skip


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        rows = tensor.reshape(1) if tensor.dim() == 0 else tensor
        negotiate("allgather", lambda: _describe_rows(rows))
        out, counts = allgather_rows(rows.detach())
        ctx.counts, ctx.shape = counts, tensor.shape
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        # Horovod's rule: average the incoming gradients, then take this rank's rows.
        reduced = _reduce_now(grad, ops.Average)
        offset = sum(ctx.counts[: _rank()])
        return reduced.narrow(0, offset, ctx.counts[_rank()]).reshape(ctx.shape)


def allgather(
    tensor: torch.Tensor, name: str | None = None, process_set: Any = global_process_set
) -> torch.Tensor:
    """Every rank's tensor concatenated along dimension 0 (first dimensions may differ)."""
    refuse_process_set(process_set)
    return _Allgather.apply(tensor)  # type: ignore[no-any-return,no-untyped-call]


def allgather_async(
    tensor: torch.Tensor, name: str | None = None, process_set: Any = global_process_set
) -> int:
    result = allgather(tensor, name, process_set)
    return RUNTIME.add_pending(None, lambda: result)


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int) -> torch.Tensor:
        ctx.root_rank = root_rank
        out = tensor.detach().clone().contiguous()
        broadcast_raw(out, root_rank)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        reduced = _reduce_now(grad, ops.Average)
        return (reduced if _rank() == ctx.root_rank else reduced.zero_()), None


def broadcast_raw(tensor: torch.Tensor, root_rank: int) -> None:
    """Overwrite `tensor` (contiguous) with root_rank's values, after the join check."""
    if not 0 <= root_rank < _size():
        raise UsageError(f"root_rank={root_rank} is not a rank (0..{_size() - 1})")
    negotiate("broadcast", lambda: {**_describe_one(tensor, 0), "root_rank": root_rank})
    if _size() > 1:
        dist.broadcast(tensor, src=root_rank, group=RUNTIME.group_for(tensor))


def broadcast(
    tensor: torch.Tensor, root_rank: int, name: str | None = None,
    process_set: Any = global_process_set,
) -> torch.Tensor:  # fmt: skip
    """A new tensor holding root_rank's values (autograd: the gradient goes to the root)."""
    refuse_process_set(process_set)
    return _Broadcast.apply(tensor, root_rank)  # type: ignore[no-any-return,no-untyped-call]


def broadcast_(
    tensor: torch.Tensor, root_rank: int, name: str | None = None,
    process_set: Any = global_process_set,
) -> torch.Tensor:  # fmt: skip
    refuse_process_set(process_set)
    with torch.no_grad():
        if tensor.is_contiguous():
            broadcast_raw(tensor, root_rank)
        else:
            buffer = tensor.contiguous()
            broadcast_raw(buffer, root_rank)
            tensor.copy_(buffer)
    return tensor


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: Any = global_process_set) -> int:  # fmt: skip
    result = broadcast(tensor, root_rank, name, process_set)
    return RUNTIME.add_pending(None, lambda: result)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: Any = global_process_set) -> int:  # fmt: skip
    result = broadcast_(tensor, root_rank, name, process_set)
    return RUNTIME.add_pending(None, lambda: result)


def _splits(tensor: torch.Tensor, splits: Any) -> list[int]:
    size = _size()
    if splits is None:
        if tensor.shape[0] % size:
            raise UsageError(
                f"alltoall without splits needs a first dimension divisible by {size} ranks "
                f"(got {tensor.shape[0]}); pass splits="
            )
        return [tensor.shape[0] // size] * size
    values = [int(s) for s in (splits.tolist() if torch.is_tensor(splits) else splits)]
    if len(values) != size or sum(values) != tensor.shape[0] or min(values) < 0:
        raise UsageError(
            f"alltoall splits={values} must give {size} counts >= 0 summing to the first "
            f"dimension {tensor.shape[0]}"
        )
    return values


def alltoall_raw(tensor: torch.Tensor, send: list[int]) -> tuple[torch.Tensor, list[int]]:
    negotiate("alltoall", dict)
    group = RUNTIME.group_for(tensor)
    sent = torch.tensor(send, dtype=torch.int64, device=tensor.device)
    received_t = torch.empty_like(sent)
    dist.all_to_all_single(received_t, sent, group=group)
    received = [int(v) for v in received_t.tolist()]
    out = tensor.new_empty((sum(received), *tensor.shape[1:]))
    dist.all_to_all_single(out, tensor.contiguous(), output_split_sizes=received,
                           input_split_sizes=send, group=group)  # fmt: skip
    return out, received


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, send: list[int]) -> Any:
        out, received = alltoall_raw(tensor.detach(), send)
        ctx.received = received
        ctx.mark_non_differentiable(counts := torch.tensor(received, dtype=torch.int32))
        return out, counts

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _counts: Any) -> tuple[torch.Tensor, None]:
        return alltoall_raw(grad.contiguous(), ctx.received)[0], None


def alltoall(
    tensor: torch.Tensor, splits: Sequence[int] | torch.Tensor | None = None,
    name: str | None = None, process_set: Any = global_process_set,
) -> Any:  # fmt: skip
    """Scatter rows to every rank and gather theirs. With `splits` (rows per destination rank)
    returns (output, received_splits), as Horovod does; without it the output alone."""
    refuse_process_set(process_set)
    out, counts = _Alltoall.apply(tensor, _splits(tensor, splits))  # type: ignore[no-untyped-call]
    return out if splits is None else (out, counts)


def _my_rows(total: int) -> tuple[int, int]:
    """Horovod's split of the first dimension: the first `total % size` ranks get one more row."""
    size, rank = _size(), _rank()
    base, extra = divmod(total, size)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, options: tuple[int, float, float]) -> Any:
        op, prescale, postscale = options
        ctx.options = options
        negotiate("allreduce", lambda: _describe_one(tensor, op))
        buffer = tensor.detach().clone().contiguous()
        reduced = launch_allreduce(buffer, op, prescale, postscale)[1]()
        start, length = _my_rows(tensor.shape[0])
        return reduced.narrow(0, start, length).clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        op, prescale, postscale = ctx.options
        gathered = allgather(grad.detach())
        scale = prescale * postscale / (_size() if op == ops.Average else 1)
        return gathered * scale, None


def reducescatter(
    tensor: torch.Tensor, name: str | None = None,
    compression: type[Compressor] = Compression.none, op: int = ops.Average,
    process_set: Any = global_process_set, prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:  # fmt: skip
    """Reduce over ranks, then keep this rank's block of rows."""
    refuse_process_set(process_set)
    op = ops.resolve(None, op)
    if op not in (ops.Average, ops.Sum):
        raise UsageError(f"reducescatter supports hvd.Average and hvd.Sum, not hvd.{ops.NAMES[op]}")
    compressed, state = compression.compress(tensor)
    options = (op, prescale_factor, postscale_factor)
    out = _Reducescatter.apply(compressed, options)  # type: ignore[no-untyped-call]
    return compression.decompress(out, state)


def barrier(process_set: Any = global_process_set) -> None:
    refuse_process_set(process_set)
    negotiate("barrier", dict)
    if _size() > 1:
        dist.barrier(group=RUNTIME.object_group())
