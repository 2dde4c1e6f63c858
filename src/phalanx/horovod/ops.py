"""Reduction operators, numbered as Horovod numbers them, and their torch equivalents."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from phalanx.errors import UsageError
from phalanx.horovod.unsupported import refuse

Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5

NAMES = {
    Average: "Average",
    Sum: "Sum",
    Adasum: "Adasum",
    Min: "Min",
    Max: "Max",
    Product: "Product",
}


def resolve(average: bool | None, op: int | None) -> int:
    """Horovod's rule: `op` wins, the deprecated `average` flag picks Average/Sum, else Average."""
    if op is not None and average is not None:
        raise UsageError("pass either op= or the deprecated average=, not both")
    if op is None:
        op = Sum if average is False else Average
    if op == Adasum:
        refuse("Adasum")
    if op not in NAMES:
        raise UsageError(f"unknown reduction op {op!r}; valid: hvd.{', hvd.'.join(NAMES.values())}")
    return op


def torch_op(op: int) -> Any:
    """Average reduces as a sum; the division happens afterwards (gloo has no AVG)."""
    table = {
        Average: dist.ReduceOp.SUM,
        Sum: dist.ReduceOp.SUM,
        Min: dist.ReduceOp.MIN,
        Max: dist.ReduceOp.MAX,
        Product: dist.ReduceOp.PRODUCT,
    }
    return table[op]
