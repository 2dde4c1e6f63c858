"""Goodput under injected failures: a 2-node job on the test SLURM cluster (tests/support), ranks
killed with SIGKILL at a set mean time between failures, under several recovery policies; the
effective training time (useful step time / wall time) and where each failure's time went.

    python benchmarks/goodput.py [--mtbf 60] [--steps 3000] [--policies restart:auto,...]
        [--reps 1] [--seed 0] [--width 512] [--out PATH]

A policy is `<recovery>:<interval>`: recovery `restart` (`phalanx run --max-restarts`: torchrun
restarts the workers of every node in the job) or `requeue` (no in-job restart: the job step
fails and the batch script requeues the job, `srun ... || scontrol requeue`); interval a fixed
`checkpoint.every_steps` or `auto` (Young's interval from the measured save cost and `--mtbf`).
Every policy meets the same failures: the gaps between them are drawn once (exponential, mean
--mtbf, seeded), and each runs from the first step of the attempt the previous failure left
(the first from the job's first step): the clock stops while the job recovers, as failures
interrupt work in Young's model. The killed rank is drawn from the same seeded sequence. The
job: `--steps` steps of a 4-layer MLP (`--width`), 1 rank on each of 2 nodes (gloo),
synchronous full checkpoints.

Per failure: restart (the kill to the new worker's start: torchrun notices, stops the node's
other workers, the rendezvous, or the requeue and the job's new start), imports, process
group, build + checkpoint load, first step, and the recomputed steps (the killed attempt's
steps since the checkpoint resumed from, at the mean step time, less the first: timed above).
Effective training time: the useful time, --steps times the mean step time (steps whose time
holds no save), over the wall time from the batch script's first start to the last step; the
rest is the cold start, the failures, and the saves with whatever else slowed steps
("saves_and_other_s": what is left, so within the noise of the step time it can be negative).
Needs root and the SLURM daemons (as the suite's cluster layer does). `--smoke`: a short run,
rank 1 killed half a second into its attempt twice under restart:auto, once under requeue:auto.
"""

from __future__ import annotations

import time

T0 = time.time()  # a worker's start, before the heavy imports

import argparse  # noqa: E402
import contextlib  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

import phalanx  # noqa: E402
from phalanx.checkpoint.interval import failures_seen  # noqa: E402
from phalanx.track.files import read_records  # noqa: E402
from phalanx.train.checkpointing import ATTEMPTS  # noqa: E402

HERE = Path(__file__).resolve().parent
WORKER_ENV = "PHALANX_GOODPUT_BENCH_WORKER"
PHASES = ("restart_s", "imports_s", "process_group_s", "build_resume_s", "first_step_s",
          "recomputed_s")  # fmt: skip
FIRST_ADDRESS = """\
first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_ADDR=$(scontrol show node "$first_node" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)"""
"""The test cluster's second node name does not resolve: rank 0's address from SLURM."""


def main() -> None:
    if os.environ.get(WORKER_ENV):  # `phalanx run` hands the worker its resolved --config
        return worker(sys.argv[1:])
    args = parse_args()
    sys.path.insert(0, str(HERE.parent))  # the test cluster lives in the suite's support code
    from tests.support.slurm_cluster import SlurmCluster

    rng = random.Random(args.seed)
    failures = [(rng.expovariate(1 / args.mtbf), rng.randrange(2))
                for _ in range(args.max_failures)]  # fmt: skip
    if args.smoke:  # fixed, so that a fast machine cannot finish before the first one
        failures = [(0.5, 1), (0.5, 1)]
    samples: dict[str, list[dict[str, Any]]] = {p: [] for p in args.policies}
    given = args.slurm_state is not None  # the suite's running cluster, else one of our own
    cluster = SlurmCluster(Path(args.slurm_state)) if given else SlurmCluster.create().start()
    try:
        for rep in range(args.reps):
            for policy in args.policies if rep % 2 == 0 else args.policies[::-1]:
                samples[policy].append(run_policy(cluster, args, policy, failures))
                print(json.dumps({"rep": rep, "policy": policy, **samples[policy][-1]}),
                      flush=True)  # fmt: skip
    finally:
        if not given:
            cluster.stop()
    result = summarise(args, samples)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print_table(result)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mtbf", type=float, default=60.0, help="seconds between failures")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--policies", default="restart:auto,restart:20,restart:400,requeue:auto")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--max-failures", type=int, default=1000, help="then no more")
    parser.add_argument("--slurm-state", help="a running test cluster's folder (the suite's)")
    parser.add_argument("--smoke", action="store_true", help="a short run (the suite's)")
    parser.add_argument("--out", default=str(HERE / "results" / "goodput.json"))
    args = parser.parse_args()
    if args.smoke:  # a few seconds of training, two failures (one for the slow requeue)
        args.steps, args.width = 1500, 64
        args.policies = "restart:auto,requeue:auto"
    args.policies = args.policies.split(",")
    for policy in args.policies:
        recovery, _, interval = policy.partition(":")
        if recovery not in ("restart", "requeue") or not (interval == "auto" or
                                                          interval.isdigit()):  # fmt: skip
            parser.error(f"--policies {policy}: <restart|requeue>:<auto|steps>")
    return args


