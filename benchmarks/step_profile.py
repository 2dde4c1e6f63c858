"""What phalanx.Trainer's step adds over a hand-written DDP loop, counted per step (issue #17).

    python benchmarks/step_profile.py [--nproc 2] [--warmup 20] [--window 50] [--reps 3]
        [--size tiny|gpt2] [--opt fused|foreach] [--clip 0] [--bf16]
        [--compile [--compile-mode MODE]] [--out PATH] [train.x=y ...]

Launches itself under torchrun (gloo CPU ranks, or one GPU per rank where CUDA is present) and,
per repetition, runs a small GPT-like model (a) as a hand-written DDP loop (the reference
peer_step.py's loop: synthetic batches, .to(device, non_blocking), forward, backward, optimizer
step, zero_grad) and (b) through phalanx.Trainer with default settings (extra `train.x=y`
overrides go to the Trainer only). `--compile` compiles both sides with the same
torch.compile mode: the hand loop's DDP-wrapped model, the Trainer through `train.compile=true`
and `train.compile_mode`. Each side runs twice:

- a timing pass without the profiler: per-step wall time over `--window` steady-state steps, split
  into forward, backward, optimizer.step (the model's work) and the rest (the loop's own time),
  the rest split further by thin perf_counter wrappers around the Trainer's parts (patched on the
  instances in this process only; phalanx's code is unchanged);
- a profiled pass (torch.profiler, CPU + CUDA activities, shapes and Python stacks) over the same
  window: aten ops (all and top-level), device kernels, collectives (count and bytes), host-device
  syncs (aten::item / _local_scalar_dense / is_nonzero, CUDA synchronize calls and, on CUDA, the
  warnings of torch.cuda.set_sync_debug_mode('warn')), each averaged per step; and the ops the
  Trainer has more of than the hand loop, with the phalanx function each one comes from.

The window covers `--window` consecutive steps; with the Trainer's default log_every=50 and
window=50 it holds exactly one logging point, so per-step numbers include logging amortised.
Prints a table (rank 0) and writes JSON to benchmarks/results/step_profile_<device>.json.
Profiled wall times are inflated by the Python tracer: use the timing pass for time.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from step_profile_analysis import MODEL_PARTS, analyse, report
from step_profile_model import GPT, SIZES, RandomTokens, batches
from torch import nn


class Clock:
    """Wall and thread-CPU seconds per named part, counted only while `on` (the window). With
    `annotate`, each wrapped call is also a profiler range named phx::<part>."""

    def __init__(self, annotate: bool = False) -> None:
        self.on, self.annotate = False, annotate
        self.parts: dict[str, float] = collections.defaultdict(float)
        self.cpu: dict[str, float] = collections.defaultdict(float)
        self.marks: list[tuple[float, float]] = []

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.annotate:
                with torch.profiler.record_function(f"phx::{name}"):
                    return fn(*args, **kwargs)
            if not self.on:
                return fn(*args, **kwargs)
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.parts[name] += time.perf_counter() - start
                self.cpu[name] += time.thread_time() - cpu

        return timed

    def watch_optimizer(self, opt: torch.optim.Optimizer) -> None:
        began: list[tuple[float, float]] = []
        opt.register_step_pre_hook(
            lambda *_: began.append((time.perf_counter(), time.thread_time()))
        )

        def post(*_: Any) -> None:
            if self.on and began:
                self.parts["optimizer.step"] += time.perf_counter() - began[-1][0]
                self.cpu["optimizer.step"] += time.thread_time() - began[-1][1]
            began.clear()

        opt.register_step_post_hook(post)


class StepWindow:
    """Called at the end of every step: the clock's window, the profiler's step, a CUDA sync at
    the window's edges (outside the timed steps)."""

    def __init__(self, args: argparse.Namespace, device: torch.device, clock: Clock) -> None:
        self.args, self.device, self.clock = args, device, clock
        self.done = 0
        self.prof: Any = None
        self.sync_warnings: list[Any] | None = None

    def end_of_step(self) -> None:
        self.done += 1
        first, last = self.args.warmup, self.args.warmup + self.args.window
        if self.done in (first, last):
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            self.clock.marks.append((time.perf_counter(), time.thread_time()))
            self.clock.on = self.done == first
            if self.sync_warnings is not None:
                torch.cuda.set_sync_debug_mode("warn" if self.done == first else 0)
        if self.prof is not None:
            self.prof.step()


def make_optimizer(args: argparse.Namespace) -> Callable[[Any], torch.optim.Optimizer]:
    fused = args.opt == "fused"
    return lambda params: torch.optim.AdamW(params, lr=3e-4, fused=fused, foreach=not fused)


