"""What starting DataLoader workers from phalanx's fork server costs, by what the server preloads.

    python benchmarks/worker_start.py [--reps 7] [--workers 4] [--line "from x.y import Z"]
        [--out PATH]

Workers fork from a fork server and then re-run the main script's imports to unpickle what it
defines. A script that starts with `from transformers import LlamaForCausalLM` (the default
`--line`; the class lives in transformers.models.llama.modeling_llama) makes each worker import
that module unless the server imported it first. Two sides, each a fresh interpreter running the
same script (`--line`, a data set defined in the script, `--workers` workers through
`phalanx.data.make_eval_loader`, every batch taken once):
- `modules`: the server preloads the modules the script's names come from (phalanx's default);
- `packages`: it preloads only their top-level packages (phalanx before session 20): the
  baseline, the same code with `forking.script_modules` cut to package names.
Sides alternate in every repetition. Measured per run: wall time of the whole process, and the
machine's busy CPU time over it (from /proc/stat: the fork server's children are not the
parent's, so the parent's rusage misses them) - run it on an otherwise idle machine.
Prints medians (min..max) and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

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


def one(script: Path, side: str, workers: int) -> tuple[float, float]:
    """(wall s, machine CPU s) of one fresh run of the script."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cpu, start = busy_seconds(), time.perf_counter()
    subprocess.run([sys.executable, str(script), side, str(workers)], check=True, env=env)
    return time.perf_counter() - start, busy_seconds() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--line", default="from transformers import LlamaForCausalLM")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/worker_start.json"))
    args = parser.parse_args()
    if args.reps < 5 or args.workers < 1:
        parser.error("--reps must be >= 5 (median and spread) and --workers >= 1")
    runs: dict[str, dict[str, list[float]]] = {s: {"wall_s": [], "cpu_s": []} for s in SIDES}
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "worker_start_script.py"
        script.write_text(SCRIPT.replace("{line}", args.line))
        for side in SIDES:  # warm the page cache, untimed
            one(script, side, args.workers)
        for _ in range(args.reps):
            for side in SIDES:
                wall, cpu = one(script, side, args.workers)
                runs[side]["wall_s"].append(wall)
                runs[side]["cpu_s"].append(cpu)
    print(f"`{args.line}`, {args.workers} workers, {args.reps} alternating repetitions, medians")
    print(f"{'preload':<10}{'wall s':>22}{'machine CPU s':>24}")
    for side, got in runs.items():
        cells = [f"{statistics.median(v):.2f} ({min(v):.2f}..{max(v):.2f})" for v in got.values()]
        print(f"{side:<10}{cells[0]:>22}{cells[1]:>24}")
    record = {"date": datetime.now(timezone.utc).isoformat(), "line": args.line,
              "workers": args.workers, "reps": args.reps, "python": sys.version.split()[0],
              "runs": runs}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
