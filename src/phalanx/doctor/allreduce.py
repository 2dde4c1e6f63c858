"""All-reduce bandwidth between the ranks of one launch (`phalanx doctor --bandwidth`).

    phalanx run -n N -m phalanx.doctor.allreduce [--sizes-mb 1 16 64] [--iters 20]

For each size: 3 warm-up all-reduces, then `iters` timed ones, each started together (a barrier)
and finished on the device (CUDA synchronise). Reported per size: the median time over
iterations of the slowest rank, algorithm bandwidth (bytes / time) and bus bandwidth (algbw x
2(n-1)/n, nccl-tests' convention, comparable across world sizes). Rank 0 prints a table and
one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

import phalanx

WARMUP = 3


def measure(size_mb: float, iters: int, device: torch.device) -> dict[str, Any]:
    """One size: the median over `iters` of the slowest rank's all-reduce time."""
    world = dist.get_world_size()
    tensor = torch.ones(max(1, int(size_mb * 2**20 / 4)), dtype=torch.float32, device=device)
    times = [0.0] * iters
    for i in range(WARMUP + iters):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= WARMUP:
            times[i - WARMUP] = time.perf_counter() - start
    slowest = torch.tensor(times, dtype=torch.float64, device=device)  # NCCL: device tensors
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    seconds = statistics.median(slowest.tolist())
    nbytes = tensor.numel() * tensor.element_size()
    algbw = nbytes / seconds / 1e9
    return {
        "size_mb": round(nbytes / 2**20, 3), "ranks": world, "median_ms": round(seconds * 1e3, 3),
        "algbw_GBps": round(algbw, 3), "busbw_GBps": round(algbw * 2 * (world - 1) / world, 3),
    }  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'size (MiB)':>10} {'ranks':>5} {'median (ms)':>11} {'algbw (GB/s)':>12} "
             f"{'busbw (GB/s)':>12}"]  # fmt: skip
    for r in rows:
        lines.append(f"{r['size_mb']:>10g} {r['ranks']:>5} {r['median_ms']:>11.3f} "
                     f"{r['algbw_GBps']:>12.3f} {r['busbw_GBps']:>12.3f}")  # fmt: skip
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="phalanx.doctor.allreduce")
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1.0, 16.0, 64.0])
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args(argv)
    with phalanx.distributed(phalanx.DistConfig(timeout_s=120)) as d:
        rows = [measure(size, args.iters, d.device) for size in args.sizes_mb]
        if d.env.is_main_process:
            print(f"all-reduce over {d.env.world_size} ranks on {d.env.num_nodes} node(s), "
                  f"{d.backend} on {d.device.type}:")  # fmt: skip
            print(table(rows), flush=True)
            print(json.dumps({"allreduce": rows}), flush=True)


if __name__ == "__main__":
    main()
