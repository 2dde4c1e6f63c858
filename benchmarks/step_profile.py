"""What phalanx.Trainer's step adds over a hand-written DDP loop, counted per step (issue #17).

    python benchmarks/step_profile.py [--nproc 2] [--warmup 20] [--window 50] [--reps 3]
        [--size tiny|gpt2] [--opt fused|foreach] [--clip 0] [--out PATH] [train.x=y ...]

Launches itself under torchrun (gloo CPU ranks, or one GPU per rank where CUDA is present) and,
per repetition, runs a small GPT-like model (a) as a hand-written DDP loop (the reference
peer_step.py's loop: synthetic batches, .to(device, non_blocking), forward, backward, optimizer
step, zero_grad) and (b) through phalanx.Trainer with default settings (extra `train.x=y`
overrides go to the Trainer only). Each side runs twice:

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
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

SIZES = {  # B, T, V, L, H, D
    "tiny": (4, 64, 512, 2, 2, 64),
    "gpt2": (8, 1024, 50304, 12, 12, 768),
}
SYNC_OPS = ("aten::item", "aten::_local_scalar_dense", "aten::is_nonzero")
CUDA_SYNCS = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "cudaStreamWaitEvent",
)
COLLECTIVE_PREFIXES = ("gloo:", "nccl:")
MODEL_PARTS = ("forward", "backward", "optimizer.step")


class Block(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """peer_step.py's GPT with its sizes as arguments (tied embedding and head)."""

    def __init__(self, t: int, v: int, n_layers: int, h: int, d: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(v, d), nn.Embedding(t, d)
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(n_layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, v, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


class RandomTokens(torch.utils.data.Dataset[torch.Tensor]):
    """Random windows of T+1 tokens (the Trainer's data; the hand loop makes its own)."""

    def __init__(self, vocab: int, length: int, count: int) -> None:
        self.vocab, self.length, self.count = vocab, length, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.randint(0, self.vocab, (self.length + 1,))


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


def batches(b: int, t: int, v: int, device: torch.device, seed: int) -> Iterator[Any]:
    """peer_step.py's data: random tokens made on the host, copied without blocking."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    while True:
        x = torch.randint(0, v, (b, t + 1), generator=g)
        yield x[:, :-1].to(device, non_blocking=True), x[:, 1:].to(device, non_blocking=True)


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

    forward = clock.wrap("forward", lambda model, batch: model(batch[:, :-1], batch[:, 1:]))
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
        (trainer.guard, "agree", "guard.agree (flag all-reduce)"),
        (trainer.metrics, "add", "metrics.add"),
        (trainer, "_log", "logging point (_log)"),
        (trainer, "_beat", "hang-watch beats"),
        (trainer.throughput, "count_step", "throughput.count_step"),
    ):
        setattr(obj, attr, clock.wrap(name, getattr(obj, attr)))
    for method, name in (("take", "data: take (wait for copy)"), ("prefetch", "data: prefetch")):
        # Class-level (the feed is made per epoch); unwrap an earlier repetition's timer first.
        plain = getattr(DeviceFeed, method)
        plain = getattr(plain, "phx_plain", plain)
        timed = clock.wrap(name, plain)
        timed.phx_plain = plain  # type: ignore[attr-defined]
        setattr(DeviceFeed, method, timed)
    saved_norm = step_module.total_norm
    saved_masked = step_module.masked_step
    step_module.total_norm = clock.wrap("total_norm", saved_norm)
    step_module.masked_step = clock.wrap("masked_step (minus optimizer.step)", saved_masked)
    try:
        trainer.fit()
    finally:
        step_module.total_norm = saved_norm
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


def origin(event: Any) -> tuple[str, str]:
    """(part, source) of an op: the innermost phx::<part> range or optimizer annotation above it
    ("(loop)" when none), and the innermost phalanx Python function above it (file(def line))."""
    part, source = "", ""
    parent = event.cpu_parent
    while parent is not None and not (part and source):
        name = parent.name
        if not part and name.startswith("phx::"):
            part = name[len("phx::") :]
        elif not part and name.startswith("Optimizer.step#"):
            part = "optimizer.step"
        elif not part and name.startswith("Optimizer.zero_grad#"):
            part = "zero_grad"
        if not source and "phalanx/" in name and "benchmarks/" not in name:
            source = name[name.index("phalanx/") :]
        parent = parent.cpu_parent
    return part or "(loop)", source or "-"


def is_op(name: str) -> bool:
    return name.startswith(("aten::", "c10d::", *COLLECTIVE_PREFIXES))


def numel(shape: Any) -> int:
    if not isinstance(shape, list) or not all(isinstance(s, int) for s in shape):
        return 0
    n = 1
    for s in shape:
        n *= s
    return n  # a 0-dim tensor ([]) holds one element


def analyse(
    prof: Any, window: int, sync_warnings: list[Any] | None, trace: Path | None = None
) -> dict[str, Any]:
    if trace is not None:  # a Chrome/Perfetto timeline of the window, for a look by eye
        prof.export_chrome_trace(str(trace))
    events = list(prof.events())
    steps = sorted(
        (e.time_range.start, e.time_range.end) for e in events if e.name.startswith("ProfilerStep")
    )
    ops: collections.Counter[str] = collections.Counter()
    top_ops: collections.Counter[str] = collections.Counter()
    by_part: collections.Counter[str] = collections.Counter()
    by_part_op: collections.Counter[tuple[str, str, str]] = collections.Counter()
    per_step_ops = [0] * len(steps)
    collectives: dict[str, dict[str, float]] = {}
    kernels = 0
    runtime: collections.Counter[str] = collections.Counter()
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels += 1
            continue
        name = e.name
        if name in CUDA_SYNCS:
            runtime[name] += 1
        if not is_op(name):
            continue
        ops[name] += 1
        parent = e.cpu_parent
        while parent is not None and not is_op(parent.name):
            parent = parent.cpu_parent
        collective = name.startswith(COLLECTIVE_PREFIXES)  # on the backend's thread
        if parent is None and not collective:  # top-level: dispatched from Python
            top_ops[name] += 1
            part, source = origin(e)
            by_part[part] += 1
            by_part_op[(part, name, source)] += 1
        start = e.time_range.start
        for i, (lo, hi) in enumerate(steps):
            if lo <= start < hi:
                per_step_ops[i] += 1
                break
        if name.startswith(COLLECTIVE_PREFIXES):
            c = collectives.setdefault(name, {"count": 0, "bytes": 0})
            c["count"] += 1
            dtypes = getattr(e, "input_dtypes", None) or []
            for shape, dtype in zip(e.input_shapes or [], dtypes, strict=False):
                c["bytes"] += numel(shape) * _dtype_size(dtype)
    per = 1.0 / window
    return {
        "steps_profiled": len(steps),
        **device_time(events, steps),
        "aten_ops_per_step": sum(n for k, n in ops.items() if k.startswith("aten::")) * per,
        "top_level_ops_per_step": sum(top_ops.values()) * per,
        "ops_per_step_median": statistics.median(per_step_ops) if per_step_ops else 0,
        "ops_per_step_max": max(per_step_ops) if per_step_ops else 0,
        "kernels_per_step": kernels * per,
        "collectives_per_step": {
            k: {"count": v["count"] * per, "bytes": v["bytes"] * per}
            for k, v in sorted(collectives.items())
        },
        "syncs_per_step": {k: ops[k] * per for k in SYNC_OPS}
        | {k: runtime[k] * per for k in CUDA_SYNCS if runtime[k]},
        "sync_debug_warnings_per_step": None if sync_warnings is None else len(sync_warnings) * per,
        "top_level_ops_by_part": {k: v * per for k, v in sorted(by_part.items())},
        "top_level_ops_by_part_op_source": [
            {"part": k[0], "op": k[1], "source": k[2], "per_step": v * per}
            for k, v in sorted(by_part_op.items(), key=lambda kv: -kv[1])
        ],
        "op_counts": dict(ops),
    }


def device_time(events: list[Any], steps: list[tuple[float, float]]) -> dict[str, Any]:
    """Per step: wall time of the profiled steps, the time the device was busy (union of its
    kernel/copy intervals) and its idle gaps over 50 us, each named by the part of the loop the
    host was in when the gap ended (the kernel that ended it was launched then). Busy close to
    wall = the GPU bounds the step; idle time = the host (or a sync) kept the GPU waiting."""
    if not steps:
        return {}
    lo, hi = steps[0][0], steps[-1][1]
    spans = sorted(
        (e.time_range.start, e.time_range.end)
        for e in events
        if e.device_type == torch.autograd.DeviceType.CUDA and lo <= e.time_range.start < hi
    )
    if not spans:
        return {}
    parts = [
        (e.time_range.start, e.time_range.end, _part_name(e.name))
        for e in events
        if e.device_type != torch.autograd.DeviceType.CUDA and _part_name(e.name)
    ]
    busy, idle = 0.0, collections.Counter[str]()
    run_start, run_end = spans[0]
    for start, stop in spans[1:]:
        if start <= run_end:  # overlaps the current busy run
            run_end = max(run_end, stop)
            continue
        busy += run_end - run_start
        if start - run_end > 50:
            inside = [p for p in parts if p[0] <= start - 10 <= p[1]]
            name = min(inside, key=lambda p: p[1] - p[0])[2] if inside else "(loop)"
            idle[name] += start - run_end
        run_start, run_end = start, stop
    busy += run_end - run_start
    n = len(steps)
    return {
        "step_wall_ms_profiled": (hi - lo) / n / 1e3,
        "gpu_busy_ms_per_step": busy / n / 1e3,
        "gpu_idle_gaps_over_50us_ms_per_step": sum(idle.values()) / n / 1e3,
        "gpu_idle_gaps_by_host_part_ms_per_step": {
            k: round(v / n / 1e3, 3) for k, v in idle.most_common(10)
        },
    }


def _part_name(name: str) -> str:
    if name.startswith("phx::"):
        return name[len("phx::") :]
    for prefix, part in (
        ("Optimizer.step#", "optimizer.step"),
        ("Optimizer.zero_grad#", "zero_grad"),
    ):
        if name.startswith(prefix):
            return part
    return ""


def _dtype_size(dtype: str) -> int:
    text = str(dtype).lower()
    for key, size in (("64", 8), ("double", 8), ("long", 8), ("16", 2), ("half", 2)):
        if key in text:
            return size
    return 1 if ("bool" in text or "8" in text or "char" in text) else 4


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
    overrides = [
        f"train.max_steps={steps}",
        f"data.batch_size={SIZES[args.size][0]}",
        "train.progress=false",
        *(["train.precision=bf16"] if args.bf16 else []),
        *([f"train.clip_grad_norm={args.clip}"] if args.clip > 0 else []),
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


def median_of(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def report(
    args: argparse.Namespace, device: Any, world: int, cfg: Any,
    results: dict[str, list[dict[str, Any]]], profiles: dict[str, dict[str, Any]],
) -> None:  # fmt: skip
    hand, trainer = profiles["hand"], profiles["trainer"]
    print(f"\n{world} ranks on {device.type}, size {args.size}, opt {args.opt}, clip {args.clip}, ")
    print(f"window {args.window} steps after {args.warmup}, {args.reps} timing reps (median)\n")
    rows: list[tuple[str, Any, Any]] = [
        ("step wall ms (timing pass)", median_of(results["hand"], "step_ms"),
         median_of(results["trainer"], "step_ms")),
        ("  model ms (fwd+bwd+opt.step)", median_of(results["hand"], "model_ms"),
         median_of(results["trainer"], "model_ms")),
        ("  loop's own ms", median_of(results["hand"], "own_ms"),
         median_of(results["trainer"], "own_ms")),
        ("step thread-CPU ms", median_of(results["hand"], "step_cpu_ms"),
         median_of(results["trainer"], "step_cpu_ms")),
        ("  loop's own thread-CPU ms", median_of(results["hand"], "own_cpu_ms"),
         median_of(results["trainer"], "own_cpu_ms")),
        ("aten ops / step (all)", hand["aten_ops_per_step"], trainer["aten_ops_per_step"]),
        ("top-level ops / step", hand["top_level_ops_per_step"],
         trainer["top_level_ops_per_step"]),
        ("ops in median / max step", f"{hand['ops_per_step_median']:g} / "
         f"{hand['ops_per_step_max']}", f"{trainer['ops_per_step_median']:g} / "
         f"{trainer['ops_per_step_max']}"),
        ("device kernels / step", hand["kernels_per_step"], trainer["kernels_per_step"]),
    ]  # fmt: skip
    if "gpu_busy_ms_per_step" in hand and "gpu_busy_ms_per_step" in trainer:
        for key, label in (
            ("step_wall_ms_profiled", "profiled step wall ms"),
            ("gpu_busy_ms_per_step", "GPU busy ms"),
            ("gpu_idle_gaps_over_50us_ms_per_step", "GPU idle (gaps > 50 us) ms"),
        ):
            rows.append((label, hand[key], trainer[key]))
        for side in ("hand", "trainer"):
            gaps = profiles[side]["gpu_idle_gaps_by_host_part_ms_per_step"]
            print(f"{side}: GPU idle ms per step by the host part that ended the gap: {gaps}")
    for name in sorted(set(hand["collectives_per_step"]) | set(trainer["collectives_per_step"])):
        h = hand["collectives_per_step"].get(name, {"count": 0, "bytes": 0})
        t = trainer["collectives_per_step"].get(name, {"count": 0, "bytes": 0})
        rows.append((f"{name} / step", h["count"], t["count"]))
        rows.append((f"{name} bytes / step", h["bytes"], t["bytes"]))
    for name in sorted(set(hand["syncs_per_step"]) | set(trainer["syncs_per_step"])):
        rows.append((f"sync {name} / step", hand["syncs_per_step"].get(name, 0),
                     trainer["syncs_per_step"].get(name, 0)))  # fmt: skip
    if hand["sync_debug_warnings_per_step"] is not None:
        rows.append(("sync_debug warnings / step", hand["sync_debug_warnings_per_step"],
                     trainer["sync_debug_warnings_per_step"]))  # fmt: skip
    print(f"{'per step':<36}{'hand':>12}{'trainer':>12}{'extra':>12}")
    for name, h, t in rows:
        if isinstance(h, str):
            print(f"{name:<36}{h:>12}{t:>12}")
        else:
            print(f"{name:<36}{h:>12.3f}{t:>12.3f}{t - h:>+12.3f}")
    for side in ("trainer", "hand"):
        print(f"\n{side}: time per step by part, ms (median over reps): wall / thread CPU")
        runs = results[side]
        for name in sorted({k for r in runs for k in r["parts_ms"]}):
            wall = statistics.median(r["parts_ms"].get(name, 0.0) for r in runs)
            cpu = statistics.median(r["parts_cpu_ms"].get(name, 0.0) for r in runs)
            print(f"  {name:<44}{wall:>9.3f}{cpu:>9.3f}")
        wall, cpu = median_of(runs, "unattributed_ms"), median_of(runs, "unattributed_cpu_ms")
        print(f"  {'(not wrapped: loop, zero_grad, callbacks)':<44}{wall:>9.3f}{cpu:>9.3f}")
    print("\ntop-level ops per step by part (ops dispatched from Python):")
    parts = sorted(set(hand["top_level_ops_by_part"]) | set(trainer["top_level_ops_by_part"]))
    for part in parts:
        h = hand["top_level_ops_by_part"].get(part, 0.0)
        t = trainer["top_level_ops_by_part"].get(part, 0.0)
        print(f"  {part:<44}{h:>9.2f}{t:>9.2f}{t - h:>+9.2f}")
    print("\nthe Trainer's own top-level ops per step (outside forward/backward/optimizer.step):")
    own = [r for r in trainer["top_level_ops_by_part_op_source"] if r["part"] not in MODEL_PARTS]
    for r in own[: args.top * 2]:
        print(f"  {r['per_step']:>6.2f}  {r['op']:<30} {r['part']:<34} {r['source']}")
    extra = extra_ops(hand, trainer, args.window)
    print(f"\nall ops (nested included) the Trainer has more of, per step, top {args.top}:")
    for row in extra[: args.top]:
        print(f"  {row['op']:<34}{row['hand_per_step']:>9.2f}{row['trainer_per_step']:>9.2f}"
              f"{row['extra_per_step']:>+9.2f}")  # fmt: skip
    out = args.out or Path(f"benchmarks/results/step_profile_{device.type}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "host": platform.node(),
                "torch": torch.__version__,
                "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                "world": world,
                "args": {k: str(v) for k, v in vars(args).items()},
                "trainer_config": {"train": vars(cfg.train), "data": vars(cfg.data)},
                "timing": results,
                "profile": profiles,
                "extra_ops": extra,
            },
            indent=1,
            default=str,
        )
    )
    print(f"wrote {out}")


def extra_ops(hand: dict[str, Any], trainer: dict[str, Any], window: int) -> list[dict[str, Any]]:
    rows = []
    for op, n in trainer["op_counts"].items():
        h = hand["op_counts"].get(op, 0)
        if n > h:
            rows.append(
                {
                    "op": op,
                    "hand_per_step": h / window,
                    "trainer_per_step": n / window,
                    "extra_per_step": (n - h) / window,
                }
            )
    return sorted(rows, key=lambda r: -r["extra_per_step"])


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
