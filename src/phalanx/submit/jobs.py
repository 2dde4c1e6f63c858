"""`phalanx status`, `phalanx logs`, `phalanx cancel`: the jobs after submission.

A job is named by its id or by its run directory (whose jobs.txt lists the ids submit got).
Status asks squeue first (running and pending jobs), then sacct where accounting exists, then
scontrol (finished jobs stay there for MinJobAge); none of them is required.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from phalanx.errors import UsageError
from phalanx.submit import slurm_cli

SQUEUE_FORMAT = "%i|%j|%T|%M|%D|%R"
COLUMNS = ("JOBID", "NAME", "STATE", "TIME", "NODES", "REASON")


def job_id_of(target: str) -> str:
    """A job id from an id, or from a run directory's jobs.txt (its newest job)."""
    if target.replace("_", "").isdigit():
        return target
    jobs = Path(target) / "jobs.txt"
    if jobs.is_file():
        ids = jobs.read_text().split()
        if ids:
            return ids[-1]
    raise UsageError(f"{target!r} is neither a job id nor a run directory with jobs.txt")


def status_rows(targets: list[str]) -> list[tuple[str, ...]]:
    """One row per job: the user's queue when no targets are given."""
    ids = [job_id_of(t) for t in targets]
    argv = ["squeue", "--noheader", f"--format={SQUEUE_FORMAT}"]
    argv += [f"--jobs={','.join(ids)}"] if ids else [f"--user={_user()}"]
    rows = [tuple(line.split("|")) for line in _lines(_quiet(argv))]
    seen = {row[0] for row in rows}
    for job_id in ids:
        if job_id not in seen:
            rows.append(_finished(job_id))
    return rows


def _finished(job_id: str) -> tuple[str, ...]:
    """A job squeue no longer lists: sacct when accounting is on, else scontrol."""
    fmt = "--format=JobID,JobName,State,Elapsed,NNodes,ExitCode"
    for line in _lines(_quiet(["sacct", "-X", "-n", "-P", fmt, f"--jobs={job_id}"])):
        fields = line.split("|")
        if fields[0] == job_id:
            return (*fields[:5], f"exit {fields[5]}")
    info = scontrol_job(job_id)
    if not info:
        return (job_id, "?", "UNKNOWN", "", "", "not in squeue, sacct or scontrol")
    names = ("JobName", "JobState", "RunTime", "NumNodes")
    return (job_id, *(info.get(n, "?") for n in names), f"exit {info.get('ExitCode', '?')}")


def scontrol_job(job_id: str) -> dict[str, str]:
    text = _quiet(["scontrol", "show", "job", "--oneliner", job_id])
    fields: dict[str, str] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def format_rows(rows: list[tuple[str, ...]]) -> str:
    table = [COLUMNS, *rows]
    widths = [max(len(row[i]) if i < len(row) else 0 for row in table) for i in range(6)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)).rstrip()
        for row in table
    )


def log_file(target: str) -> Path:
    """The job's SLURM output file: from the run directory, or scontrol's StdOut."""
    run_dir = Path(target)
    job_id = job_id_of(target)
    if run_dir.is_dir():
        candidate = run_dir / f"slurm-{job_id}.out"
        if candidate.exists():
            return candidate
    out = scontrol_job(job_id).get("StdOut", "")
    if out:
        return Path(out)
    raise UsageError(
        f"no log found for job {job_id}: give its run directory (phalanx logs RUN_DIR)"
    )


def follow(path: Path, *, done: Callable[[], bool], poll_s: float = 0.5) -> Iterator[str]:
    """The file's text, then what is appended, until `done()` and nothing new is left."""
    position = 0
    while True:
        if path.exists():
            with open(path, errors="replace") as handle:
                handle.seek(position)
                chunk = handle.read()
                position = handle.tell()
            if chunk:
                yield chunk
                continue
        if done():
            return
        time.sleep(poll_s)  # polling a file another host writes: no event to wait on


def job_running(job_id: str) -> bool:
    return bool(_quiet(["squeue", "--noheader", "--format=%i", f"--jobs={job_id}"]).strip())


def cancel(target: str) -> str:
    job_id = job_id_of(target)
    slurm_cli.call(["scancel", job_id])
    return job_id


def _quiet(argv: list[str]) -> str:
    """A query whose failure (no accounting, job purged) just means 'nothing known'."""
    try:
        return slurm_cli.call(argv)
    except UsageError as error:
        if "not found on PATH" in str(error):
            raise
        return ""


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _user() -> str:
    return os.environ.get("USER") or os.environ.get("LOGNAME") or str(os.getuid())
