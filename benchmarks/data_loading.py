"""Data loading: what a batch costs the training process, made in it or taken from DataLoader
workers (`take`), and what starting workers from phalanx's fork server costs by what the server
preloads (`worker-start`).

    python benchmarks/data_loading.py take [--reps 5] [--batches 200] [--workers 0 1 2]
        [--hogs N] [--out PATH]
    python benchmarks/data_loading.py worker-start [--reps 7] [--workers 4]
        [--line "from x.y import Z"] [--out PATH]

`take`: GPT-2 batches (8 windows of 1,025 random int64 tokens) from an in-memory data set, per
number of workers (0, made in the process, is the baseline): the calling thread's and the
process's CPU time per batch over `--batches` timed takes (waiting costs no CPU), then the wall
time of a take that finds its batch ready. `--hogs N`: N processes spin on the CPUs throughout.
`worker-start`: a fresh interpreter runs a script starting with `--line` and takes every batch
of `--workers` workers once; the fork server preloads the modules the script's names come from
(`modules`, phalanx's default) against only their top-level packages (`packages`, the
baseline); measured: wall time and the machine's busy CPU time (run it on an idle machine).
Settings alternate in every repetition; both print medians (min..max) and write JSON.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from models import Tokens, write_record
from torch.utils.data import DataLoader


def one(workers: int, batches: int, batch_size: int = 8) -> dict[str, float]:
    data = Tokens(50257, 1024, 2000 * batch_size)  # GPT-2's windows
    loader = DataLoader(data, batch_size=batch_size, shuffle=True, num_workers=workers,
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


def take(args: argparse.Namespace) -> None:
    spin = [sys.executable, "-c", "while True: pass"]
    hogs = [subprocess.Popen(spin) for _ in range(args.hogs)]
    try:
        runs = measure(args)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    take_report(args, runs)


def measure(args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    runs: dict[str, list[dict[str, float]]] = {f"tokens {w}": [] for w in args.workers}
    for rep in range(args.reps):
        k = rep % len(args.workers)
        for workers in args.workers[k:] + args.workers[:k]:
            runs[f"tokens {workers}"].append(one(workers, args.batches))
    return runs


def take_report(args: argparse.Namespace, runs: dict[str, list[dict[str, float]]]) -> None:
    print(f"torch {torch.__version__}, {args.reps} reps of {args.batches} batches, {args.hogs} "
          f"spinning processes; ms per batch: median (min..max)")  # fmt: skip
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
    record = {"torch": torch.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "args": vars(args) | {"out": str(args.out)}, "runs": runs}  # fmt: skip
    write_record(args.out, record)


SCRIPT = """
import sys
import warnings

import torch
from torch.utils.data import Dataset

import phalanx.dist.forking as forking
from phalanx.data import make_eval_loader
from phalanx.env import detect
{line}  # noqa: F401  (the import every worker repeats)


class Rows(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        return torch.full((4,), float(index))


if __name__ == "__main__":
    warnings.filterwarnings("ignore", message="This DataLoader will create")  # more than cores
    if sys.argv[1] == "packages":
        modules = forking.script_modules
        forking.script_modules = lambda: sorted({name.split(".")[0] for name in modules()})
    forking.prefer_forkserver()
    loader = make_eval_loader(Rows(), env=detect(), batch_size=8, num_workers=int(sys.argv[2]))
    assert sum(batch.shape[0] for batch in loader) == 64
"""
SIDES = ("modules", "packages")


def busy_seconds() -> float:
    """The machine's busy CPU time so far (user, nice, system, irq, softirq), in seconds."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = map(int, fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def one_start(script: Path, side: str, workers: int) -> tuple[float, float]:
    """(wall s, machine CPU s) of one fresh run of the script."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cpu, start = busy_seconds(), time.perf_counter()
    subprocess.run([sys.executable, str(script), side, str(workers)], check=True, env=env)
    return time.perf_counter() - start, busy_seconds() - cpu


def worker_start(args: argparse.Namespace) -> None:
    runs: dict[str, dict[str, list[float]]] = {s: {"wall_s": [], "cpu_s": []} for s in SIDES}
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "worker_start_script.py"
        script.write_text(SCRIPT.replace("{line}", args.line))
        for side in SIDES[: args.warm * 2]:  # warm the page cache, untimed
            one_start(script, side, args.workers)
        for _ in range(args.reps):
            for side in SIDES:
                wall, cpu = one_start(script, side, args.workers)
                runs[side]["wall_s"].append(wall)
                runs[side]["cpu_s"].append(cpu)
    print(f"`{args.line}`, {args.workers} workers, {args.reps} alternating repetitions, medians")
    print(f"{'preload':<10}{'wall s':>22}{'machine CPU s':>24}")
    for side, got in runs.items():
        cells = [f"{statistics.median(v):.2f} ({min(v):.2f}..{max(v):.2f})" for v in got.values()]
        print(f"{side:<10}{cells[0]:>22}{cells[1]:>24}")
    record = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "line": args.line,
              "workers": args.workers, "reps": args.reps, "python": sys.version.split()[0],
              "runs": runs}  # fmt: skip
    write_record(args.out, record, indent=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    t = commands.add_parser("take", help="a batch's cost to the training process")
    t.add_argument("--reps", type=int, default=5)
    t.add_argument("--batches", type=int, default=200)
    t.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    t.add_argument("--hogs", type=int, default=0, help="processes spinning on the CPUs")
    t.add_argument("--out", type=Path, default=Path("benchmarks/results/data_loading_take.json"))
    w = commands.add_parser("worker-start", help="worker start by the fork server's preload")
    w.add_argument("--reps", type=int, default=7)
    w.add_argument("--workers", type=int, default=4)
    w.add_argument("--warm", type=int, choices=(0, 1), default=1, help="0: no untimed runs")
    w.add_argument("--line", default="from transformers import LlamaForCausalLM")
    start_out = Path("benchmarks/results/data_loading_worker_start.json")
    w.add_argument("--out", type=Path, default=start_out)
    args = parser.parse_args()
    workers = [args.workers] if isinstance(args.workers, int) else args.workers
    if args.reps < 1 or min(workers) < 0:
        parser.error("--reps: at least 1; --workers: 0 or more")
    if args.command == "take":
        take(args)
    else:
        worker_start(args)


if __name__ == "__main__":
    main()
