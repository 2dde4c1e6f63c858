"""Sync vs async checkpoint saves on one device: how long training is blocked, and how much
slower the steps run while the background write goes on.

    python benchmarks/checkpoint.py [--size-mb 300] [--reps 5] [--device cpu|cuda] [--batch 32]
        [--writers thread process] [--dir FOLDER] [--out PATH]

One process trains an MLP with about `--size-mb` of state. Per repetition, interleaved: a
synchronous `save_sharded(...).wait()` (the baseline), and per async writer the time `save`
blocks plus the slowdown of the steps during the write; ratio = that cost / the sync save's.
Goal: on a GPU with >= 1 GB of state, ratio <= 10% (on CPU the writer competes for the cores).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from models import machine, spread, state_bytes, write_record
from torch import nn

from phalanx.checkpoint.async_saver import AsyncSaver
from phalanx.checkpoint.sharded import save_sharded
from phalanx.dist import DistConfig, init_group, shutdown

GOAL = 0.10
MIB = 1 << 20


def build(size_mb: float, width: int, device: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    """An MLP of `width`-wide layers; parameters + 2 AdamW moments ~ size_mb (fp32)."""
    per_layer = (width * width + width) * 4 * 3
    layers = max(1, math.ceil(size_mb * MIB / per_layer))
    blocks = [m for _ in range(layers) for m in (nn.Linear(width, width), nn.Tanh())]
    model = nn.Sequential(*blocks).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, optimizer


def make_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, width: int, batch_size: int, device: str
) -> Callable[[], float]:
    """One training step; returns its wall time (synchronised on CUDA)."""
    batch = torch.randn(batch_size, width, device=device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def step() -> float:
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        model(batch).pow(2).mean().backward()
        optimizer.step()
        sync()
        return time.perf_counter() - start

    return step


def async_save(
    saver: AsyncSaver, state: dict[str, Any], folder: Path, step: Callable[[], float],
    baseline: float, max_steps: int, name: str,
) -> dict[str, float]:  # fmt: skip
    start = time.perf_counter()
    handle = saver.save(folder, state)
    blocked = time.perf_counter() - start
    during: list[float] = []
    while not handle.done() and len(during) < max_steps:
        during.append(step())
    start = time.perf_counter()
    saver.wait()
    blocked += time.perf_counter() - start
    slowdown = sum(t - baseline for t in during)
    out = {"blocked_s": blocked, "slowdown_s": slowdown, "cost_s": blocked + slowdown}
    out["steps_during_write"] = float(len(during))
    return {f"{name}_{key}": value for key, value in out.items()}


def one_rep(
    rep: int, state: dict[str, Any], savers: dict[str, AsyncSaver], step: Callable[[], float],
    scratch: Path, args: argparse.Namespace,
) -> dict[str, float]:  # fmt: skip
    baseline = statistics.median(step() for _ in range(args.baseline_steps))
    sample: dict[str, float] = {"rep": float(rep), "baseline_step_s": baseline}
    modes = ["sync", *savers]
    order = modes[rep % len(modes) :] + modes[: rep % len(modes)]  # each goes first in turn
    for mode in order:
        folder = scratch / f"rep-{rep}-{mode}"
        if mode == "sync":
            start = time.perf_counter()
            save_sharded(folder, state).wait()
            sample["sync_blocked_s"] = time.perf_counter() - start
        else:
            saver = savers[mode]
            sample |= async_save(saver, state, folder, step, baseline, args.max_steps, mode)
        shutil.rmtree(folder)  # keeps disk use at one checkpoint; not timed
    for name in savers:
        sample[f"{name}_ratio"] = sample[f"{name}_cost_s"] / sample["sync_blocked_s"]
    return sample


def report(table: dict[str, dict[str, float]], meta: dict[str, Any]) -> None:
    print(f"\nstate {meta['state_mb']:.0f} MB on {meta['device']}, batch {meta['batch']}, "
          f"writers {'/'.join(meta['writers'])}, {meta['reps']} repetitions")  # fmt: skip
    print(f"{'metric':<28}{'median':>10}{'min..max':>22}{'stdev':>10}")
    for key, row in table.items():
        print(f"{key:<28}{row['median']:>10.4f}{row['min']:>10.4f}..{row['max']:<10.4f}"
              f"{row['stdev']:>10.4f}")  # fmt: skip
    where = "" if meta["goal_applies"] else " (goal applies on GPU with >= 1 GB of state only)"
    for name, met in meta["goal_met"].items():
        ratio = table[f"{name}_ratio"]["median"]
        verdict = "OK" if met else "MISSED"
        print(f"{name} writer: async cost / sync save = {ratio:.1%}: {verdict}{where}")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=300.0, help="model + optimizer state")
    parser.add_argument("--width", type=int, default=1024, help="width of the MLP layers")
    parser.add_argument("--reps", type=int, default=5, help="repetitions (5 or more to publish)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    # 32 rows keep a GPU step launch-bound (the CPU busy: the worst case for a writer thread);
    # thousands make it compute-bound, like most training.
    parser.add_argument("--batch", type=int, default=32, help="rows per step")
    writers = ["thread", "process"]  # compared, interleaved with the sync save in each repetition
    parser.add_argument("--writers", nargs="+", choices=writers, default=writers)
    parser.add_argument("--baseline-steps", type=int, default=5)
    parser.add_argument("--max-steps", type=int, default=500, help="steps per async write")
    parser.add_argument("--dir", type=Path, default=None, help="where checkpoints are written")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/checkpoint.json"))
    return parser.parse_args()


def main() -> None:
    args = parse()
    if args.device == "cpu":
        torch.set_num_threads(1)  # leaves a core to the writer
    init_group(DistConfig(launcher="local", setup_logging=False))
    model, optimizer = build(args.size_mb, args.width, args.device)
    step = make_step(model, optimizer, args.width, args.batch, args.device)
    step()  # materialises the AdamW moments: the state has its full size from here on
    state = {"model": model, "optimizer": optimizer}
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="phalanx-ckpt-bench-", dir=args.dir))
    samples = []
    first: dict[str, float] = {}
    try:
        savers = {name: AsyncSaver(writer=name) for name in args.writers}
        for name, saver in savers.items():
            # The first save allocates (and pins) the saver's CPU copy and, for the process
            # writer, starts the process: reported, but kept out of the repetitions.
            folder = scratch / f"first-{name}"
            first |= async_save(saver, state, folder, step, step(), args.max_steps, name)
            shutil.rmtree(folder)
        print(json.dumps({"first_save": first}), flush=True)
        for rep in range(args.reps):  # 5 or more for a published number
            samples.append(one_rep(rep, state, savers, step, scratch, args))
            print(json.dumps(samples[-1]), flush=True)
        for saver in savers.values():
            saver.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutdown()
    table = {key: spread(s[key] for s in samples) for key in samples[0] if key != "rep"}
    size = state_bytes(optimizer)
    applies = args.device.startswith("cuda") and size >= 1 << 30
    meta = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), **machine(),
        "device": args.device, "threads": torch.get_num_threads(), "batch": args.batch,
        "writers": args.writers, "width": args.width, "state_mb": size / MIB,
        "checkpoint_dir": str(scratch.parent), "reps": len(samples),
        "goal": f"async blocked + slowdown <= {GOAL:.0%} of a sync save", "goal_applies": applies,
        "goal_met": {w: table[f"{w}_ratio"]["median"] <= GOAL for w in args.writers},
        "first_save": first,
    }  # fmt: skip
    report(table, meta)
    write_record(args.out, {**meta, "table": table, "samples": samples}, indent=2)


if __name__ == "__main__":
    main()
