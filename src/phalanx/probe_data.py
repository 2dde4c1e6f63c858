"""`phalanx probe-data script.py [args]`: how fast the script's training data loads, alone.

Contract: the script is run as usual (`__main__`, its own argv) until it constructs
`phalanx.Trainer(...)`; that call is intercepted, so the model never trains. Its `train_data`,
`collate_fn` and config are kept and fed through the very loader the Trainer builds
(phalanx.train.feeding.train_loader: same sampler, collate and worker seeding), once per
setting of num_workers (0 .. this rank's CPUs) and pin_memory (on/off where a GPU exists).

Two costs per setting: how fast batches arrive (samples/s), and how much CPU time the training
process itself spends per batch (all its threads, workers excluded). The second is what the
thread launching the GPU's kernels shares its process with: a batch taken from a worker costs
unpickling, the shared memory's file descriptor and mapping, and under pin_memory a thread of
its own (docs/results.md: ~0.3 ms more for a batch that costs nothing to make).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.errors import UsageError

_END = object()  # next()'s default: the loader gave no batch
CPU_TIE = 0.1
"""Process CPU times within this fraction of each other are one cost to the recommendation."""


class _Captured(Exception):
    def __init__(self, handle: Any, kwargs: dict[str, Any]) -> None:
        super().__init__("phalanx probe-data stopped the script at phalanx.Trainer(...)")
        self.handle, self.kwargs = handle, kwargs


def _intercept(handle: Any, **kwargs: Any) -> Any:
    raise _Captured(handle, kwargs)


def capture(script: str, args: list[str]) -> tuple[Any, dict[str, Any]]:
    """Run `script` until it builds its Trainer; return (Dist handle, Trainer keyword args)."""
    import phalanx.train

    saved_argv, saved_trainer = sys.argv, phalanx.train.Trainer
    sys.argv = [script, *args]
    module: Any = phalanx.train  # the class is replaced for this run only
    module.Trainer = _intercept
    # The script becomes __main__ for real: its data set classes pickle by reference, and
    # loader workers re-import it (as __mp_main__) the way they do in a training run.
    main = types.ModuleType("__main__")
    main.__file__ = os.path.abspath(script)
    sys.modules["__main__"] = main
    try:
        code = compile(Path(script).read_text(), main.__file__, "exec")
        exec(code, main.__dict__)
    except _Captured as captured:
        return captured.handle, captured.kwargs
    finally:
        sys.argv = saved_argv
        module.Trainer = saved_trainer
    raise UsageError(f"{script} finished without constructing phalanx.Trainer(...); "
                     "probe-data measures the train_data a Trainer is given")  # fmt: skip


@dataclass(frozen=True)
class Row:
    num_workers: int
    pin_memory: bool
    samples_per_s: float
    first_batch_s: float
    process_cpu_ms: float
    """The training process's CPU time per timed batch, all its threads (workers excluded)."""

    def batch_ms(self, batch_size: int) -> float:
        """Wall ms per batch at the measured rate: the shortest step this setting keeps up with."""
        return 1000.0 * batch_size / max(self.samples_per_s, 1e-9)


def measure(handle: Any, kwargs: dict[str, Any], workers: int, pin: bool, batches: int) -> Row:
    import torch

    from phalanx.train.feeding import train_loader
    from phalanx.train.step import batch_size_of

    config = kwargs.get("config") or handle.config
    data = dataclasses.replace(config.data, num_workers=workers, pin_memory=pin)
    config = dataclasses.replace(config, data=data)
    device = torch.device("cuda") if pin and torch.cuda.is_available() else torch.device("cpu")
    loader = train_loader(kwargs["train_data"], config=config, env=handle.env, device=device,
                          collate_fn=kwargs.get("collate_fn"), start=(0, 0))  # fmt: skip
    started = time.perf_counter()
    iterator = iter(loader)
    if next(iterator, _END) is _END:
        raise UsageError("the script's train_data gives this rank no batch: nothing to time")
    first = time.perf_counter() - started
    started, cpu, samples, count = time.perf_counter(), time.process_time(), 0, 0
    for batch in itertools.islice(iterator, batches):
        samples, count = samples + batch_size_of(batch), count + 1  # a short last batch too
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    del iterator
    if count == 0:
        raise UsageError(
            f"the script's train_data holds one batch per rank (data.batch_size="
            f"{data.batch_size}): none left to time after the first; probe a larger data set"
        )
    return Row(workers, pin, samples / max(elapsed, 1e-9), first, 1000.0 * cpu / count)


