"""The Horovod shim against the Trainer: the Horovod synthetic benchmark under `phalanx.horovod`
against the same model and batch trained by phalanx.Trainer with DDP (goal: within 5%).

    torchrun --standalone --nproc_per_node=2 benchmarks/horovod_vs_ddp.py [--reps 5]
        [--sides shim hand_ddp ddp] [--model resnet18|small] [--out PATH]
    torchrun --standalone --nproc_per_node=1 benchmarks/horovod_vs_ddp.py --smoke   # CPU

The sides run interleaved in the same processes: the shim (the example's loop with
hvd.DistributedOptimizer); a hand loop on torch's DDP (the baseline: what DDP itself costs); the
Trainer with per-rank BatchNorm statistics (Horovod's semantics, the goal's comparison). Each
trains --steps timed steps of one fixed batch per rank (SGD, as
examples/horovod/synthetic_benchmark.py); a repetition's time is the slowest rank's. Prints
img/s per GPU (median, spread, paired), wall and launching-thread CPU ms a step; writes JSON.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from models import classifier, synced, write_record
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import phalanx
import phalanx.horovod as hvd
from phalanx.config import load
from phalanx.horovod.runtime import RUNTIME
from phalanx.train.strategy import ddp_buffer_sync  # the keyword this torch has, no warning

RESULTS = Path(__file__).parent / "results"
ModelFactory = Callable[[], nn.Module]
SIDES = ("shim", "hand_ddp", "ddp")


class Batch:
    """One fixed batch per rank on the rank's device, as the synthetic benchmark uses."""

    def __init__(self, size: int, image: int, device: torch.device, rank: int) -> None:
        gen = torch.Generator().manual_seed(rank)
        self.data = torch.randn(size, 3, image, image, generator=gen).to(device)
        self.target = torch.randint(0, 1000, (size,), generator=gen).to(device)

    def loss(self, model: nn.Module) -> torch.Tensor:
        return F.cross_entropy(model(self.data), self.target)


Span = tuple[float, float]
"""(wall s, launching thread's CPU s) of a window: CPU near the wall time, the thread was busy."""


def clock() -> Span:
    usage = resource.getrusage(resource.RUSAGE_THREAD)  # this (the launching) thread alone
    return time.perf_counter(), usage.ru_utime + usage.ru_stime


def slowest(start: Span, end: Span) -> Span:
    """Each of the window's measures, the largest over ranks."""
    value = torch.tensor([b - a for a, b in zip(start, end, strict=True)], dtype=torch.float64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=RUNTIME.cpu_group)  # gloo: a CPU tensor
    wall, cpu = value.tolist()
    return wall, cpu


def run_shim(
    build: ModelFactory, batch: Batch, args: argparse.Namespace, device: torch.device
) -> Span:
    """Seconds for args.steps steps of the synthetic benchmark's loop under the shim."""
    torch.manual_seed(0)
    model = build().to(device)
    sgd = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    optimizer = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def step() -> None:
        optimizer.zero_grad()
        batch.loss(model).backward()  # type: ignore[no-untyped-call]
        optimizer.step()

    return timed(step, args, device)


def run_hand_ddp(
    build: ModelFactory, batch: Batch, args: argparse.Namespace, device: torch.device
) -> Span:
    """The same loop by hand on torch's DDP, buffers per rank: what DDP itself costs."""
    torch.manual_seed(0)
    ids = [device.index] if device.type == "cuda" else None
    model = DistributedDataParallel(
        build().to(device), device_ids=ids, gradient_as_bucket_view=True, **ddp_buffer_sync(False)
    )
    sgd = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())

    def step() -> None:
        sgd.zero_grad()
        batch.loss(model).backward()  # type: ignore[no-untyped-call]
        sgd.step()

    return timed(step, args, device)


def timed(step: Callable[[], None], args: argparse.Namespace, device: torch.device) -> Span:
    for _ in range(args.warmup):
        step()
    synced(device)
    start = clock()
    for _ in range(args.steps):
        step()
    synced(device)
    return slowest(start, clock())


class StepIndices(torch.utils.data.Dataset[int]):
    """Only indices: the Trainer's loader has nothing to copy, like the fixed batch above."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> int:
        return index


class Timer(phalanx.Callback[phalanx.Trainer]):
    """clock() after steps `at`, device synchronised (after that step's logging, if any)."""

    def __init__(self, device: torch.device, at: tuple[int, int]) -> None:
        self.device, self.at = device, at
        self.marks: dict[int, Span] = {}

    def on_step_end(self, trainer: phalanx.Trainer) -> None:
        if trainer.state.step in self.at:
            synced(self.device)
            self.marks[trainer.state.step] = clock()


def trainer_config(args: argparse.Namespace, run_root: str) -> phalanx.TrainerConfig:
    end = args.warmup + args.steps + 1  # one step after the window: its only logging point
    overrides = [
        "train.strategy=ddp", f"train.max_steps={end}", f"train.log_every={end}",
        f"data.batch_size={args.batch_size}",
        "data.num_workers=0", "data.shuffle=false", "train.progress=false",
        "checkpoint.at_end=false", "track.plots=false", "track.trackers=jsonl",
        # Horovod applies every update; so does `count` (skip/stop would mask non-finite ones,
        # which with the non-fused SGD here costs a host read per step: phalanx warns of it).
        "train.nan_policy=count",
        "train.ddp_broadcast_buffers=false", f"run.root={run_root}", "run.name=ddp",
        *args.overrides,
    ]  # fmt: skip
    return load(phalanx.TrainerConfig, overrides=overrides)


def run_ddp(
    d: phalanx.Dist, build: ModelFactory, batch: Batch, args: argparse.Namespace, run_root: str
) -> Span:
    """Seconds for args.steps steps of the same model and batch in phalanx.Trainer (DDP)."""
    torch.manual_seed(0)
    end = args.warmup + args.steps
    timer = Timer(d.device, (args.warmup, end))
    world = d.env.world_size
    trainer = phalanx.Trainer(
        d, config=trainer_config(args, run_root), model=build(),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.01 * world),
        train_data=StepIndices(args.batch_size * world * (end + 1)),
        train_step=lambda model, _indices: batch.loss(model), callbacks=[timer],
    )  # fmt: skip
    trainer.fit()
    return slowest(timer.marks[args.warmup], timer.marks[end])


