"""What `phalanx top` shows, read from a run directory (and SLURM for a job): where training
stands (status.json, written by rank 0 at each logging point), the rate and ETA over the latest
records of metrics.jsonl, the newest valid checkpoint and its age, the nodes, the job's state,
and the last hang or node exclusion. Reading only: a run in progress is never disturbed."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phalanx.errors import UsageError

TAIL_BYTES = 65536
"""How much of metrics.jsonl's end is read for the rate: tens of records."""


def find_run(target: str) -> tuple[Path, str | None]:
    """(run directory, SLURM job id or None) from a run directory or a job id."""
    path = Path(target)
    if path.is_dir():
        if not any((path / n).exists() for n in ("status.json", "metrics.jsonl", "config.yaml")):
            raise UsageError(f"{target} is not a run directory (no config.yaml, metrics.jsonl "
                             "or status.json): give the folder a run writes into")  # fmt: skip
        jobs = (path / "jobs.txt").read_text().split() if (path / "jobs.txt").is_file() else []
        return path, (jobs[-1] if jobs else None)
    if not target.replace("_", "").isdigit():
        raise UsageError(f"{target!r} is neither a run directory nor a SLURM job id")
    from phalanx.submit.jobs import scontrol_job

    out = scontrol_job(target).get("StdOut", "")
    if not out or not (Path(out).parent / "config.yaml").exists():
        raise UsageError(f"no run directory found for job {target} (SLURM does not know it, or "
                         "its output is not in a run directory): phalanx top RUN_DIR")  # fmt: skip
    return Path(out).parent, target


@dataclass(frozen=True)
class Snapshot:
    run_dir: Path
    status: dict[str, Any]
    rate: float | None  # optimizer steps per second over the latest records
    checkpoint: tuple[int, float] | None  # (step, age in seconds)
    hosts: list[str]
    job: dict[str, str] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)

    @property
    def eta_s(self) -> float | None:
        total, step = self.status.get("total_steps") or 0, self.status.get("step") or 0
        if not self.rate or not total or self.finished:
            return None
        return max(0, total - step) / self.rate

    @property
    def finished(self) -> bool:
        return self.status.get("state") in ("done", "stop", "crash") or self.job.get(
            "JobState", "RUNNING"
        ) not in ("RUNNING", "PENDING", "REQUEUED", "COMPLETING", "CONFIGURING")


def tail_records(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    with open(path, "rb") as handle:
        handle.seek(max(0, path.stat().st_size - TAIL_BYTES))
        lines = handle.read().decode(errors="replace").splitlines()[1:]
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line being written, or cut by the seek
    return [r for r in records if "loss" in r and "time" in r]


def rate_of(records: list[dict[str, Any]], window: int = 10) -> float | None:
    recent = records[-window:]
    if len(recent) < 2 or recent[-1]["time"] <= recent[0]["time"]:
        return None
    steps = float(recent[-1]["step"] - recent[0]["step"])
    return steps / float(recent[-1]["time"] - recent[0]["time"])


STEP_DIR = re.compile(r"step-(0|[1-9]\d*)")
"""A committed checkpoint's folder (phalanx.checkpoint.store publishes it by a rename; read
here without importing torch, so that top starts at once)."""


def _checkpoint(run_dir: Path) -> tuple[int, float] | None:
    folder = run_dir / "checkpoints"
    steps = [p for p in folder.iterdir() if STEP_DIR.fullmatch(p.name)] if folder.is_dir() else []
    if not steps:
        return None
    newest = max(steps, key=lambda p: int(p.name.split("-")[1]))
    return int(newest.name.split("-")[1]), time.time() - newest.stat().st_mtime


def _events(run_dir: Path) -> list[str]:
    diagnostics, events = run_dir / "diagnostics", []
    hangs = sorted(diagnostics.glob("hang-*.txt")) if diagnostics.is_dir() else []
    if hangs:
        events.append(hangs[-1].read_text(errors="replace").splitlines()[0])
    excluded = diagnostics / "excluded-nodes.jsonl"
    if excluded.is_file():
        lines = excluded.read_text().splitlines()
        events += [json.loads(lines[-1])["line"]] if lines else []
    return events


def _hosts(run_dir: Path) -> list[str]:
    hosts = []
    for report in sorted((run_dir / "diagnostics").glob("node-*.json")):
        try:
            hosts.append(str(json.loads(report.read_text()).get("host", "?")))
        except (OSError, json.JSONDecodeError):
            continue
    return hosts


def read_snapshot(run_dir: Path, job_id: str | None) -> Snapshot:
    status_file = run_dir / "status.json"
    status: dict[str, Any] = {}
    if status_file.is_file():
        try:
            status = json.loads(status_file.read_text())
        except json.JSONDecodeError:
            status = {}
    job: dict[str, str] = {}
    if job_id:
        from phalanx.submit.jobs import scontrol_job

        try:
            job = scontrol_job(job_id)
        except UsageError:  # no SLURM commands here: the run directory alone
            job = {}
    # The rate between the last two logging points (status.json), else over the latest
    # records of metrics.jsonl (a run of an older phalanx).
    rate = status.get("steps_per_s") or rate_of(tail_records(run_dir / "metrics.jsonl"))
    return Snapshot(run_dir, status, rate,
                    _checkpoint(run_dir), _hosts(run_dir), job, _events(run_dir))  # fmt: skip
