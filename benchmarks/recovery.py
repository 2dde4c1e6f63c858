"""In-job recovery: from a rank killed with SIGKILL to the first step of the resumed run, under
`phalanx run --max-restarts 1` (torchrun restarts the whole local worker group), split where the
time goes; the recomputed steps (checkpoint → kill) are counted, not timed.

    python benchmarks/recovery.py [--nproc 2] [--reps 5] [--width 256] [--out PATH]

Each repetition launches a fresh job of a small MLP (`--width`, 4 layers, CPU/gloo or one GPU per
rank) checkpointing every 4 steps; on its first attempt rank 0 kills itself with SIGKILL right
after step 6 (the kill time written first). Rank 0 of each attempt records wall-clock marks:
process start (before `import torch`), imports done, process group up (`phalanx.distributed`),
training starts (model built and wrapped, checkpoint loaded: `on_train_start`) and its first
step done. The first attempt gives the cold start (launch → first step; cold_build_s: its build
and wrap, no checkpoint to load); the second the
recovery: kill → restart (torchrun notices the death, stops the survivors, starts new workers)
→ imports → process group → build + resume → first step.
"""

from __future__ import annotations

import time

T0 = time.time()  # this process's start, before the heavy imports

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from dataclasses import dataclass, field, replace  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

import phalanx  # noqa: E402

HERE = Path(__file__).resolve().parent
KILL_AT = 6  # after step 4's checkpoint: steps 5-6 are recomputed
WORKER_ENV = "PHALANX_RECOVERY_BENCH_WORKER"
PHASES = ("restart_s", "imports_s", "process_group_s", "build_resume_s", "first_step_s")


def main() -> None:
    if os.environ.get(WORKER_ENV):  # `phalanx run` hands the worker its resolved --config
        return worker(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--out", default=str(HERE / "results" / "recovery.json"))
    args = parser.parse_args()
    samples = []
    for rep in range(args.reps):
        samples.append(launch(args))
        print(json.dumps({"rep": rep, **samples[-1]}), flush=True)
    keys = [*PHASES, "recovery_s", "cold_start_s", "cold_build_s"]
    result: dict[str, Any] = {"args": vars(args), "samples": samples, "kill_at": KILL_AT}
    for key in keys:
        values = [s[key] for s in samples]
        result[key] = {"median": round(statistics.median(values), 3),
                       "min": round(min(values), 3), "max": round(max(values), 3)}  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for key in keys:
        cell = result[key]
        print(f"{key:16} {cell['median']:7.3f} s  ({cell['min']:.3f}..{cell['max']:.3f})")


def launch(args: argparse.Namespace) -> dict[str, float]:
    """One job, killed once and restarted; its marks turned into durations."""
    run_dir = Path(tempfile.mkdtemp(prefix="recovery-bench-"))
    try:
        started = time.time()
        command = [sys.executable, "-m", "phalanx", "run", "-n", str(args.nproc),
                   "--max-restarts", "1", __file__, f"run.dir={run_dir}",
                   f"bench.width={args.width}"]  # fmt: skip
        env = {**os.environ, WORKER_ENV: "1"}
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        first, second = (json.loads((run_dir / f"marks-{n}.json").read_text()) for n in (1, 2))
        killed = float((run_dir / "killed").read_text())
        assert second["first_step"] == 5, second  # resumed from step 4
        return {
            "restart_s": second["start"] - killed,
            "imports_s": second["imported"] - second["start"],
            "process_group_s": second["distributed"] - second["imported"],
            "build_resume_s": second["train_start"] - second["distributed"],
            "first_step_s": second["first_step_done"] - second["train_start"],
            "recovery_s": second["first_step_done"] - killed,
            "cold_start_s": first["first_step_done"] - started,
            "cold_build_s": first["train_start"] - first["distributed"],
        }
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


# The worker: a small model under the Trainer, killed once.


@dataclass(frozen=True, kw_only=True)
class Bench:
    width: int = 256  # the MLP's width


@dataclass(frozen=True, kw_only=True)
class Config(phalanx.TrainerConfig):
    bench: Bench = field(default_factory=Bench)
    """This benchmark's settings."""


class Marks(phalanx.Callback):
    """Rank 0's wall-clock marks of this attempt; the first attempt's rank 0 dies at KILL_AT."""

    def __init__(self, run_dir: Path, marks: dict[str, float]) -> None:
        self.run_dir, self.marks = run_dir, marks
        self.attempt = 2 if (run_dir / "killed").exists() else 1

    def on_train_start(self, trainer: phalanx.Trainer) -> None:
        self.marks["train_start"] = time.time()

    def on_step_end(self, trainer: phalanx.Trainer) -> None:
        if "first_step" not in self.marks:
            self.marks |= {"first_step_done": time.time(), "first_step": trainer.state.step}
            if trainer.env.rank == 0:
                path = self.run_dir / f"marks-{self.attempt}.json"
                path.write_text(json.dumps(self.marks))
        if self.attempt == 1 and trainer.state.step == KILL_AT and trainer.env.rank == 0:
            (self.run_dir / "killed").write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)


def worker(argv: list[str]) -> None:
    marks = {"start": T0, "imported": time.time()}
    defaults = ["train.max_steps=8", "checkpoint.every_steps=4", "train.log_every=4",
                "train.progress=false", "track.plots=false", "data.batch_size=32",
                "data.num_workers=0"]  # fmt: skip
    cfg = phalanx.parse_config(Config, [*defaults, *argv])
    cfg = replace(cfg, train=replace(cfg.train, max_steps=8))
    with phalanx.distributed(cfg) as d:
        marks["distributed"] = time.time()
        assert d.run_dir is not None
        width = cfg.bench.width
        data = torch.utils.data.TensorDataset(torch.randn(1024, width), torch.randn(1024, 1))
        trainer = phalanx.Trainer(
            d, config=cfg, callbacks=[Marks(d.run_dir.path, marks)], train_data=data,
            model=lambda: nn.Sequential(nn.Linear(width, width), nn.ReLU(),
                                        nn.Linear(width, width), nn.ReLU(),
                                        nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1)),
            train_step=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]),
            optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3),
        )  # fmt: skip
        trainer.fit()


if __name__ == "__main__":
    main()
