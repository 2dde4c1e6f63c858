"""benchmarks/step_profile.py's analysis: what a torch.profiler window says per step (ops by
part and source, kernels, collectives, host-device syncs, GPU busy and idle time) and the
table and JSON it reports. Imported by step_profile.py's workers."""

from __future__ import annotations

import argparse
import collections
import json
import platform
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

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
    # A range annotation (record_function, ProfilerStep#) also appears on the GPU's timeline
    # when kernels ran inside it (torch >= 2.4): those copies are neither steps nor kernels.
    events = [e for e in prof.events() if not _gpu_annotation(e)]
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


def _gpu_annotation(event: Any) -> bool:
    return event.device_type == torch.autograd.DeviceType.CUDA and (
        getattr(event, "is_user_annotation", False) or event.name.startswith("ProfilerStep")
    )


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


def median_of(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def report(
    args: argparse.Namespace, device: Any, world: int, cfg: Any,
    results: dict[str, list[dict[str, Any]]], profiles: dict[str, dict[str, Any]],
) -> None:  # fmt: skip
    hand, trainer = profiles["hand"], profiles["trainer"]
    compiled = f", compiled ({args.compile_mode})" if args.compile else ""
    where = f"{world} ranks on {device.type}, size {args.size}"
    print(f"\n{where}, opt {args.opt}, clip {args.clip}{compiled}")
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
