"""What a batch costs to make, and advice when worker processes cost the training process more.

A DataLoader worker's batch is not free to take: it reaches the training process through a
hand-over per tensor (torch's default sharing strategy sends each tensor's shared memory as a
file descriptor, a round trip with the worker), and with `pin_memory` torch's pinning thread does
that work beside the training loop. Measured (docs/results.md, issue #17): on a 2-core CPU the
training process spends 0.4-0.5 ms of CPU per token batch taken from a worker against 0.08 ms to
make it itself; on an H200 the thread launching a GPT-2 step blocked 12.7-15 times a step with 8
workers (each block a chance to lose the CPU on a busy host) against once without workers.

`CostAdvice` times a few samples in a child process started like the loader's workers (it gets
the data set the way they do, so nothing in the training process is touched: no file opened on
first use, no random stream moved) and logs one line when a batch costs less than the hand-over.
It only advises: which process makes the batches decides where their random augmentations are
drawn, so a choice by timing would make a run's data differ from machine to machine.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable, Sized
from multiprocessing.connection import Connection
from typing import Any

from torch.utils.data import DataLoader, Dataset, default_collate

HANDOVER_MS = 0.5
"""A batch cheaper than this to make costs the training process less made by itself than taken
from a worker (0.4-0.5 ms measured on a 2-core CPU, docs/results.md)."""

_SAMPLES = 4
"""Samples timed one by one; the fastest stands for all (the first may open files)."""

_BUDGET_S = 0.01
"""No further sample once the samples after the first took this long: costly samples (large
volumes, network reads) are far from cheap, and the estimate ends after two of them."""

_WAIT_S = 60.0
"""How long the advice waits for its child's answer before giving up (no advice)."""


def batch_cost_ms(
    dataset: Dataset[Any],
    *,
    batch_size: int,
    collate_fn: Callable[[list[Any]], Any] | None = None,
) -> float | None:
    """Estimated ms to make one batch of `batch_size` samples in this process (None for an empty
    or unsized data set): the fastest of a few samples times `batch_size`, plus their collation
    (the faster of two) scaled the same way. It reads samples, so it changes what reading
    changes (random streams, files opened on first use): `CostAdvice` runs it in a child."""
    count = min(_SAMPLES, len(dataset)) if isinstance(dataset, Sized) else 0
    if count == 0:
        return None
    collate = collate_fn or default_collate
    times, samples = [], []
    for index in range(count):
        began = time.perf_counter()
        samples.append(dataset[index])
        times.append(time.perf_counter() - began)
        if sum(times[1:]) > _BUDGET_S:
            break
    collations = []
    for _ in range(2):  # the first may import or build what later ones reuse
        began = time.perf_counter()
        collate(samples)
        collations.append((time.perf_counter() - began) / len(samples))
    return (min(times) + min(collations)) * batch_size * 1e3


def cheap_data_hint(cost_ms: float | None, *, batch_size: int, workers: int) -> str | None:
    """The one-line advice to load in the training process, or None when `workers` is 0 or a
    batch costs at least the hand-over (or could not be timed)."""
    if workers < 1 or cost_ms is None or cost_ms >= HANDOVER_MS:
        return None
    return (
        f"data: a batch of {batch_size} takes ~{cost_ms:.2f} ms to make, less than taking one "
        f"from a worker costs the training process (~{HANDOVER_MS} ms and a blocked training "
        f"thread; {workers} worker(s) started); set data.num_workers=0 to make batches in it "
        "(`phalanx probe-data` measures both)"
    )


def _time_in_child(
    dataset: Dataset[Any], batch_size: int, collate_fn: Callable[[list[Any]], Any], out: Connection
) -> None:
    # Signals keep their default action (unlike in the loader's workers): a SLURM signal or
    # multiprocessing's exit-time terminate may end this child, which costs only the advice.
    try:
        cost = batch_cost_ms(dataset, batch_size=batch_size, collate_fn=collate_fn)
    except Exception:  # a data set may make samples only inside workers (get_worker_info)
        cost = None
    out.send(cost)
    out.close()


class CostAdvice:
    """Times `loader`'s samples in a child process started by the loader's own start method and
    logs `cheap_data_hint` through `advise` from a background thread when the answer comes (the
    training goes on meanwhile). `close()` waits up to `wait_s` for a pending answer, then ends
    the child."""

    def __init__(self, loader: DataLoader[Any], advise: Callable[[str], None]) -> None:
        assert loader.batch_size is not None and loader.num_workers > 0, "a worker loader"
        context = loader.multiprocessing_context or multiprocessing.get_context()
        answers, out = context.Pipe(duplex=False)
        self._child = context.Process(
            target=_time_in_child, name="phalanx-data-cost", daemon=True,
            args=(loader.dataset, loader.batch_size, loader.collate_fn, out),
        )  # fmt: skip
        self._child.start()
        out.close()
        hint = dict(batch_size=loader.batch_size, workers=loader.num_workers)
        self._thread = threading.Thread(
            target=self._wait, args=(answers, hint, advise), name="phalanx-data-cost", daemon=True
        )
        self._thread.start()

    @staticmethod
    def _wait(answers: Connection, hint: dict[str, int], advise: Callable[[str], None]) -> None:
        try:
            cost = answers.recv() if answers.poll(_WAIT_S) else None
        except (EOFError, OSError):  # the child died (a signal, an import error in it)
            cost = None
        finally:
            answers.close()
        line = cheap_data_hint(cost, **hint)
        if line:
            advise(line)

    def close(self, wait_s: float = 10.0) -> None:
        self._thread.join(wait_s)
        if self._child.is_alive():
            self._child.kill()
        self._child.join()
