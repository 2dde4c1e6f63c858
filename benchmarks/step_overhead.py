"""Step overhead: phalanx's Trainer against a hand-written loop, in one process, in alternating
windows (the goal: at most 1% slower).

    torchrun --standalone --nproc_per_node=1 benchmarks/step_overhead.py [--size gpt2|tiny]
        [--bf16] [--clip 1.0] [--compile] [--warmup 20] [--window 20] [--pairs 15] [--control]
        [--out PATH] [train.x=y ...]

The baseline, `hand_loop` below, is the plain PyTorch loop a user would write: GPT-2 small
(benchmarks/models.py), DDP when there are several ranks, AdamW, optional bf16 autocast, clipping
and torch.compile, random tokens made on the host. Both sides are built once; the Trainer trains
`--warmup + pairs * window + 1` steps and after each of its windows a callback runs one window
of the hand loop, so a host's drift moves both; the Trainer's step also makes the inputs and
targets contiguous on the device. `--control`: two hand loops in those places (the A/A control).
Prints each side's median step time (min..max), the overhead of the medians, the
median of the pairs' ratios and MFU (against 989 TFLOP/s at --size gpt2); writes JSON.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from models import GPT_SIZES, Tokens, gpt, gpt_mfu, hand_batches, lm_step, synced, write_record
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import phalanx
from phalanx.config import load


def make_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=3e-4, fused=True)


def trainer_config(args: argparse.Namespace) -> phalanx.TrainerConfig:
    """The Trainer's settings matching the hand loop's: batch, precision, clipping, compile."""
    overrides = [
        f"data.batch_size={GPT_SIZES[args.size][0]}", "train.progress=false",
        *(["train.precision=bf16"] if args.bf16 else []),
        *([f"train.clip_grad_norm={args.clip}"] if args.clip > 0 else []),
        *(["train.compile=true"] if args.compile else []), *args.overrides,
    ]  # fmt: skip
    return load(phalanx.TrainerConfig, overrides=overrides)


def hand_loop(args: argparse.Namespace, d: phalanx.Dist) -> Callable[[int], None]:
    """The hand-written baseline: a call trains n steps."""
    b, t, v, _, _, _ = GPT_SIZES[args.size]
    device = d.device
    torch.manual_seed(0)
    model: nn.Module = gpt(args.size).to(device)
    if d.env.world_size > 1:
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    if args.compile:
        model = torch.compile(model)  # type: ignore[assignment]
    opt = make_optimizer(model.parameters())
    data = hand_batches(b, t, v, device, d.env.rank)

    def steps(n: int) -> None:
        for _ in range(n):
            x, y = next(data)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
                loss = model(x, y)
            loss.backward()
            if args.clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()
            opt.zero_grad(set_to_none=True)

    return steps


class Alternate(phalanx.Callback):
    """After each window of the Trainer's steps, one window of the hand loop; both timed."""

    def __init__(self, args: argparse.Namespace, device: torch.device, hand: Any) -> None:
        self.args, self.device, self.hand = args, device, hand
        self.done = 0
        self.started = 0.0
        self.times: dict[str, list[float]] = {"hand": [], "trainer": []}

    def on_step_end(self, trainer: phalanx.Trainer) -> None:
        self.done += 1
        warmup, window = self.args.warmup, self.args.window
        past = self.done - warmup
        if past < 0 or past % window or past > window * self.args.pairs:
            return
        if past > 0:
            self.times["trainer"].append((synced(self.device) - self.started) * 1e3 / window)
            began = synced(self.device)
            self.hand(window)
            self.times["hand"].append((synced(self.device) - began) * 1e3 / window)
        self.started = synced(self.device)


def control(args: argparse.Namespace) -> None:
    """The A/A control: the hand loop against a second instance of itself in run()'s window
    order; the record keeps run()'s keys ("trainer_ms": the second instance's windows)."""
    cfg = trainer_config(args)
    with phalanx.distributed(cfg.dist) as d:
        first, second = hand_loop(args, d), hand_loop(args, d)
        first(args.warmup)
        second(args.warmup)
        times: dict[str, list[float]] = {"hand": [], "trainer": []}
        for _ in range(args.pairs):
            for side, steps in (("trainer", second), ("hand", first)):
                began = synced(d.device)
                steps(args.window)
                times[side].append((synced(d.device) - began) * 1e3 / args.window)
        if d.env.rank == 0:
            report(args, d, times)