def sweep(
    script: str, args: list[str], *, max_workers: int | None, batches: int,
    step_ms: float | None = None,
) -> str:  # fmt: skip
    import torch

    handle, kwargs = capture(script, args)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    top = min(cpus or 1, max_workers if max_workers is not None else cpus or 1)
    pins = (False, True) if torch.cuda.is_available() else (False,)
    rows = [measure(handle, kwargs, w, p, batches) for w in range(top + 1) for p in pins]
    config = kwargs.get("config") or handle.config
    return report(rows, config.data.batch_size, step_ms=step_ms)


def report(rows: list[Row], batch_size: int, *, step_ms: float | None = None) -> str:
    """The table and a recommendation: the fastest setting, or with `step_ms` (the training
    step's time) the one lightest on the training process among those that keep up with it."""
    best = max(rows, key=lambda r: r.samples_per_s)
    lines = [f"{'num_workers':>11} {'pin_memory':>10} {'samples/s':>10} {'first batch s':>13} "
             f"{'process CPU ms/batch':>20}"]  # fmt: skip
    for r in rows:
        mark = "  <- fastest" if r is best else ""
        lines.append(f"{r.num_workers:>11} {r.pin_memory!s:>10} {r.samples_per_s:>10.0f} "
                     f"{r.first_batch_s:>13.2f} {r.process_cpu_ms:>20.2f}{mark}")  # fmt: skip
    if step_ms is not None:
        fits = [r for r in rows if r.batch_ms(batch_size) <= step_ms]
        pick = _lightest(fits) if fits else best
        why = (
            f"the lightest on the training process ({pick.process_cpu_ms:.2f} ms of its CPU "
            f"a batch) of those that load a batch within the {step_ms:g} ms step (it takes "
            f"{pick.batch_ms(batch_size):.1f} ms with the loader alone; training shares the CPUs)"
            if fits
            else f"no setting loads a batch within the {step_ms:g} ms step; the fastest"
        )
        lines.append(f"recommended: {_setting(pick)}: {why}")
        return "\n".join(lines)
    lines.append(
        f"recommended: {_setting(best)}; a training step (batch {batch_size} per rank) must "
        f"take longer than {best.batch_ms(batch_size):.1f} ms for data loading not to be the "
        "bottleneck"
    )
    light = _lightest(rows)
    if light.process_cpu_ms < (1 - CPU_TIE) * best.process_cpu_ms:
        lines.append(
            f"lightest on the training process: {_setting(light)} ({light.process_cpu_ms:.2f} "
            f"against {best.process_cpu_ms:.2f} ms of its CPU a batch), enough for steps longer "
            f"than {light.batch_ms(batch_size):.1f} ms; --step-ms MS picks for your step time"
        )
    return "\n".join(lines)


def _lightest(rows: list[Row]) -> Row:
    """The row costing the training process least CPU; rows within CPU_TIE of it count as equal
    (timing noise), and of those the one with the fewest workers (less memory) wins."""
    low = min(r.process_cpu_ms for r in rows)
    equal = [r for r in rows if r.process_cpu_ms <= (1 + CPU_TIE) * low]
    return min(equal, key=lambda r: (r.num_workers, r.pin_memory))


def _setting(row: Row) -> str:
    return f"data.num_workers={row.num_workers} data.pin_memory={str(row.pin_memory).lower()}"