def run_policy(cluster: Any, args: argparse.Namespace, policy: str,
               failures: list[tuple[float, int]]) -> dict[str, Any]:  # fmt: skip
    """One job under `policy`, failures injected until it completes; its accounting."""
    folder = Path(tempfile.mkdtemp(prefix="goodput-bench-"))
    run_dir = folder / "run"
    job = cluster.sbatch(job_script(args, policy, folder, run_dir), "--nodes=2",
                         "--ntasks-per-node=1", f"--output={folder}/job.out",
                         f"--error={folder}/job.err")  # fmt: skip
    try:
        budget = failures[:1] if policy.startswith("requeue") and args.smoke else failures
        kills = inject(cluster, job, run_dir, budget, deadline=time.monotonic() + 3600)
        return account(folder, run_dir, kills, args.steps)
    finally:
        cluster.cancel(job)
        shutil.rmtree(folder, ignore_errors=True)


def job_script(args: argparse.Namespace, policy: str, folder: Path, run_dir: Path) -> str:
    recovery, _, interval = policy.partition(":")
    restarts = 1000 if recovery == "restart" else 0
    overrides = [f"run.dir={run_dir}", f"train.max_steps={args.steps}",
                 f"checkpoint.every_steps={interval}", f"checkpoint.mtbf_hours={args.mtbf / 3600}",
                 f"bench.width={args.width}"]  # fmt: skip
    step = ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "phalanx", "run", "-n", "1",
            f"--max-restarts={restarts}", __file__, *overrides]  # fmt: skip
    requeue = " || scontrol requeue $SLURM_JOB_ID" if recovery == "requeue" else ""
    return "\n".join((
        "#!/bin/bash",
        "#SBATCH --time=120",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        f"date +%s.%N >> {shlex.quote(str(folder / 'script_starts'))}",
        f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:$PATH OMP_NUM_THREADS=1 "
        f"{WORKER_ENV}=1",
        FIRST_ADDRESS,
        shlex.join(step) + requeue,
        "",
    ))  # fmt: skip


def inject(cluster: Any, job: str, run_dir: Path, failures: list[tuple[float, int]],
           *, deadline: float) -> list[dict[str, Any]]:  # fmt: skip
    """Kill ranks on the failure schedule until the job ends; each kill's time and rank. Each gap
    runs from the first step of the attempt after the previous failure: failures interrupt
    work (Young's model), none is injected while the job recovers."""
    from tests.support.slurm_cluster import TERMINAL_STATES

    kills: list[dict[str, Any]] = []
    pending = iter([*failures, (float("inf"), 0)])  # after the last one: none
    gap, rank = next(pending)
    polled = 0.0
    while time.monotonic() < deadline:
        if time.monotonic() - polled > 1.0:  # scontrol costs a process: once a second
            polled = time.monotonic()
            state = cluster.job(job).get("JobState", "")
            if state in TERMINAL_STATES:
                if state != "COMPLETED":
                    raise RuntimeError(f"job {job} ended {state}")
                return kills
        up = live_worker(run_dir, rank, after=kills[-1]["time"] if kills else 0.0)
        # After the last step a kill would cost no training: the schedule ends there.
        if up is not None and time.time() >= up[1] + gap and not (run_dir / "trained").exists():
            kills.append({"time": time.time(), "rank": rank})
            with contextlib.suppress(ProcessLookupError):  # it died on its own meanwhile
                os.kill(up[0], signal.SIGKILL)
            gap, rank = next(pending)
        time.sleep(0.02)  # the injector's clock tick
    raise RuntimeError(f"job {job} did not complete before the deadline: {cluster.job(job)}")