def run(args: argparse.Namespace) -> None:
    # One step after the last window, with the run's only logging point (last: these win).
    steps = args.warmup + args.pairs * args.window + 1
    args.overrides = [*args.overrides, f"train.max_steps={steps}", f"train.log_every={steps}"]
    cfg = trainer_config(args)
    with phalanx.distributed(cfg.dist) as d:
        hand = hand_loop(args, d)
        hand(args.warmup)  # compiled and warm before the Trainer's first window
        b, t, v, _, _, _ = GPT_SIZES[args.size]
        alternate = Alternate(args, d.device, hand)
        torch.manual_seed(0)
        trainer = phalanx.Trainer(
            d, config=cfg, model=gpt(args.size),
            train_data=Tokens(v, t, b * d.env.world_size * (steps + 1)), train_step=lm_step,
            optimizer=make_optimizer, callbacks=[alternate],
        )  # fmt: skip
        trainer.fit()
        if d.env.rank == 0:
            report(args, d, alternate.times)


def report(args: argparse.Namespace, d: phalanx.Dist, times: dict[str, list[float]]) -> None:
    hand, ours = times["hand"], times["trainer"]
    h_med, t_med = statistics.median(hand), statistics.median(ours)
    paired = statistics.median(o / h - 1 for o, h in zip(ours, hand, strict=True))
    name = torch.cuda.get_device_name(d.device) if d.device.type == "cuda" else "cpu"
    world = d.env.world_size
    what = "A/A control" if args.control else "trainer against hand loop"
    print(f"{world} x {name}, torch {torch.__version__}, size {args.size}, compiled "
          f"{args.compile}, {len(hand)} pairs of {args.window}-step "
          f"windows, {what}")  # fmt: skip
    print(f"{'side':<11}{'median ms':>11}{'min..max':>17}{'MFU':>8}")
    ours_name = "hand (2nd)" if args.control else "trainer"
    for side, values, med in (("hand", hand, h_med), (ours_name, ours, t_med)):
        print(f"{side:<11}{med:>11.2f}{min(values):>9.2f}..{max(values):<6.2f}"
              f"{gpt_mfu(med, args.size):>8.1%}")  # fmt: skip
    verdict = "met" if t_med / h_med - 1 <= 0.01 else "missed"
    verdict = "A/A control, no goal" if args.control else f"goal ≤ 1%: {verdict}"
    print(f"overhead of the medians {t_med / h_med - 1:+.2%} ({verdict}); "
          f"median of the pairs' ratios {paired:+.2%}")  # fmt: skip
    out = args.out or Path("benchmarks/results") / f"step_overhead_{world}x{d.device.type}.json"
    record = {"device": name, "world": world, "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "args": vars(args) | {"out": str(out)},
              "hand_ms": hand, "trainer_ms": ours, "hand_median": h_med, "trainer_median": t_med,
              "overhead": t_med / h_med - 1, "paired": paired}  # fmt: skip
    write_record(out, record)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(GPT_SIZES), default="gpt2")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--clip", type=float, default=0.0, help="clip norm for both sides")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast on both sides")
    parser.add_argument("--compile", action="store_true", help="torch.compile both sides")
    parser.add_argument("--control", action="store_true", help="A/A: the hand loop twice")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("overrides", nargs="*", help="train.x=y for the Trainer only")
    args = parser.parse_args()
    if args.pairs < 7:
        parser.error("--pairs: the goal's rule needs at least 7 repetitions")
    if args.warmup < 1 or args.window < 1:
        parser.error("--warmup and --window: at least 1 step each")
    fixed = [o for o in args.overrides if o.split("=")[0] in ("train.max_steps", "train.log_every")]
    if fixed:
        parser.error(f"{fixed[0]}: set from --warmup, --pairs and --window; leave it out")
    if args.control and args.overrides:
        parser.error("--control runs no Trainer: leave out train.x=y overrides")
    (control if args.control else run)(args)


if __name__ == "__main__":
    main()
