"""DistributedOptimizer: the wrapped optimizer averages gradients over ranks before it steps.

Horovod matches reductions by tensor name, in any order; torch.distributed matches them by call
order. So every rank cuts its gradients into the same buckets, in the same fixed order (the
parameters' order, reversed: the order backward produces them), and starts a bucket only once
it and every bucket before it are ready. Backward overlaps with communication; the order never
depends on timing. Gradients of `backward_passes_per_step` passes are summed locally first.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from phalanx.errors import UsageError
from phalanx.horovod import ops
from phalanx.horovod.buckets import Bucket, plan_buckets
from phalanx.horovod.compression import Compression, Compressor
from phalanx.horovod.process_sets import global_process_set, refuse_process_set
from phalanx.horovod.runtime import RUNTIME
from phalanx.horovod.unsupported import refuse


class _DistributedOptimizer:
    """Methods put in front of the user's optimizer class (see DistributedOptimizer)."""

    _buckets: list[Bucket]
    _passes_left: dict[torch.Tensor, int]
    _bucket_of: dict[torch.Tensor, int]
    _waiting: list[int]
    """Per bucket: its parameters whose gradients are not complete yet (O(1) work per hook)."""
    _cursor: int
    _should_sync: bool
    _synchronized: bool
    _passes: int

    def _phalanx_local_step(self, closure: Callable[[], Any] | None = None) -> Any:
        """The wrapped optimizer's own step, without reducing gradients."""
        return super(self.__class__, self).step(closure)  # type: ignore[misc]

    def _hook(self, param: torch.Tensor) -> None:
        left = self._passes_left[param] - 1
        if left < 0:
            raise UsageError(
                f"backward() ran more than backward_passes_per_step={self._passes} times before "
                "optimizer.step(); raise backward_passes_per_step to accumulate more passes"
            )
        self._passes_left[param] = left
        if left == 0:
            self._waiting[self._bucket_of[param]] -= 1
        while self._cursor < len(self._buckets) and self._waiting[self._cursor] == 0:
            self._buckets[self._cursor].launch()
            self._cursor += 1

    def synchronize(self) -> None:
        """Reduce every gradient now (those not yet started go out in the agreed order)."""
        for bucket in self._buckets[self._cursor :]:
            for p in bucket.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            bucket.launch()
        for bucket in self._buckets:
            bucket.finish()
        self._reset()
        self._synchronized = True

    def _reset(self) -> None:
        self._cursor = 0
        self._passes_left = dict.fromkeys(self._passes_left, self._passes)
        self._waiting = [len(bucket.params) for bucket in self._buckets]

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """`with optimizer.skip_synchronize(): optimizer.step()` after an explicit synchronize()."""
        self._should_sync = False
        try:
            yield
        finally:
            self._should_sync = True

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        if self._should_sync:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() after optimizer.synchronize() without "
                    "optimizer.skip_synchronize(): gradients were not reduced again",
                    stacklevel=2,
                )
            else:
                self.synchronize()
        self._synchronized = False
        return self._phalanx_local_step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._cursor > 0 or any(v != self._passes for v in self._passes_left.values()):
            raise UsageError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(); call zero_grad() before backward()"
            )
        super(self.__class__, self).zero_grad(set_to_none)  # type: ignore[misc]


def _check_names(optimizer: torch.optim.Optimizer, named_parameters: Any) -> None:
    if named_parameters is None:
        return
    pairs = list(named_parameters)
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        duplicates = sorted({n for n in names if names.count(n) > 1})
        raise UsageError(f"named_parameters has duplicate names {duplicates}; names must be unique")
    named = {id(p) for _, p in pairs}
    unnamed = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in named]
    if unnamed:
        raise UsageError(
            f"{len(unnamed)} optimizer parameter(s) are missing from named_parameters; "
            "pass model.named_parameters() of the model the optimizer trains"
        )


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer, named_parameters: Any = None,
    compression: type[Compressor] = Compression.none, backward_passes_per_step: int = 1,
    op: int = ops.Average, gradient_predivide_factor: float = 1.0, num_groups: int = 0,
    groups: Any = None, sparse_as_dense: bool = False, process_set: Any = global_process_set,
) -> torch.optim.Optimizer:  # fmt: skip
    """The same optimizer (same class name, state and param groups) that reduces gradients
    over all ranks before each step. `num_groups`/`groups` only shape fusion, which is fixed
    here by HOROVOD_FUSION_THRESHOLD; they do not change results."""
    refuse_process_set(process_set)
    op = ops.resolve(None, op)
    if gradient_predivide_factor != 1.0 and op != ops.Average:
        raise UsageError("gradient_predivide_factor needs op=hvd.Average (the default)")
    if backward_passes_per_step < 1:
        raise UsageError(f"backward_passes_per_step={backward_passes_per_step} must be >= 1")
    _check_names(optimizer, named_parameters)
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    if any(p.is_sparse for p in params):
        refuse("sparse gradients")
    methods = {k: v for k, v in vars(_DistributedOptimizer).items()
               if k not in ("__dict__", "__weakref__")}  # fmt: skip
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), methods)
    wrapped: Any = object.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    scaling = (1.0 / gradient_predivide_factor, gradient_predivide_factor)
    wrapped._buckets = plan_buckets(
        params, RUNTIME.fusion_threshold_bytes, compression, op, scaling
    )
    wrapped._bucket_of = {p: i for i, b in enumerate(wrapped._buckets) for p in b.params}
    wrapped._passes = backward_passes_per_step
    wrapped._passes_left = dict.fromkeys(params, backward_passes_per_step)
    wrapped._reset()
    wrapped._should_sync, wrapped._synchronized = True, False
    for p in params:
        p.register_post_accumulate_grad_hook(wrapped._hook)
    return wrapped  # type: ignore[no-any-return]
