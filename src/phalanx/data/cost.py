"""What a batch costs to make in the training process, and when worker processes cost more.

A DataLoader worker's batch is not free to take: it reaches the training process through a
hand-over per tensor (torch's default sharing strategy sends each tensor's shared memory as a
file descriptor, a round trip with the worker), and with `pin_memory` torch's pinning thread does
that work beside the training loop. Measured (docs/benchmarks.md, issue #17): on a 2-core CPU the
training process spends 0.4-0.5 ms of CPU per token batch taken from a worker against 0.08 ms to
make it itself; on an H200 the launching thread of a compiled GPT-2 step blocked about 13 times a
step with 8 workers (each a chance to lose the CPU on a busy host) against once without workers.
For data that costs less than the hand-over, workers only add that cost: `cheap_data_hint` says so
once at the start, when the worker count was left to phalanx (`data.num_workers=-1`). It only
advises: which process makes the batches decides where their random augmentations are drawn, so
a choice by timing would make a run's data differ from machine to machine.
"""

from __future__ import annotations

import contextlib
import random
import sys
import time
from collections.abc import Callable, Iterator, Sized
from typing import Any

import torch
from torch.utils.data import Dataset, default_collate

HANDOVER_MS = 0.5
"""A batch cheaper than this to make costs the training process less made by itself than taken
from a worker (0.4-0.5 ms measured on this project's CPU, benchmarks/loader_take.py)."""

_SAMPLES = 4
"""Samples timed one by one; the fastest stands for all (the first may open files)."""

_BUDGET_S = 0.01
"""No further sample once this much time went into the estimate: costly samples (large volumes,
network reads) delay the start by one sample, not four, and are far from cheap anyway."""


def batch_cost_ms(
    dataset: Dataset[Any],
    *,
    batch_size: int,
    collate_fn: Callable[[list[Any]], Any] | None = None,
) -> float | None:
    """Estimated ms to make one batch of `batch_size` samples in this process (None for an empty
    data set): the fastest of a few samples (one when it alone takes over 10 ms) times
    `batch_size`, plus their collation (the faster of two) scaled the same way. Python's,
    numpy's and torch's CPU generators are restored afterwards, so the run's random streams are
    those it would draw without the estimate."""
    count = min(_SAMPLES, len(dataset)) if isinstance(dataset, Sized) else 0
    if count == 0:
        return None
    collate = collate_fn or default_collate
    with _rng_kept():
        times, samples = [], []
        for index in range(count):
            began = time.perf_counter()
            samples.append(dataset[index])
            times.append(time.perf_counter() - began)
            if sum(times) > _BUDGET_S:
                break
        collations = []
        for _ in range(2):  # the first may import or build what later ones reuse
            began = time.perf_counter()
            collate(samples)
            collations.append((time.perf_counter() - began) / len(samples))
    return (min(times) + min(collations)) * batch_size * 1e3


def cheap_data_hint(
    dataset: Dataset[Any],
    *,
    batch_size: int,
    workers: int,
    collate_fn: Callable[[list[Any]], Any] | None = None,
) -> str | None:
    """A one-line advice to load in the training process, when `workers` > 0 would each hand over
    batches that cost less than the hand-over to make; None otherwise, and when a sample cannot
    be made in this process."""
    if workers < 1:
        return None
    try:
        cost = batch_cost_ms(dataset, batch_size=batch_size, collate_fn=collate_fn)
    except Exception:  # advice must never stop a run: some data sets make samples only
        return None  # inside workers (get_worker_info), and the loader reports real errors
    if cost is None or cost >= HANDOVER_MS:
        return None
    return (
        f"data: a batch of {batch_size} takes ~{cost:.2f} ms to make in the training process, "
        f"less than taking one from a worker costs it (~{HANDOVER_MS} ms and a blocked training "
        f"thread; {workers} worker(s) started); set data.num_workers=0 to make batches here "
        "(`phalanx probe-data` measures both)"
    )


@contextlib.contextmanager
def _rng_kept() -> Iterator[None]:
    """Restores python's, numpy's (when imported) and torch's CPU generators on exit."""
    python, torch_state = random.getstate(), torch.get_rng_state()
    numpy = sys.modules.get("numpy")
    numpy_state = numpy.random.get_state() if numpy is not None else None
    try:
        yield
    finally:
        random.setstate(python)
        torch.set_rng_state(torch_state)
        if numpy is not None:
            numpy.random.set_state(numpy_state)
