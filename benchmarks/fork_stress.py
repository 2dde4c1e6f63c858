"""Fork safety: repeat a short 2-rank training run whose loaders start worker processes many
times, under CPU load, and count the runs that hang.

    python benchmarks/fork_stress.py [--runs 30] [--timeout 90] [--load 1]
        [--start fork forkserver] [--out PATH] [-- k=v ...]

Each run is `phalanx run -n 2` of this script with FORK_STRESS_WORKER=1: a tiny Trainer whose
loaders fork workers each epoch; the start methods alternate (`fork`, the baseline, against the
fork server). A run that outlives `--timeout` is a hang: gdb writes its processes' native stacks
into `<out>.stacks/`. `--load K` keeps K busy processes running beside the runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from models import write_record
from torch import nn

HERE = Path(__file__).resolve().parent
PHALANX = Path(sys.executable).parent / "phalanx"
WORKER_ENV = "FORK_STRESS_WORKER"
Pair = tuple[torch.Tensor, torch.Tensor]


def descendants(root: int) -> list[int]:
    """Live descendants of `root`, torchrun's workers (in sessions of their own) included."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def native_stacks(pids: list[int]) -> dict[int, str]:
    """`thread apply all bt` of each process (gdb attaches one at a time)."""
    stacks = {}
    for pid in pids:
        cmd = ["gdb", "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt 30"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            stacks[pid] = done.stdout
        except subprocess.TimeoutExpired:
            stacks[pid] = "gdb timed out"
    return stacks


def one_run(start: str, args: argparse.Namespace, root: Path, index: int) -> dict[str, Any]:
    cmd = [str(PHALANX), "run", "-n", "2", str(HERE / "fork_stress.py"),
           f"run.root={root}", *([f"data.worker_start={start}"] if start != "default" else []),
           *args.overrides]  # fmt: skip
    began = time.perf_counter()
    env = {**os.environ, WORKER_ENV: "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=env)  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=args.timeout)
        ok = proc.returncode == 0 and "forks=" in out
        forks = int(out.rsplit("forks=", 1)[1].split()[0]) if ok else 0
        seconds = time.perf_counter() - began
        return {"start": start, "outcome": "ok" if ok else "failed", "seconds": seconds,
                "forks": forks, "tail": "" if ok else out[-2000:]}  # fmt: skip
    except subprocess.TimeoutExpired:
        pids = [proc.pid, *descendants(proc.pid)]
        stacks = native_stacks(pids)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.communicate()
        folder = Path(f"{args.out}.stacks")
        folder.mkdir(parents=True, exist_ok=True)
        text = "\n".join(f"===== pid {pid}\n{stack}" for pid, stack in stacks.items())
        (folder / f"run-{index}-{start}.txt").write_text(text)
        in_fork = [pid for pid, s in stacks.items() if "PyOS_AfterFork_Child" in s]
        return {"start": start, "outcome": "hang", "seconds": args.timeout, "forks": 0,
                "stuck_in_fork": in_fork}  # fmt: skip


def summarize(results: list[dict[str, Any]], starts: list[str]) -> list[dict[str, Any]]:
    rows = []
    for start in starts:
        mine = [r for r in results if r["start"] == start]
        times = [r["seconds"] for r in mine if r["outcome"] == "ok"]
        rows.append({
            "start": start, "runs": len(mine),
            "hangs": sum(r["outcome"] == "hang" for r in mine),
            "hangs_in_fork": sum(bool(r.get("stuck_in_fork")) for r in mine),
            "failed": sum(r["outcome"] == "failed" for r in mine),
            # Each of 2 ranks starts its loaders `forks` times, 2 worker processes each time.
            "worker_processes": 2 * 2 * sum(r["forks"] for r in mine),
            "median_s": statistics.median(times) if times else None,
            "min_s": min(times, default=None), "max_s": max(times, default=None),
        })  # fmt: skip
    return rows


class Points(torch.utils.data.Dataset[Pair]):
    """Synthetic regression samples, made in __getitem__ so the workers do real work."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> Pair:
        gen = torch.Generator().manual_seed(self.seed * 100_003 + index)
        x = torch.randn(8, generator=gen)
        return x, x.sum(0, keepdim=True)


def step(model: nn.Module, batch: Pair) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def eval_step(model: nn.Module, batch: Pair) -> dict[str, torch.Tensor]:
    x, y = batch
    return {"sq_err": ((model(x) - y) ** 2).squeeze(1)}


def worker(overrides: list[str]) -> None:
    """One run (under `phalanx run`): what the loop repeats."""
    import phalanx

    base = [
        "train.epochs=8", "data.batch_size=16", "data.num_workers=2", "train.progress=false",
        "train.log_every=1000", "checkpoint.every_steps=0", "checkpoint.at_end=false",
    ]  # fmt: skip
    # A worker's arguments are `--config FILE` (written with `base` applied): base no more.
    argv = overrides if "--config" in overrides else [*base, *overrides]
    cfg = phalanx.parse_config(phalanx.TrainerConfig, argv)
    with phalanx.distributed(cfg) as d:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
        trainer = phalanx.Trainer(
            d, model=model, optimizer=lambda p: torch.optim.SGD(p, lr=0.01), train_step=step,
            train_data=Points(256, 1), eval_data=Points(64, 2), eval_step=eval_step,
        )  # fmt: skip
        trainer.fit()
        if d.env.is_main_process:
            # One persistent start for training, one per evaluation (every epoch).
            print(f"forks={1 + cfg.train.epochs}", flush=True)


def main() -> None:
    if os.environ.get(WORKER_ENV):  # a run's process (`phalanx run` rewrites its arguments)
        worker(sys.argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="runs per start method")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds before a hang")
    parser.add_argument("--load", type=int, default=1, help="busy processes beside the runs")
    parser.add_argument("--start", nargs="+", default=["fork", "forkserver"])
    parser.add_argument("--out", default=str(HERE / "results" / "fork_stress.json"))
    parser.add_argument("overrides", nargs="*", help="config overrides for every run")
    args = parser.parse_args()
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(args.load)]  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix="fork-stress-"))
    results: list[dict[str, Any]] = []
    try:
        for index in range(args.runs):
            for start in args.start:
                results.append(one_run(start, args, root, index))
                r = results[-1]
                print(f"run {index:3d} {start:10s} {r['outcome']:6s} {r['seconds']:6.1f} s",
                      flush=True)  # fmt: skip
                shutil.rmtree(root, ignore_errors=True)
    finally:
        for burner in burners:
            burner.kill()
        shutil.rmtree(root, ignore_errors=True)
    rows = summarize(results, args.start)
    print(f"\n{'start':12s} {'runs':>5s} {'hangs':>6s} {'in fork':>8s} {'failed':>7s} "
          f"{'workers':>8s} {'run s (median, min..max)':>26s}")  # fmt: skip
    for row in rows:
        spread = (f"{row['median_s']:.1f} ({row['min_s']:.1f}..{row['max_s']:.1f})"
                  if row["median_s"] is not None else "-")  # fmt: skip
        print(f"{row['start']:12s} {row['runs']:5d} {row['hangs']:6d} {row['hangs_in_fork']:8d} "
              f"{row['failed']:7d} {row['worker_processes']:8d} {spread:>26s}")  # fmt: skip
    record = {"when": datetime.now(timezone.utc).isoformat(), "host": platform.node(),
              "python": platform.python_version(), "cpus": os.cpu_count(), "load": args.load,
              "overrides": args.overrides, "summary": rows, "runs": results}  # fmt: skip
    write_record(Path(args.out), record)


if __name__ == "__main__":
    main()