def run_hand(args: argparse.Namespace, d: Any, window: StepWindow) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    b, t, v, n_layers, h, dim = SIZES[args.size]
    clock, device = window.clock, d.device
    torch.manual_seed(0)
    model: nn.Module = GPT(t, v, n_layers, h, dim).to(device)
    if d.env.world_size > 1:
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    if args.compile:  # as the Trainer does: the DDP-wrapped module
        model = torch.compile(model, mode=args.compile_mode)  # type: ignore[assignment]
    opt = make_optimizer(args)(model.parameters())
    clock.watch_optimizer(opt)
    data = batches(b, t, v, device, d.env.rank)
    forward = clock.wrap("forward", lambda x, y: model(x, y))
    backward = clock.wrap("backward", lambda loss: loss.backward())
    clip = clock.wrap("clip", torch.nn.utils.clip_grad_norm_)
    fetch = clock.wrap("data", lambda: next(data))
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16)
    for _ in range(args.warmup + args.window + 2):
        x, y = fetch()
        with autocast:
            loss = forward(x, y)
        backward(loss)
        if args.clip > 0:
            clip(model.parameters(), args.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        window.end_of_step()


def run_trainer(args: argparse.Namespace, d: Any, cfg: Any, window: StepWindow) -> None:
    import phalanx
    import phalanx.train.step as step_module
    from phalanx.train.feeding import DeviceFeed

    b, t, v, n_layers, h, dim = SIZES[args.size]
    clock = window.clock

    class EndOfStep(phalanx.Callback):
        def on_step_end(self, trainer: phalanx.Trainer) -> None:
            window.end_of_step()

    # Contiguous like the hand loop's batches (and phalanx_step.py's): slices of the batch
    # have other strides, and in one process torch.compile then recompiles the second side's
    # model with symbolic strides ("automatic dynamic"), a different and slower graph.
    forward = clock.wrap(
        "forward",
        lambda model, batch: model(batch[:, :-1].contiguous(), batch[:, 1:].contiguous()),
    )
    torch.manual_seed(0)
    steps = args.warmup + args.window + 2
    data = RandomTokens(v, t, b * d.env.world_size * (steps + 1))
    trainer = phalanx.Trainer(
        d,
        config=cfg,
        model=GPT(t, v, n_layers, h, dim),
        train_data=data,
        train_step=forward,
        optimizer=make_optimizer(args),
        callbacks=[EndOfStep()],
    )
    clock.watch_optimizer(trainer.optimizer)
    # Thin timers on the Trainer's parts, on these instances only (phalanx's code is unchanged).
    for obj, attr, name in (
        (trainer._loop, "post", "control flags posted (LoopControl.post)"),
        (trainer._loop, "read", "control verdict read (LoopControl.read)"),
        (trainer._loop, "before_step", "control all-reduce, blocking (iterable data)"),
        (trainer.precision, "backward", "backward"),
        (trainer.guard, "observe_loss", "guard.observe_loss"),
        (trainer.guard, "agree", "guard.agree (verdict)"),
        (trainer.metrics, "add", "metrics.add"),
        (trainer, "_log", "logging point (_log)"),
        (trainer, "_beat", "hang-watch beats"),
        (trainer.throughput, "count_step", "throughput.count_step"),
        (trainer._parts, "grad_norm", "grad norm (+ clip when replayed)"),
    ):
        setattr(obj, attr, clock.wrap(name, getattr(obj, attr)))
    for method, name in (("take", "data: take (wait for copy)"), ("prefetch", "data: prefetch")):
        # Class-level (the feed is made per epoch); unwrap an earlier repetition's timer first.
        plain = getattr(DeviceFeed, method)
        plain = getattr(plain, "phx_plain", plain)
        timed = clock.wrap(name, plain)
        timed.phx_plain = plain  # type: ignore[attr-defined]
        setattr(DeviceFeed, method, timed)
    saved_masked = step_module.masked_step
    step_module.masked_step = clock.wrap("masked_step (minus optimizer.step)", saved_masked)
    try:
        trainer.fit()
    finally:
        step_module.masked_step = saved_masked
    # masked_step contains optimizer.step: keep only its own part.
    parts = clock.parts
    name = "masked_step (minus optimizer.step)"
    if name in parts:
        parts[name] -= parts.get("optimizer.step", 0.0)
        clock.cpu[name] -= clock.cpu.get("optimizer.step", 0.0)


def timing_pass(args: argparse.Namespace, run: Callable[[StepWindow], None], device: Any) -> dict:
    clock = Clock()
    run(StepWindow(args, device, clock))
    (wall0, cpu0), (wall1, cpu1) = clock.marks
    wall, cpu = (wall1 - wall0) / args.window * 1e3, (cpu1 - cpu0) / args.window * 1e3
    parts = {k: v / args.window * 1e3 for k, v in sorted(clock.parts.items())}
    cpu_parts = {k: v / args.window * 1e3 for k, v in sorted(clock.cpu.items())}
    model = sum(parts.get(k, 0.0) for k in MODEL_PARTS)
    model_cpu = sum(cpu_parts.get(k, 0.0) for k in MODEL_PARTS)
    return {
        "step_ms": wall,
        "step_cpu_ms": cpu,
        "model_ms": model,
        "own_ms": wall - model,
        "own_cpu_ms": cpu - model_cpu,
        "parts_ms": parts,
        "parts_cpu_ms": cpu_parts,
        "unattributed_ms": wall - sum(parts.values()),
        "unattributed_cpu_ms": cpu - sum(cpu_parts.values()),
    }


def profile_pass(
    args: argparse.Namespace, run: Callable[[StepWindow], None], device: Any, side: str
) -> dict:
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    window = StepWindow(args, device, Clock(annotate=True))
    sync_warnings: list[Any] | None = [] if device.type == "cuda" else None
    window.sync_warnings = sync_warnings
    analysed: list[dict[str, Any]] = []
    rank = dist.get_rank() if dist.is_initialized() else 0
    trace = args.trace / f"{side}_rank{rank}.json" if args.trace else None
    if trace is not None:
        trace.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with profile(
            activities=activities,
            schedule=schedule(wait=args.warmup - 1, warmup=1, active=args.window, repeat=1),
            record_shapes=True,
            with_stack=True,
            on_trace_ready=lambda p: analysed.append(analyse(p, args.window, sync_warnings, trace)),
        ) as prof:
            window.prof = prof
            run(window)
    if sync_warnings is not None:  # counted after the fact: fill in the number
        count = sum("synchroniz" in str(w.message).lower() for w in caught)
        analysed[0]["sync_debug_warnings_per_step"] = count / args.window
    return analysed[0]


def trainer_config(args: argparse.Namespace) -> Any:
    import phalanx
    from phalanx.config import load

    steps = args.warmup + args.window + 2
    compiled = ["train.compile=true", f"train.compile_mode={args.compile_mode}"]
    overrides = [
        f"train.max_steps={steps}",
        f"data.batch_size={SIZES[args.size][0]}",
        "train.progress=false",
        *(["train.precision=bf16"] if args.bf16 else []),
        *([f"train.clip_grad_norm={args.clip}"] if args.clip > 0 else []),
        *(compiled if args.compile else []),
        *args.overrides,
    ]
    return load(phalanx.TrainerConfig, overrides=overrides)


def worker(args: argparse.Namespace) -> None:
    import phalanx

    cfg = trainer_config(args)
    results: dict[str, list[dict[str, Any]]] = {"hand": [], "trainer": []}
    profiles: dict[str, dict[str, Any]] = {}
    with phalanx.distributed(cfg.dist) as d:
        device = d.device
        sides: dict[str, Callable[[StepWindow], None]] = {
            "hand": lambda w: run_hand(args, d, w),
            "trainer": lambda w: run_trainer(args, d, cfg, w),
        }
        for _ in range(args.reps):
            for side, run in sides.items():
                results[side].append(timing_pass(args, run, device))
        for side, run in sides.items():
            profiles[side] = profile_pass(args, run, device, side)
        world = d.env.world_size
        if d.env.rank == 0:
            report(args, device, world, cfg, results, profiles)
        dist.barrier() if dist.is_initialized() else None


def _worker_args(argv: list[str]) -> list[str]:
    """argv without --nproc: torchrun (2.13) reads an option of its script that abbreviates
    one of its own (--nproc-per-node) as ambiguous and exits."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            out.append(arg)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--window", type=int, default=50)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--opt", choices=("fused", "foreach"), default="fused")
    parser.add_argument("--clip", type=float, default=0.0, help="clip norm for both sides")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast on both sides")
    parser.add_argument("--compile", action="store_true", help="torch.compile both sides")
    parser.add_argument("--compile-mode", default="default", help="torch.compile's mode")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--trace", type=Path, default=None, help="write Chrome traces here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="train.x=y for the Trainer only")
    args = parser.parse_args()
    if args.warmup < 2 or args.window < 1:
        parser.error("--warmup must be >= 2 and --window >= 1")
    if args.worker:
        worker(args)
        return
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={args.nproc}", __file__, "--worker", *_worker_args(sys.argv[1:]),
    ]  # fmt: skip
    env = dict(os.environ)
    if torch.cuda.is_available():  # one visible GPU per rank (phalanx refuses idle GPUs)
        env.setdefault("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(args.nproc)))
    raise SystemExit(subprocess.run(cmd, env=env, check=False).returncode)


if __name__ == "__main__":
    main()
