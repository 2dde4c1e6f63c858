"""Preflight: before a run spends its allocation, every rank proves that it computes and talks at
the speed of its peers.

    phalanx doctor --preflight [-n N]            (through `phalanx run`, under srun too)
    dist.preflight=true                           (at the start of every run, after the rendezvous)

Each rank times a matrix product (the fastest of a few: what the device can do, not what a
passing neighbour took; bf16 4096² on a GPU, fp32 512² on a CPU), then all ranks time one
all-reduce of 16 MiB together. Rank 0 gathers the times and names, with host and SLURM node,
every rank whose product took more than `slow_factor` x the median of the other ranks (a
throttled GPU, a node shared with another job) and every rank whose check raised. The
all-reduce itself is the check that every rank can reach every other one: a rank that cannot
leaves the others in it until dist.timeout_s. A few seconds in all.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

Work = Callable[[torch.device], float]
"""Times this rank's matrix products: seconds for the median one."""

SLOW_FACTOR = 1.5
ALLREDUCE_MB = 16


def time_gemm(device: torch.device, *, reps: int = 7, min_s: float = 0.1) -> float:
    """The fastest of at least `reps` timed products spread over at least `min_s` seconds (after
    one untimed), synchronised on the device. The spread is what makes the fastest stable on a
    shared host: a burst of other work can slow every product of a few milliseconds' window,
    hardly every one of a tenth of a second."""
    cuda = device.type == "cuda"
    n, dtype = (4096, torch.bfloat16) if cuda else (512, torch.float32)
    gen = torch.Generator(device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    (a @ b).sum().item()  # untimed: allocation and kernel choice
    times: list[float] = []
    began = time.perf_counter()
    while len(times) < reps or (time.perf_counter() - began < min_s and len(times) < 50 * reps):
        start = time.perf_counter()
        (a @ b).sum().item()  # the sync: the product is done when its sum is on the host
        times.append(time.perf_counter() - start)
    return min(times)


@dataclass(frozen=True)
class RankCheck:
    rank: int
    host: str
    node: str
    gemm_ms: float
    error: str = ""

    def where(self) -> str:
        node = f", node {self.node}" if self.node and self.node != self.host else ""
        return f"rank {self.rank} ({self.host}{node})"


def problems(checks: Sequence[RankCheck], slow_factor: float = SLOW_FACTOR) -> list[str]:
    """One line per rank that failed, or is slow against the median of the other ranks (with
    two ranks: against the other one)."""
    lines = [f"{c.where()}: its check failed: {c.error}" for c in checks if c.error]
    timed = [c for c in checks if not c.error]
    for c in timed:
        others = [o.gemm_ms for o in timed if o.rank != c.rank]
        median = statistics.median(others) if others else c.gemm_ms
        if c.gemm_ms > slow_factor * median:
            lines.append(f"{c.where()}: matrix product {c.gemm_ms / median:.1f}x slower than "
                         f"the median ({c.gemm_ms:.1f} ms vs {median:.1f} ms)")  # fmt: skip
    return lines


def check_ranks(device: torch.device, *, work: Work = time_gemm) -> tuple[list[RankCheck], float]:
    """Every rank's product time, gathered on every rank, and the all-reduce's time (a
    collective: every rank calls it)."""
    error, gemm_ms = "", 0.0
    try:
        gemm_ms = work(device) * 1e3
    except Exception as caught:  # named in the report; the all-reduce below still runs
        error = f"{type(caught).__name__}: {caught}"
    mine = RankCheck(dist.get_rank(), socket.gethostname(),
                     os.environ.get("SLURMD_NODENAME", ""), gemm_ms, error)  # fmt: skip
    tensor = torch.ones(ALLREDUCE_MB * 2**18, device=device)  # 16 MiB of fp32
    dist.barrier()
    start = time.perf_counter()
    dist.all_reduce(tensor)
    tensor[0].item()
    allreduce_ms = (time.perf_counter() - start) * 1e3
    gathered: list[dict[str, object] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, asdict(mine))
    return [RankCheck(**g) for g in gathered if g is not None], allreduce_ms  # type: ignore[arg-type]


def summary(checks: Sequence[RankCheck], allreduce_ms: float, took_s: float) -> str:
    times = [c.gemm_ms for c in checks if not c.error]
    spread = f"{min(times):.1f}..{max(times):.1f} ms" if times else "none timed"
    return (f"preflight: {len(checks)} ranks, matrix product {spread}, all-reduce of "
            f"{ALLREDUCE_MB} MiB {allreduce_ms:.1f} ms, {took_s:.1f} s")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    import phalanx

    parser = argparse.ArgumentParser(prog="phalanx.doctor.preflight")
    parser.add_argument("--slow-factor", type=float, default=SLOW_FACTOR)
    args = parser.parse_args(argv)
    began = time.perf_counter()
    with phalanx.distributed(phalanx.DistConfig(timeout_s=120)) as d:
        checks, allreduce_ms = check_ranks(d.device)
        found = problems(checks, args.slow_factor)
        if d.env.is_main_process:
            print(summary(checks, allreduce_ms, time.perf_counter() - began), flush=True)
            for line in found:
                print(f"preflight: {line}", flush=True)
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