def live_worker(run_dir: Path, rank: int, *, after: float) -> tuple[int, float] | None:
    """(PID, time of its first step) of `rank`'s worker in an attempt that trained after the
    last failure (`after`); None while the job recovers (the old attempt's survivors are not yet
    stopped, and a second kill of that attempt would not be a second failure)."""
    path = run_dir / "pids" / f"rank-{rank}"
    try:
        written = path.stat().st_mtime
        if written <= after:
            return None
        pid = int(path.read_text())
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    return (pid, written) if stat.rpartition(")")[2].split()[0] not in "ZX" else None


def account(folder: Path, run_dir: Path, kills: list[dict[str, Any]], steps: int) -> dict:
    """Effective training time and the per-failure breakdown from the workers' marks."""
    attempts = [json.loads(x) for x in (run_dir / "marks.jsonl").read_text().splitlines()]
    lines = (x.split() for x in (run_dir / "steps.txt").read_text().splitlines())
    done = [(float(x[0]), float(x[1])) for x in lines if len(x) == 2]  # a killed rank's last
    # line may be cut short
    saved = saved_steps(folder)
    step_s = clean_step_s(done, saved, {a["first_step_done"] for a in attempts})
    started = float((folder / "script_starts").read_text().split()[0])
    wall = done[-1][1] - started
    per_failure = []
    for before, kill in zip([0.0, *(k["time"] for k in kills)], kills, strict=False):
        after = min((a for a in attempts if a["start"] > kill["time"]), key=lambda a: a["start"])
        # The killed attempt's last step (every attempt that is killed has stepped: see inject).
        last = max(s for s, t in done if before < t < kill["time"])
        redone = int(last) - (after["first_step"] - 1)
        per_failure.append({
            "restart_s": after["start"] - kill["time"],
            "imports_s": after["imported"] - after["start"],
            "process_group_s": after["distributed"] - after["imported"],
            "build_resume_s": after["train_start"] - after["distributed"],
            "first_step_s": after["first_step_done"] - after["train_start"],
            # The first of them is timed as first_step_s.
            "recomputed_steps": redone, "recomputed_s": max(redone - 1, 0) * step_s,
            "resumed_from": after["first_step"] - 1,
        })  # fmt: skip
    lost = [sum(f[k] for k in PHASES) for f in per_failure]
    first = min(attempts, key=lambda a: a["start"])
    cold = first["first_step_done"] - started
    return {
        "effective": steps * step_s / wall, "wall_s": wall, "useful_s": steps * step_s,
        "step_s": step_s, "failures": len(kills), "failure_lost_s": sum(lost),
        "saves": len(saved),
        "cold_start_s": cold, "saves_and_other_s": wall - steps * step_s - sum(lost) - cold,
        "per_failure": per_failure, "auto_lines": auto_lines(folder),
        "failures_recorded": failures_seen(read_records(run_dir / "diagnostics" / ATTEMPTS),
                                           time.time())[0],
    }  # fmt: skip


def clean_step_s(done: list[tuple[float, float]], saved: set[int], firsts: set[float]) -> float:
    """The mean time of a training step: consecutive steps, neither one's gap holding a save
    (whichever side of the step's end it falls) nor an attempt's start."""
    gaps = [b[1] - a[1] for a, b in itertools.pairwise(done)
            if b[0] == a[0] + 1 and not {b[0], a[0]} & saved and b[1] not in firsts]  # fmt: skip
    return statistics.fmean(gaps)


def saved_steps(folder: Path) -> set[int]:
    """The steps a checkpoint was written at, as the job logged them."""
    text = "".join(p.read_text() for p in folder.glob("job.*"))
    return {int(x) for x in re.findall(r"checkpoint step (\d+) written", text)}


def auto_lines(folder: Path) -> list[str]:
    """The interval announcements of checkpoint.every_steps=auto, as the job logged them."""
    text = "".join(p.read_text() for p in folder.glob("job.*"))
    return [x.partition("checkpoint.every_steps=auto: ")[2] for x in text.splitlines()
            if "checkpoint.every_steps=auto: " in x]  # fmt: skip