def summary(spans: list[Span], args: argparse.Namespace) -> dict[str, Any]:
    per_gpu = [args.batch_size * args.steps / wall for wall, _ in spans]
    median = statistics.median(per_gpu)
    return {
        "img_per_s_per_gpu": [round(v, 1) for v in per_gpu],
        "median": round(median, 1),
        "spread_pct": round(100 * (max(per_gpu) - min(per_gpu)) / median, 1),
        "step_ms": round(1000 * statistics.median(w for w, _ in spans) / args.steps, 3),
        "cpu_ms_per_step": round(1000 * statistics.median(c for _, c in spans) / args.steps, 3),
    }


def report(results: dict[str, Any]) -> str:
    width = max(9, *(len(name) + 1 for name in results["sides"]))
    rows = [
        f"{'':{width}}{'median img/s/GPU':>18}{'spread':>9}{'ms/step':>9}{'CPU ms':>8}  per rep"
    ]
    for name in results["sides"]:
        r = results[name]
        reps = " ".join(f"{v:.0f}" for v in r["img_per_s_per_gpu"])
        rows.append(
            f"{name:{width}}{r['median']:>18.1f}{r['spread_pct']:>8.1f}%{r['step_ms']:>9.2f}"
            f"{r['cpu_ms_per_step']:>8.2f}  {reps}"
        )
    for key, (pct, pair) in results["comparisons"].items():
        goal = key == "shim vs ddp"
        verdict = (" (within 5%)" if abs(pct) <= 5 else " (NOT within 5%)") if goal else ""
        rows.append(f"{key}: {pct:+.1f}%{verdict}; paired by repetition {pair:+.1f}%")
    return "\n".join(rows)


def comparisons(sides: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """'a vs ddp' -> (ratio of medians - 1, ratio paired by repetition - 1), in percent."""
    out: dict[str, tuple[float, float]] = {}
    for name in ("shim", "hand_ddp"):
        if name in sides and "ddp" in sides:
            side, base = sides[name], sides["ddp"]
            pairs = zip(side["img_per_s_per_gpu"], base["img_per_s_per_gpu"], strict=True)
            out[f"{name} vs ddp"] = (
                round(100 * (side["median"] / base["median"] - 1), 1),
                round(100 * statistics.median(a / b - 1 for a, b in pairs), 1),
            )
    return out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="torchvision model or 'small'")
    parser.add_argument("--batch-size", type=int, default=32, help="images per rank and step")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps (a logging point)")
    parser.add_argument("--steps", type=int, default=100, help="timed steps, a multiple of warmup")
    parser.add_argument("--reps", type=int, default=5, help="repetitions of each side")
    parser.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    parser.add_argument("--smoke", action="store_true", help="tiny CPU run: 1 rep, small CNN")
    parser.add_argument("--out", default="", help="JSON path (default benchmarks/results/...)")
    parser.add_argument("overrides", nargs="*", help="train.x=y for both Trainer sides")
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.batch_size, args.warmup, args.steps, args.reps = "small", 4, 2, 4, 1
    if args.steps % args.warmup:
        parser.error("--steps must be a multiple of --warmup (the Trainer's logging points)")
    return args


def main() -> None:
    args = parse()
    with phalanx.distributed(phalanx.DistConfig()) as d:
        hvd.init()  # adopts the group phalanx made (and a gloo group for CPU tensors)
        name, build, image = classifier(args.model)
        batch = Batch(args.batch_size, image, d.device, d.env.rank)
        run_root = str(Path(tempfile.gettempdir()) / "phalanx-horovod-vs-ddp")  # not kept
        sides = list(dict.fromkeys(args.sides))
        spans: dict[str, list[Span]] = {side: [] for side in sides}
        for rep in range(args.reps):
            turn = rep % len(sides)
            for side in sides[turn:] + sides[:turn]:
                if side == "shim":
                    took = run_shim(build, batch, args, d.device)
                elif side == "hand_ddp":
                    took = run_hand_ddp(build, batch, args, d.device)
                else:
                    took = run_ddp(d, build, batch, args, run_root)
                spans[side].append(took)
        if d.env.is_main_process:
            write(args, name, d, {side: summary(s, args) for side, s in spans.items()})


def write(args: argparse.Namespace, model: str, d: phalanx.Dist, sides: dict[str, Any]) -> None:
    device = torch.cuda.get_device_name(d.device) if d.device.type == "cuda" else "cpu"
    results = {
        **sides, "model": model, "batch_per_rank": args.batch_size, "warmup": args.warmup,
        "steps": args.steps, "reps": args.reps, "world_size": d.env.world_size, "device": device,
        "trainer_overrides": args.overrides,
        "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
        "sides": list(sides), "comparisons": comparisons(sides),
    }  # fmt: skip
    print(report(results), flush=True)
    kind = "smoke" if args.smoke else f"{d.env.world_size}x{d.device.type}"
    write_record(Path(args.out) if args.out else RESULTS / f"horovod_vs_ddp-{kind}.json",
                 results, indent=2)  # fmt: skip


if __name__ == "__main__":
    main()
