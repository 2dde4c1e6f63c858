"""The job commands of the `phalanx` CLI: submit, status, logs, cancel."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

# Flags that are shorthands for config keys (the same names as sbatch's where one exists).
SHORTHANDS = (
    (("-N", "--nodes"), "job.nodes", "nodes"),
    (("-G", "--gpus-per-node"), "job.gpus_per_node", "GPUs per node (one rank each)"),
    (("-n", "--ranks-per-node"), "job.ranks_per_node", "ranks per node of a CPU job"),
    (("-c", "--cpus-per-task"), "job.cpus_per_task", "CPUs per rank"),
    (("-t", "--time"), "job.time", "time limit (minutes, H:MM:SS, D-HH:MM:SS)"),
    (("-p", "--partition"), "job.partition", "partition"),
    (("-A", "--account"), "job.account", "account"),
    (("-J", "--job-name"), "job.name", "job name"),
    (("--mode",), "launch.mode", "srun | torchrun | mpirun"),
)


def add_settings_options(parser: argparse.ArgumentParser) -> None:
    """--profile, --profiles, --set: the submit settings, shared by submit, env and sweep."""
    parser.add_argument("--profile", default=None, help="a named preset of the profiles file")
    parser.add_argument("--profiles", default=None, metavar="FILE",
                        help="profiles file (default $PHALANX_PROFILES or "
                        "~/.config/phalanx/profiles.yaml)")  # fmt: skip
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="any submit setting, e.g. env.modules=cuda/12.4,nccl")  # fmt: skip


def add_parsers(sub: Any) -> None:
    submit = sub.add_parser(
        "submit",
        help="write a SLURM job script for a training script and submit it",
        description="Render an sbatch script (launch mode, environment, preemption defaults) "
        "into a new run directory with a snapshot of the code, and submit it. Settings: "
        "defaults < --config FILE < --profile NAME < flags and --set KEY=VALUE.",
    )
    for flags, key, text in SHORTHANDS:
        submit.add_argument(*flags, dest=key, default=None, help=f"{text} ({key})")
    add_settings_options(submit)
    submit.add_argument("--config", default=None, metavar="FILE", help="submit settings (YAML)")
    submit.add_argument("--dry-run", action="store_true",
                        help="print the script (checked with sbatch --test-only); "
                        "submit nothing")  # fmt: skip
    submit.add_argument("script", help="training script")
    submit.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")

    env = sub.add_parser(
        "env",
        help="write set-up files for the cluster: venv build job, conda file, Apptainer def",
        description="Write what builds the job's software environment, matching the submit "
        "settings (profile modules, partition): 'venv' a job script that builds a venv on a "
        "compute node, 'conda' an environment.yml, 'apptainer' a definition file. torch and "
        "phalanx are pinned to the versions running here.",
    )
    env.add_argument("kind", choices=("venv", "conda", "apptainer"), help="what to write")
    add_settings_options(env)
    env.add_argument("--requirements", default=None, metavar="FILE", help="pip requirements")
    env.add_argument("--project", default=None, metavar="DIR",
                     help="a Python project (pyproject.toml) to install too")  # fmt: skip
    env.add_argument("--path", default=None, metavar="DIR", help="venv: where to build it")
    env.add_argument("--name", default="phalanx", help="conda: environment name")
    env.add_argument("-o", "--output", default=None, metavar="FILE", help="write to FILE")

    status = sub.add_parser("status", help="state of your jobs (squeue, sacct, scontrol)")
    status.add_argument("jobs", nargs="*", metavar="JOB", help="job ids or run directories")
    logs = sub.add_parser("logs", help="print a job's SLURM log")
    logs.add_argument("job", metavar="JOB", help="job id or run directory")
    logs.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")
    cancel = sub.add_parser("cancel", help="cancel a job (it checkpoints and is not requeued)")
    cancel.add_argument("job", metavar="JOB", help="job id or run directory")


def _cmd_submit(args: argparse.Namespace) -> int:
    from phalanx.submit.profiles import resolve_submit_config
    from phalanx.submit.slurm_cli import controller_reachable
    from phalanx.submit.submit import dry_run, prepare, submit

    flags = [f"{key}={getattr(args, key)}" for _, key, _ in SHORTHANDS if getattr(args, key)]
    config = resolve_submit_config(
        config_file=args.config, profile=args.profile, profiles_file=args.profiles,
        overrides=[*flags, *args.set], environ=os.environ,
    )  # fmt: skip
    script_args = args.args[1:] if args.args[:1] == ["--"] else args.args
    submission = prepare(config, args.script, script_args, environ=os.environ)
    if args.dry_run:
        print(submission.text, end="")
        report = dry_run(submission, check=controller_reachable())
        note = f"sbatch --test-only: {report}" if report else "not checked: no SLURM controller"
        print(f"# {note}", file=sys.stderr)
        return 0
    job_id = submit(submission)
    print(f"submitted job {job_id}\nrun directory: {submission.job.run_dir}")
    return 0


def _cmd_env(args: argparse.Namespace) -> int:
    from importlib.metadata import version
    from pathlib import Path

    from phalanx.errors import UsageError
    from phalanx.submit.envkit import Recipe, apptainer_def, conda_file, venv_job
    from phalanx.submit.profiles import resolve_submit_config

    config = resolve_submit_config(config_file=None, profile=args.profile,
                                   profiles_file=args.profiles, overrides=args.set,
                                   environ=os.environ)  # fmt: skip
    for flag, value in (("--requirements", args.requirements), ("--project", args.project)):
        if value is not None and not Path(value).exists():
            raise UsageError(f"{flag} {value!r} does not exist")
    recipe = Recipe(
        torch=f"torch=={version('torch').split('+')[0]}",
        phalanx=_phalanx_requirement(version("phalanx")),
        python=".".join(map(str, sys.version_info[:2])),
        requirements=Path(args.requirements).resolve() if args.requirements else None,
        project=Path(args.project).resolve() if args.project else None,
    )
    if args.kind == "venv":
        if not args.path:
            raise UsageError("phalanx env venv needs --path DIR (where the job builds the venv)")
        text = venv_job(config, recipe, Path(args.path).absolute())
    elif args.kind == "conda":
        text = conda_file(recipe, args.name)
    else:
        text = apptainer_def(recipe)
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def _phalanx_requirement(installed: str) -> str:
    """phalanx as installed here: its checkout when installed from a local folder (pip -e),
    else the released version."""
    import json
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        origin = json.loads(distribution("phalanx").read_text("direct_url.json") or "{}")
    except (PackageNotFoundError, json.JSONDecodeError):
        origin = {}
    url = str(origin.get("url", ""))
    return url.removeprefix("file://") if url.startswith("file://") else f"phalanx=={installed}"


def _cmd_status(args: argparse.Namespace) -> int:
    from phalanx.submit.jobs import format_rows, status_rows

    print(format_rows(status_rows(list(args.jobs))))
    return 0


def _cmd_logs(args: argparse.Namespace) -> int:
    from phalanx.submit.jobs import follow, job_id_of, job_running, log_file

    path = log_file(args.job)
    if not args.follow:
        sys.stdout.write(path.read_text(errors="replace") if path.exists() else "")
        return 0
    job_id = job_id_of(args.job)
    for chunk in follow(path, done=lambda: not job_running(job_id)):
        sys.stdout.write(chunk)
        sys.stdout.flush()
    return 0


def _cmd_cancel(args: argparse.Namespace) -> int:
    from phalanx.submit.jobs import cancel

    print(f"cancelled job {cancel(args.job)}")
    return 0


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "submit": _cmd_submit,
    "env": _cmd_env,
    "status": _cmd_status,
    "logs": _cmd_logs,
    "cancel": _cmd_cancel,
}
