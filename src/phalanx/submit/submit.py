"""`phalanx submit`: run directory, code snapshot, rendered script, sbatch.

The run directory is decided here, at submit time, so that the job, its requeues and the user
all know it before the job starts: a script called with phalanx's config syntax is resolved once
(as `phalanx run` does: its config is validated and config.yaml written), other scripts get
runs/<job name>-<time>. The job's script, SLURM log and code snapshot live there too.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from phalanx.errors import UsageError
from phalanx.launch.local import resolve_run_dir
from phalanx.rundir.layout import create_fresh
from phalanx.submit import slurm_cli, snapshot
from phalanx.submit.config import SubmitConfig
from phalanx.submit.render import Job, command_line_options, render

SCRIPT_NAME = "job.sbatch"


@dataclass(frozen=True)
class Submission:
    job: Job
    text: str
    """The rendered sbatch script."""
    script_file: Path
    previous_code: Path | None = None
    """The earlier snapshot moved aside for this submission: put back if it is refused."""


def prepare(
    config: SubmitConfig, script: str, args: Sequence[str], *, environ: Mapping[str, str]
) -> Submission:
    """Resolve the run directory, take the snapshot, render and write the script."""
    source = Path(script)
    if not source.is_file():
        raise UsageError(f"training script '{script}' not found; give the path of a .py file")
    for name in config.env.pass_vars:
        if name not in environ:
            raise UsageError(
                f"env.pass_vars names {name}, which is not set here; export it before submitting"
            )
    source = source.resolve()
    resolved = resolve_run_dir(str(source), args)
    if resolved is not None:
        run_dir, args = resolved, ("--config", str(resolved / "config.yaml"))
    else:
        run_dir = create_fresh(Path("runs").resolve(), config.job.name or source.stem)
    try:
        return _write(config, source, tuple(args), run_dir)
    except BaseException:
        _forget(run_dir)  # a refused submission leaves nothing behind
        raise


def _write(config: SubmitConfig, source: Path, args: tuple[str, ...], run_dir: Path) -> Submission:
    workdir, relative, root = Path.cwd(), str(source), None
    if config.code.snapshot == "copy":
        root = snapshot.code_root(source, config.code.dir)
        if not source.is_relative_to(root):
            raise UsageError(f"script {source} is outside code.dir {root}; set code.dir")
        workdir, relative = run_dir / "code", str(source.relative_to(root))
    job = Job(config=config, run_dir=run_dir, workdir=workdir, script=relative, args=args)
    text = render(job)
    previous = None
    if root is not None:
        if workdir.exists():  # a run directory submitted again: keep what ran before
            stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
            previous = workdir.rename(workdir.with_name(f"code-before-{stamp}"))
        try:
            snapshot.take(root, workdir)
        except BaseException:
            _forget(run_dir, previous)
            raise
    script_file = run_dir / SCRIPT_NAME
    script_file.write_text(text)
    return Submission(job=job, text=text, script_file=script_file, previous_code=previous)


def submit(submission: Submission) -> str:
    """sbatch the written script; the job id (also appended to <run dir>/jobs.txt). When sbatch
    refuses the job, what prepare() created is removed again."""
    try:
        job_id = slurm_cli.sbatch(
            str(submission.script_file),
            pass_vars=submission.job.config.env.pass_vars,
            options=command_line_options(submission.job),
        )
    except BaseException:
        _forget(submission.job.run_dir, submission.previous_code)
        raise
    with open(submission.job.run_dir / "jobs.txt", "a") as jobs:
        jobs.write(job_id + "\n")
    return job_id


def dry_run(submission: Submission, *, check: bool) -> str | None:
    """Validate with `sbatch --test-only` when `check` (a cluster is reachable); then remove
    what prepare() created, since nothing is submitted."""
    try:
        report = None
        if check:
            report = slurm_cli.sbatch(
                str(submission.script_file),
                pass_vars=submission.job.config.env.pass_vars,
                options=command_line_options(submission.job),
                test_only=True,
            )
    finally:
        _forget(submission.job.run_dir, submission.previous_code)
    return report


def _forget(run_dir: Path, previous_code: Path | None = None) -> None:
    # Only what prepare() itself put there: a user's existing run.dir keeps everything else.
    ours = {"config.yaml", SCRIPT_NAME, "code", "logs", "diagnostics"}
    for name in ("code", SCRIPT_NAME):
        target = run_dir / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    if previous_code is not None:
        # A job submitted earlier may still be queued (or be requeued) and runs from code/.
        previous_code.rename(run_dir / "code")
        return
    left = {p.name for p in run_dir.iterdir()} if run_dir.is_dir() else set()
    if left <= ours and not (run_dir / "checkpoints").exists():
        shutil.rmtree(run_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            run_dir.parent.rmdir()  # the runs/ folder, when this made it and it is empty
