"""Which of the Trainer's per-step parts costs its gap to a hand DDP loop (issues #14, #17)?

    torchrun --standalone --nproc_per_node=2 benchmarks/trainer_ablation.py --reps 5   # GPUs
        [--variants no_feed ...]     # a subset: the hand loop and the Trainer always run
    torchrun --standalone --nproc_per_node=1 benchmarks/trainer_ablation.py --model linear \
        --batch-size 2 --warmup 50 --steps 1000 --reps 5                             # CPU

The same model, fixed batch and loop as `horovod_vs_ddp.py`'s `hand_ddp` and `ddp` sides (its
--model, --batch-size, --warmup and --steps), run as variants in the same processes, the order
rotating each repetition: the hand loop, the Trainer, and the Trainer with one of its parts
replaced by a no-op (`no_norm`: the gradient norm; `no_guard`: the NaN guard; `no_control`: the
ranks' control flags; `no_feed`: the device feed's copy and streams; `no_metrics`:
`metrics.add`), or all of them (`all`). A variant's step is no longer a correct training step
(nothing is checked, no norm logged): a measurement only; the parts are patched on the classes
in this process for the variant's run and restored after it.

Per variant, rank 0 prints the median over repetitions of the slowest rank's wall ms and
launching-thread CPU ms per step, and each against the hand loop and the full Trainer: what a
part costs is the full Trainer minus the variant without it. JSON goes to
benchmarks/results/trainer_ablation-<world>x<device>.json (or --out).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import horovod_vs_ddp as bench  # the same sides, models and timing
import torch
from horovod_models import model_factory

import phalanx
import phalanx.horovod as hvd
from phalanx.train.feeding import DeviceFeed
from phalanx.train.grad_norm import GradNorm
from phalanx.train.guard import NanGuard
from phalanx.train.loop_control import LoopControl
from phalanx.train.metrics import Metrics

PARTS = ("no_norm", "no_guard", "no_control", "no_feed", "no_metrics")
VARIANTS = ("hand_ddp", "ddp", *PARTS, "all")


@contextlib.contextmanager
def patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


def _plain_feed() -> list[tuple[Any, str, Any]]:
    """DeviceFeed without its copy, side stream and hand-over: the loader's batch as it is
    (the benchmark's batch is only step indices; its step uses a fixed tensor)."""

    def prefetch(self: DeviceFeed) -> None:
        self._ready = [next(self._it)]

    def take(self: DeviceFeed) -> list[Any]:
        if self._ready is None:
            prefetch(self)
        batches, self._ready = self._ready, None
        return batches or []

    return [(DeviceFeed, "prefetch", prefetch), (DeviceFeed, "take", take)]


def patches(part: str, device: torch.device) -> list[tuple[Any, str, Any]]:
    """(owner, attribute, no-op) for one part."""
    zero = torch.zeros((), device=device)
    table: dict[str, list[tuple[Any, str, Any]]] = {
        "no_norm": [(GradNorm, "__call__", lambda self, grads, **kw: (zero, False))],
        "no_guard": [
            (NanGuard, "observe_loss", lambda self, loss, carry=False: loss),
            (NanGuard, "agree", lambda self, *a, **kw: zero),
        ],
        "no_control": [
            (LoopControl, "post", lambda self: None),
            (LoopControl, "read", lambda self: None),
        ],
        "no_feed": _plain_feed(),
        "no_metrics": [(Metrics, "add", lambda self, *a, **kw: None)],
    }
    return table[part]


def variant(name: str, device: torch.device) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    for part in PARTS if name == "all" else (name,) if name in PARTS else ():
        for owner, attr, value in patches(part, device):
            stack.enter_context(patched(owner, attr, value))
    return stack


def run(name: str, d: phalanx.Dist, parts: tuple[Any, ...], args: argparse.Namespace) -> Any:
    build, batch, run_root = parts
    if name == "hand_ddp":
        return bench.run_hand_ddp(build, batch, args, d.device)
    with variant(name, d.device):
        return bench.run_ddp(d, build, batch, args, run_root, "ddp")


def summarise(spans: dict[str, list[Any]], steps: int) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, runs in spans.items():
        wall = [1e3 * w / steps for w, _, _ in runs]
        cpu = [1e3 * c / steps for _, c, _ in runs]
        out[name] = {"wall_ms": wall, "cpu_ms": cpu, "wall_median": statistics.median(wall),
                     "cpu_median": statistics.median(cpu)}  # fmt: skip
    return out


def report(results: dict[str, dict[str, Any]], header: str) -> str:
    hand, full = results["hand_ddp"], results["ddp"]
    rows = [header, f"{'variant':12}{'wall ms':>9}{'vs hand':>9}{'vs Trainer':>11}"
            f"{'CPU ms':>9}{'vs hand':>9}{'vs Trainer':>11}  CPU ms per repetition"]  # fmt: skip
    for name, r in results.items():
        w, c = r["wall_median"], r["cpu_median"]
        reps = " ".join(f"{v:.3f}" for v in r["cpu_ms"])
        rows.append(
            f"{name:12}{w:9.3f}{w - hand['wall_median']:+9.3f}{w - full['wall_median']:+11.3f}"
            f"{c:9.3f}{c - hand['cpu_median']:+9.3f}{c - full['cpu_median']:+11.3f}  {reps}"
        )
    return "\n".join(rows)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="torchvision model, 'small' or 'linear'")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=100, help="a multiple of --warmup")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default="")
    parser.add_argument(
        "--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
        help="a subset (more repetitions in the same time); hand_ddp and ddp always run",
    )  # fmt: skip
    args = parser.parse_args()
    args.variants = [v for v in VARIANTS if v in {"hand_ddp", "ddp", *args.variants}]
    if args.steps % args.warmup:
        parser.error("--steps must be a multiple of --warmup (the Trainer's logging points)")
    args.overrides = []  # what horovod_vs_ddp's Trainer side reads
    return args


def main() -> None:
    args = parse()
    with phalanx.distributed(phalanx.DistConfig()) as d:
        hvd.init()  # horovod_vs_ddp's timing all-reduce uses the shim's CPU group
        name, build, image = model_factory(args.model)
        batch = bench.Batch(args.batch_size, image, d.device, d.env.rank)
        parts = (build, batch, str(Path(tempfile.gettempdir()) / "phalanx-trainer-ablation"))
        chosen: list[str] = args.variants
        spans: dict[str, list[Any]] = {v: [] for v in chosen}
        for rep in range(args.reps):
            turn = rep % len(chosen)
            for v in chosen[turn:] + chosen[:turn]:
                spans[v].append(run(v, d, parts, args))
        if d.env.is_main_process:
            write(args, name, d, summarise(spans, args.steps))


def write(args: argparse.Namespace, model: str, d: phalanx.Dist, results: dict[str, Any]) -> None:
    device = torch.cuda.get_device_name(d.device) if d.device.type == "cuda" else "cpu"
    world = d.env.world_size
    header = (f"model {model}, batch {args.batch_size}/rank, {args.steps} timed steps, "
              f"{args.reps} reps, {world} x {device}; medians of the slowest rank")  # fmt: skip
    print(report(results, header), flush=True)
    out = (
        Path(args.out)
        if args.out
        else bench.RESULTS / f"trainer_ablation-{world}x{d.device.type}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"model": model, "batch_per_rank": args.batch_size, "steps": args.steps,
            "reps": args.reps, "world_size": world, "device": device, "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d")}  # fmt: skip
    out.write_text(json.dumps({**meta, "variants": results}, indent=2) + "\n")
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
