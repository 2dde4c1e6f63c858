"""`phalanx probe-data script.py [args]`: how fast the script's training data loads, alone.

Contract: the script is run as usual (`__main__`, its own argv) until it constructs
`phalanx.Trainer(...)`; that call is intercepted, so the model never trains. Its `train_data`,
`collate_fn` and config are kept and fed through the very loader the Trainer builds
(phalanx.train.feeding.train_loader: same sampler, collate and worker seeding), once per
setting of num_workers (0 .. this rank's CPUs) and pin_memory (on/off where a GPU exists).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.errors import UsageError


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


def measure(handle: Any, kwargs: dict[str, Any], workers: int, pin: bool, batches: int) -> Row:
    import torch

    from phalanx.train.feeding import train_loader

    config = kwargs.get("config") or handle.config
    data = dataclasses.replace(config.data, num_workers=workers, pin_memory=pin)
    config = dataclasses.replace(config, data=data)
    device = torch.device("cuda") if pin and torch.cuda.is_available() else torch.device("cpu")
    loader = train_loader(kwargs["train_data"], config=config, env=handle.env, device=device,
                          collate_fn=kwargs.get("collate_fn"), start=(0, 0))  # fmt: skip
    started = time.perf_counter()
    iterator = iter(loader)
    next(iterator)
    first = time.perf_counter() - started
    started, count = time.perf_counter(), 0
    for _ in range(batches):
        try:
            next(iterator)
        except StopIteration:
            break
        count += 1
    elapsed = time.perf_counter() - started
    del iterator
    return Row(workers, pin, count * data.batch_size / max(elapsed, 1e-9), first)


def sweep(script: str, args: list[str], *, max_workers: int | None, batches: int) -> str:
    import torch

    handle, kwargs = capture(script, args)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    top = min(cpus or 1, max_workers if max_workers is not None else cpus or 1)
    pins = (False, True) if torch.cuda.is_available() else (False,)
    rows = [measure(handle, kwargs, w, p, batches) for w in range(top + 1) for p in pins]
    config = kwargs.get("config") or handle.config
    return report(rows, config.data.batch_size)


def report(rows: list[Row], batch_size: int) -> str:
    best = max(rows, key=lambda r: r.samples_per_s)
    lines = [f"{'num_workers':>11} {'pin_memory':>10} {'samples/s':>10} {'first batch s':>13}"]
    for r in rows:
        mark = "  <- best" if r is best else ""
        lines.append(f"{r.num_workers:>11} {r.pin_memory!s:>10} {r.samples_per_s:>10.0f} "
                     f"{r.first_batch_s:>13.2f}{mark}")  # fmt: skip
    budget_ms = 1000.0 * batch_size / best.samples_per_s
    lines.append(
        f"recommended: data.num_workers={best.num_workers} data.pin_memory="
        f"{str(best.pin_memory).lower()}; a training step (batch {batch_size} per rank) must "
        f"take longer than {budget_ms:.1f} ms for data loading not to be the bottleneck"
    )
    return "\n".join(lines)