def summarise(args: argparse.Namespace, samples: dict[str, list[dict[str, Any]]]) -> dict:
    def spread(values: list[float]) -> dict[str, float]:
        return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
                "max": round(max(values), 4)}  # fmt: skip

    out: dict[str, Any] = {"args": vars(args), "samples": samples}
    for policy, runs in samples.items():
        out[policy] = {k: spread([r[k] for r in runs])
                       for k in ("effective", "failures", "failures_recorded", "wall_s",
                                 "step_s", "failure_lost_s",
                                 "cold_start_s", "saves_and_other_s")}  # fmt: skip
        every = [f for r in runs for f in r["per_failure"]]
        keys = (*PHASES, "recomputed_steps") if every else ()
        out[policy]["per_failure"] = {k: spread([f[k] for f in every]) for k in keys}
    return out


def print_table(result: dict[str, Any]) -> None:
    for policy in result["args"]["policies"]:
        row = result[policy]
        effective = row["effective"]
        phases = "  ".join(f"{k} {v['median']:.2f}" for k, v in row["per_failure"].items())
        print(f"{policy:14} effective {effective['median']:.3f} ({effective['min']:.3f}.."
              f"{effective['max']:.3f})  failures {row['failures']['median']:g}  wall "
              f"{row['wall_s']['median']:.0f} s  per failure (median): {phases}")  # fmt: skip


# The worker: a small model under the Trainer, one rank per node.


@dataclass(frozen=True, kw_only=True)
class Bench:
    width: int = 512  # the MLP's width


@dataclass(frozen=True, kw_only=True)
class Config(phalanx.TrainerConfig):
    bench: Bench = field(default_factory=Bench)
    """This benchmark's settings."""


def worker(argv: list[str]) -> None:
    marks = {"start": T0, "imported": time.time()}
    defaults = ["train.log_every=50", "train.progress=false", "track.plots=false",
                "data.batch_size=32", "data.num_workers=0"]  # fmt: skip
    cfg = phalanx.parse_config(Config, [*defaults, *argv])
    with phalanx.distributed(cfg) as d:
        marks["distributed"] = time.time()
        assert d.run_dir is not None
        width = cfg.bench.width
        data = torch.utils.data.TensorDataset(torch.randn(4096, width), torch.randn(4096, 1))
        layers = [m for _ in range(3) for m in (nn.Linear(width, width), nn.ReLU())]
        trainer = phalanx.Trainer(
            d, config=cfg, callbacks=[Marks(d.run_dir.path, marks)], train_data=data,
            model=lambda: nn.Sequential(*layers, nn.Linear(width, 1)),
            train_step=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]),
            optimizer=lambda p: torch.optim.AdamW(p, lr=1e-4),
        )  # fmt: skip
        trainer.fit()


class Marks(phalanx.Callback):
    """Rank 0 records this attempt's wall-clock marks and every step's end; each rank names its
    PID once training runs (what the injector kills)."""

    def __init__(self, run_dir: Path, marks: dict[str, float]) -> None:
        self.run_dir, self.marks = run_dir, marks
        self.steps: Any = None

    def on_train_start(self, trainer: phalanx.Trainer) -> None:
        self.marks["train_start"] = time.time()
        if trainer.env.rank == 0:
            self.steps = (self.run_dir / "steps.txt").open("a", buffering=1)

    def on_step_end(self, trainer: phalanx.Trainer) -> None:
        if "first_step" not in self.marks:  # marks first, then the PID the injector reads, so
            # that every attempt it kills has its marks (and has stepped)
            self.marks |= {"first_step_done": time.time(), "first_step": trainer.state.step}
            if self.steps is not None:
                with (self.run_dir / "marks.jsonl").open("a") as out:
                    out.write(json.dumps(self.marks) + "\n")
            pids, rank = self.run_dir / "pids", trainer.env.rank
            pids.mkdir(exist_ok=True)
            (pids / f"rank-{rank}.tmp").write_text(str(os.getpid()))
            (pids / f"rank-{rank}.tmp").replace(pids / f"rank-{rank}")
        if self.steps is None:
            return
        self.steps.write(f"{trainer.state.step} {time.time()}\n")
        if trainer.state.step == trainer.config.train.max_steps:  # before the final save
            (self.run_dir / "trained").touch()


if __name__ == "__main__":
    main()
