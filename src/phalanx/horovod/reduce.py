"""allreduce in all its forms (sync, in place, async, grouped), synchronize and poll.

Average reduces as a sum and divides afterwards; integer tensors use floor division (Horovod's
rule for integral averages), never a silent cast to float.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from phalanx.errors import UsageError
from phalanx.horovod import ops
from phalanx.horovod.compression import Compression, Compressor
from phalanx.horovod.process_sets import global_process_set, refuse_process_set
from phalanx.horovod.protocol import dtype_name, negotiate
from phalanx.horovod.runtime import RUNTIME
from phalanx.horovod.unsupported import refuse


def _scale_(tensor: torch.Tensor, factor: float) -> None:
    if factor == 1.0:
        return
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        tensor.mul_(factor)
    else:
        tensor.copy_((tensor.double() * factor).to(tensor.dtype))


def launch_allreduce(
    tensor: torch.Tensor, op: int, prescale: float, postscale: float
) -> tuple[Any, Callable[[], torch.Tensor]]:
    """Start reducing `tensor` (contiguous, reduced in place); finish() applies the scaling."""
    assert tensor.is_contiguous()
    if tensor.is_sparse:
        refuse("sparse gradients")
    _scale_(tensor, prescale)
    size = RUNTIME.require().env.world_size
    work = None
    if size > 1:
        work = dist.all_reduce(
            tensor, op=ops.torch_op(op), group=RUNTIME.group_for(tensor), async_op=True
        )

    def finish() -> torch.Tensor:
        if work is not None:
            work.wait()
        if op == ops.Average and size > 1:
            if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
                tensor.div_(size)
            else:
                tensor.floor_divide_(size)
        _scale_(tensor, postscale)
        return tensor

    return work, finish


def describe(tensors: Sequence[torch.Tensor], op: int) -> dict[str, Any]:
    return {
        "tensors": [(tuple(t.shape), dtype_name(t)) for t in tensors],
        "op": op,
        "device": tensors[0].device.type if tensors else "cpu",
    }


def _grouped_async(
    tensors: Sequence[torch.Tensor], op: int, prescale: float, postscale: float
) -> int:
    """Reduce each tensor in place (contiguous ones; others through a copy), one handle."""
    negotiate("allreduce", lambda: describe(tensors, op))
    buffers = [t if t.is_contiguous() else t.contiguous() for t in tensors]
    launched = [launch_allreduce(b, op, prescale, postscale) for b in buffers]
    finishers = [f for _, f in launched]

    def finish() -> list[torch.Tensor]:
        results = []
        for target, finisher in zip(tensors, finishers, strict=True):
            out = finisher()
            if out is not target:
                target.copy_(out)
            results.append(target)
        return results

    return RUNTIME.add_pending([w for w, _ in launched if w is not None], finish)


def _options(average: bool | None, op: int | None, process_set: Any) -> int:
    refuse_process_set(process_set)
    return ops.resolve(average, op)


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
    op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> int:  # fmt: skip
    op = _options(average, op, process_set)
    return _grouped_async(list(tensors), op, prescale_factor, postscale_factor)


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
    op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> int:  # fmt: skip
    copies = [t.detach().clone() for t in tensors]
    return grouped_allreduce_async_(
        copies, average, name, op, prescale_factor, postscale_factor, process_set
    )


def allreduce_async_(
    tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
    op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> int:  # fmt: skip
    handle = grouped_allreduce_async_(
        [tensor], average, name, op, prescale_factor, postscale_factor, process_set
    )
    RUNTIME.pending[handle].finish = _first(RUNTIME.pending[handle].finish)
    return handle


def _first(finish: Callable[[], list[torch.Tensor]]) -> Callable[[], torch.Tensor]:
    return lambda: finish()[0]


def allreduce_async(
    tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
    op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> int:  # fmt: skip
    return allreduce_async_(
        tensor.detach().clone(), average, name, op, prescale_factor, postscale_factor, process_set
    )


def synchronize(handle: int) -> Any:
    """Wait for an async operation; returns its result (the output tensor or tensors)."""
    pending = RUNTIME.pending.pop(handle, None)
    if pending is None:
        raise UsageError(f"handle {handle!r} is unknown or was already synchronized")
    return pending.finish()


def poll(handle: int) -> bool:
    """True when synchronize(handle) would not wait."""
    pending = RUNTIME.pending.get(handle)
    if pending is None:
        raise UsageError(f"handle {handle!r} is unknown or was already synchronized")
    works = pending.work if isinstance(pending.work, list) else [pending.work]
    return all(work is None or bool(work.is_completed()) for work in works)


class _GroupedAllreduce(torch.autograd.Function):
    """Autograd through allreduce: the gradient is reduced with the same op and scaling."""

    @staticmethod
    def forward(ctx: Any, options: tuple[int, float, float], *tensors: torch.Tensor) -> Any:
        ctx.options = options
        copies = [t.detach().clone() for t in tensors]
        return tuple(synchronize(_grouped_async(copies, *options)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        copies = [g.detach().clone() for g in grads]
        return (None, *synchronize(_grouped_async(copies, *ctx.options)))


def grouped_allreduce(
    tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
    compression: type[Compressor] = Compression.none, op: int | None = None,
    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> list[torch.Tensor]:  # fmt: skip
    """Reduce several tensors at once; returns new tensors (autograd flows through)."""
    op = _options(average, op, process_set)
    packed = [compression.compress(t) for t in tensors]
    options = (op, prescale_factor, postscale_factor)
    reduced = _GroupedAllreduce.apply(options, *(p[0] for p in packed))  # type: ignore[no-untyped-call]
    return [compression.decompress(r, p[1]) for r, p in zip(reduced, packed, strict=True)]


def allreduce(
    tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
    compression: type[Compressor] = Compression.none, op: int | None = None,
    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> torch.Tensor:  # fmt: skip
    """A new tensor: `tensor` reduced over all ranks (Average by default)."""
    return grouped_allreduce(
        [tensor], average, name, compression, op, prescale_factor, postscale_factor, process_set
    )[0]


def allreduce_(
    tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
    op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> torch.Tensor:  # fmt: skip
    """Reduce `tensor` in place and return it."""
    return synchronize(  # type: ignore[no-any-return]
        allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set)
    )


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
    op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> list[torch.Tensor]:  # fmt: skip
    return synchronize(  # type: ignore[no-any-return]
        grouped_allreduce_async_(
            tensors, average, name, op, prescale_factor, postscale_factor, process_set
        )
    )
