"""Run a sweep: resolve every trial first (a bad value fails before anything runs), then run
them one after another here, or submit one SLURM job array; summarise from the run directories.

Layout: <root>/sweep-<name>-<time>/
    sweep.json        the spec and the trials (parameters of trial K)
    trial-K/          trial K's run directory (config.yaml, metrics.jsonl, checkpoints ...)
    summary.json      written by `summarise`
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from phalanx.errors import UsageError
from phalanx.launch.local import resolve_run_dir
from phalanx.rundir.layout import create_fresh
from phalanx.submit import slurm_cli, snapshot
from phalanx.submit.config import SubmitConfig
from phalanx.submit.render import Job, command_line_options, render
from phalanx.sweep.spec import SweepSpec, expand, overrides
from phalanx.track.files import read_records

SPEC_FILE = "sweep.json"


def prepare(spec: SweepSpec, root: Path) -> tuple[Path, list[dict[str, Any]]]:
    """Create the sweep directory and resolve each trial's config into trial-K/."""
    trials = expand(spec)
    sweep_dir = create_fresh(root.resolve(), f"sweep-{spec.name}")
    record = {"spec": {**asdict(spec), "script": str(spec.script.resolve())}, "trials": trials}
    (sweep_dir / SPEC_FILE).write_text(json.dumps(record, indent=2, default=str) + "\n")
    try:
        for k, trial in enumerate(trials):
            args = [*spec.args, *overrides(trial), f"run.dir={sweep_dir / f'trial-{k}'}"]
            if resolve_run_dir(str(spec.script), args) is None:
                raise UsageError(f"{spec.script} takes no config overrides: use parse_config")
    except BaseException:
        shutil.rmtree(sweep_dir, ignore_errors=True)  # nothing ran: leave nothing behind
        raise
    return sweep_dir, trials


def run_local(spec: SweepSpec, sweep_dir: Path, trials: list[dict[str, Any]]) -> list[int]:
    """Each trial in turn (`phalanx run -n ranks`, or the script itself for one rank);
    returns the exit codes."""
    codes = []
    for k in range(len(trials)):
        config = sweep_dir / f"trial-{k}" / "config.yaml"
        print(f"trial {k}/{len(trials)}: {' '.join(overrides(trials[k]))}", flush=True)
        # One rank needs no torchrun agent: the script alone is a one-rank local run.
        launcher = ["-m", "phalanx", "run", "-n", str(spec.ranks)] if spec.ranks > 1 else []
        done = subprocess.run(
            [sys.executable, *launcher, str(spec.script), "--config", str(config)], check=False
        )
        codes.append(done.returncode)
    return codes


def submit_array(
    spec: SweepSpec, sweep_dir: Path, trials: list[dict[str, Any]], config: SubmitConfig
) -> str:
    """One job array, task K = trial K, with the code snapshotted once for all tasks."""
    script = spec.script.resolve()
    root = snapshot.code_root(script, config.code.dir)
    workdir, relative = Path.cwd(), str(script)
    if config.code.snapshot == "copy" and script.is_relative_to(root):
        workdir, relative = sweep_dir / "code", str(script.relative_to(root))
        snapshot.take(root, workdir)
    job = Job(config=config, run_dir=sweep_dir, workdir=workdir, script=relative, args=(),
              trials=len(trials))  # fmt: skip
    script_file = sweep_dir / "job.sbatch"
    script_file.write_text(render(job))
    job_id = slurm_cli.sbatch(
        str(script_file), pass_vars=config.env.pass_vars, options=command_line_options(job)
    )
    (sweep_dir / "jobs.txt").write_text(job_id + "\n")
    return job_id


def summarise(sweep_dir: Path) -> list[dict[str, Any]]:
    """One row per trial: its parameters, the metric's last value, and whether it finished;
    sorted best first (trials without the metric last). Also written to summary.json."""
    try:
        record = json.loads((sweep_dir / SPEC_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        raise UsageError(
            f"{sweep_dir} is not a sweep directory (no readable {SPEC_FILE})"
        ) from None
    metric, mode = record["spec"]["metric"], record["spec"]["mode"]
    rows = []
    for k, params in enumerate(record["trials"]):
        values = [r[metric] for r in read_records(sweep_dir / f"trial-{k}" / "metrics.jsonl")
                  if isinstance(r.get(metric), (int, float))]  # fmt: skip
        rows.append({"trial": k, **params, metric: values[-1] if values else None,
                     "ended": _finished(sweep_dir / f"trial-{k}")})  # fmt: skip
    sign = -1.0 if mode == "max" else 1.0
    rows.sort(key=lambda r: (r[metric] is None, sign * (r[metric] or 0.0), r["trial"]))
    (sweep_dir / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    return rows


def _finished(trial_dir: Path) -> bool:
    return (trial_dir / "metrics.csv").exists()  # written when fit() ends (not on a crash)


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return "(no trials)"
    columns = list(rows[0])
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else str(value)
    return str(value)
