"""`phalanx sweep`: run a sweep file's trials here or as a SLURM array; summarise a sweep."""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from phalanx.submit.cli import add_settings_options


def add_parser(sub: Any) -> None:
    sweep = sub.add_parser(
        "sweep",
        help="grid/random sweep of a training script: trials here, or a SLURM job array",
        description="Resolve every trial of SPEC (a sweep YAML file, docs/tracking.md), then "
        "run them one after another here, or submit them as one SLURM job array (--slurm, "
        "with submit's --profile/--set settings). Prints the trials ranked by the metric. "
        "--summary DIR prints that table for an existing sweep directory.",
    )
    sweep.add_argument("spec", nargs="?", metavar="SPEC", help="sweep file (YAML)")
    sweep.add_argument("--summary", metavar="DIR", default=None, help="summarise a sweep dir")
    sweep.add_argument("--root", default="runs", metavar="DIR", help="where the sweep dir goes")
    sweep.add_argument("--slurm", action="store_true", help="submit one job array")
    sweep.add_argument("--wait", action="store_true", help="--slurm: wait, then summarise")
    add_settings_options(sweep)  # with --slurm


def cmd_sweep(args: argparse.Namespace) -> int:
    from phalanx.errors import UsageError
    from phalanx.sweep.run import prepare, run_local, submit_array, summarise, table
    from phalanx.sweep.spec import load_spec

    if args.summary:
        print(table(summarise(Path(args.summary))))
        return 0
    if not args.spec:
        raise UsageError("give a sweep file (phalanx sweep sweep.yaml) or --summary DIR")
    spec = load_spec(Path(args.spec))
    if args.slurm:
        config = _submit_config(args, spec.ranks)  # checked before any trial is resolved
    sweep_dir, trials = prepare(spec, Path(args.root))
    print(f"sweep directory: {sweep_dir} ({len(trials)} trials)", flush=True)
    if not args.slurm:
        failed = [k for k, code in enumerate(run_local(spec, sweep_dir, trials)) if code]
        print(table(summarise(sweep_dir)))
        return 1 if failed else 0
    job_id = submit_array(spec, sweep_dir, trials, config)
    print(f"submitted job array {job_id} (tasks 0-{len(trials) - 1})", flush=True)
    if args.wait:
        _wait(job_id)
        print(table(summarise(sweep_dir)))
    return 0


def _submit_config(args: argparse.Namespace, ranks: int) -> Any:
    """Submit settings as for `phalanx submit`; a trial's ranks per node default to the sweep's."""
    from phalanx.submit.profiles import resolve_submit_config

    config = resolve_submit_config(config_file=None, profile=args.profile,
                                   profiles_file=args.profiles, overrides=args.set,
                                   environ=os.environ)  # fmt: skip
    if config.job.gpus_per_node or config.job.ranks_per_node:
        return config
    return dataclasses.replace(config, job=dataclasses.replace(config.job, ranks_per_node=ranks))


def _wait(job_id: str) -> None:
    from phalanx.submit.jobs import job_running

    while job_running(job_id):
        time.sleep(2.0)  # polling the scheduler: it offers no event to wait on
