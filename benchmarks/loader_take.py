"""What a batch costs the training process: made in it, or taken from DataLoader workers (#17).

    python benchmarks/loader_take.py [--reps 5] [--batches 200] [--workers 0 1 2] [--hogs N]
        [--sharing file_descriptor|file_system] [--out PATH]

Two in-memory data sets: `tokens` (step_pairs.py's GPT-2 batches: 8 windows of 1,025 random
int64 tokens, a sample costs one randint) and `images` (64 FashionMNIST-shaped samples: a uint8
28x28 slice made float and normalised, as examples/fashion_mnist.py does). For each number of
workers, a persistent DataLoader is built, 20 batches are taken to warm it up, then `--batches`
batches are timed: the calling thread's CPU time and the process's (all its threads; the
workers are other processes), per batch. While a worker has no batch ready the caller waits,
which costs no CPU, so both are the take's own cost. Then the wall time of a take that finds
its batch ready: with workers, 20 rounds of a 0.1 s pause (the workers fill their queue of
2 batches each) and that many takes, each timed; without, every take (it makes the batch). With
`--hogs N`, N processes spin on the CPUs throughout, as other jobs on a shared node would: a
worker's batch reaches the training process through a round trip with the worker (its
resource-sharer thread hands over the shared memory's file descriptor), which then waits for
the worker to be scheduled; `--sharing file_system` (torch's other strategy: the receiver opens
the memory by name) has no such round trip. The settings' order rotates with each of the
`--reps` repetitions. Prints medians (min..max) and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from step_profile_model import RandomTokens
from torch.utils.data import DataLoader, Dataset


class Images(Dataset[tuple[torch.Tensor, int]]):
    """FashionMNIST's shape held in memory (random pixels): a sample is a slice and a cast."""

    def __init__(self, count: int) -> None:
        self.pixels = torch.randint(0, 256, (count, 28, 28), dtype=torch.uint8)

    def __len__(self) -> int:
        return len(self.pixels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return (self.pixels[index].float().div_(255.0) - 0.286) / 0.353, index % 10


DATA: dict[str, tuple[Any, int]] = {
    "tokens": (lambda: RandomTokens(50257, 1024, 8 * 2000), 8),
    "images": (lambda: Images(64 * 500), 64),
}


def one(name: str, workers: int, batches: int) -> dict[str, float]:
    make, batch_size = DATA[name]
    loader = DataLoader(make(), batch_size=batch_size, shuffle=True, num_workers=workers,
                        persistent_workers=workers > 0)  # fmt: skip
    it = iter(loader)
    for _ in range(20):
        next(it)
    thread, process, wall = time.thread_time(), time.process_time(), time.perf_counter()
    for _ in range(batches):
        next(it)
    done = {
        "thread_ms": (time.thread_time() - thread) * 1e3 / batches,
        "process_ms": (time.process_time() - process) * 1e3 / batches,
        "samples_per_s": batches * batch_size / (time.perf_counter() - wall),
        "ready_take_ms": statistics.median(ready_takes(it, workers)),
    }
    del it, loader
    return done


def ready_takes(it: Any, workers: int) -> list[float]:
    """Wall ms of takes whose batch is ready (see the module docstring)."""
    rounds, per_round = (20, 2 * workers) if workers else (1, 40)
    times = []
    for _ in range(rounds):
        if workers:
            time.sleep(0.1)  # a measurement's pause: the workers' queue fills meanwhile
        for _ in range(per_round):
            began = time.perf_counter()
            next(it)
            times.append((time.perf_counter() - began) * 1e3)
    return times


def spin() -> None:
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--hogs", type=int, default=0, help="processes spinning on the CPUs")
    strategies = ("file_descriptor", "file_system")
    parser.add_argument("--sharing", choices=strategies, default=strategies[0],
                        help="torch.multiprocessing's sharing strategy")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/loader_take.json"))
    args = parser.parse_args()
    if args.reps < 1 or args.batches < 1 or min(args.workers) < 0 or args.hogs < 0:
        parser.error("--reps and --batches: at least 1; --workers and --hogs: 0 or more")
    torch.multiprocessing.set_sharing_strategy(args.sharing)
    hogs = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.hogs)]
    for hog in hogs:
        hog.start()
    try:
        runs = measure(args)
    finally:
        for hog in hogs:
            hog.terminate()
            hog.join()
    report(args, runs)


def measure(args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    settings = [(name, w) for name in DATA for w in args.workers]
    runs: dict[str, list[dict[str, float]]] = {f"{n} {w}": [] for n, w in settings}
    for rep in range(args.reps):
        k = rep % len(settings)
        for name, workers in settings[k:] + settings[:k]:
            runs[f"{name} {workers}"].append(one(name, workers, args.batches))
    return runs


def report(args: argparse.Namespace, runs: dict[str, list[dict[str, float]]]) -> None:
    print(f"torch {torch.__version__}, {args.reps} reps of {args.batches} batches, {args.hogs} "
          f"spinning processes, {args.sharing}; ms per batch: median (min..max)")  # fmt: skip
    print(f"{'data':<8}{'workers':>8}{'thread CPU':>22}{'process CPU':>22}{'ready take wall':>22}"
          f"{'samples/s':>11}")  # fmt: skip
    for key, reps in runs.items():
        name, workers = key.split()
        cells = []
        for metric in ("thread_ms", "process_ms", "ready_take_ms"):
            values = [r[metric] for r in reps]
            cells.append(f"{statistics.median(values):.3f} ({min(values):.3f}..{max(values):.3f})")
        rate = statistics.median(r["samples_per_s"] for r in reps)
        print(f"{name:<8}{workers:>8}{cells[0]:>22}{cells[1]:>22}{cells[2]:>22}{rate:>11.0f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {"torch": torch.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "args": vars(args) | {"out": str(args.out)}, "runs": runs}  # fmt: skip
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
