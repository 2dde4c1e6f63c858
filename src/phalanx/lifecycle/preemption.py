"""Preemption as a normal code path: a signal only sets a flag; the Trainer checkpoints at the
next step boundary on all ranks together, then rank 0 requeues the SLURM job and all exit.

The signal contract (docs/checkpoints.md, "Preemption"):
- SIGUSR2 means "checkpoint and come back": the job script asks SLURM for it ahead of the time
  limit (`#SBATCH --signal=USR2@120`), and `scancel --signal=USR2 JOB` sends it by hand. Not
  SIGUSR1: NCCL 2.12 caught SIGUSR1 for its own debugging and hid it from the program
  (NVIDIA/nccl#704, submitit#1697); SIGUSR2 was never taken.
- SIGTERM is what both a preemption and a plain `scancel` send. phalanx tells them apart by
  SLURM's PreemptTime: preempted -> checkpoint and requeue; cancelled -> checkpoint and end.
- The job's time limit is read from SLURM at start: shortly before it, the run checkpoints and
  requeues even if no signal comes.
- Outside SLURM a signal checkpoints and ends the run.
A run stopped this way never exits 0 (SLURM would record an unfinished run as COMPLETED): it
exits 128 + the signal number.
"""

from __future__ import annotations

import logging
import re
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from datetime import datetime
from types import FrameType

log = logging.getLogger("phalanx.preemption")

PREEMPT_SIGNAL = signal.SIGUSR2
HANDLED = (signal.SIGUSR2, signal.SIGTERM)


def _scontrol_job(job_id: str) -> str:
    try:
        done = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                              text=True, timeout=30, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def _field(record: str, name: str) -> str | None:
    match = re.search(rf"\b{name}=(\S+)", record)
    return match.group(1) if match else None


def _time(value: str | None) -> float | None:
    if not value or value in ("Unknown", "None"):
        return None
    try:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def slurm_times(job_id: str) -> tuple[float | None, float | None]:
    """(StartTime, EndTime) of the job as UNIX times; EndTime is its time limit."""
    record = _scontrol_job(job_id)
    return _time(_field(record, "StartTime")), _time(_field(record, "EndTime"))


def was_preempted(job_id: str) -> bool:
    """SLURM sets PreemptTime while it preempts a job; a user's scancel leaves it None."""
    value = _field(_scontrol_job(job_id), "PreemptTime")
    return value not in (None, "None", "Unknown")


class RunInterrupted(Exception):
    """Training stopped early by a signal or the time limit, after a checkpoint."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class PreemptionWatcher:
    """Installs the handlers (main thread only) and answers 'stop now?' and 'requeue?'."""

    def __init__(self, environ: Mapping[str, str], *, time_margin_s: float = 120.0,
                 read_time_limit: bool = True) -> None:  # fmt: skip
        self.job_id = environ.get("SLURM_JOB_ID")
        self.received: int | None = None
        self.time_margin_s = time_margin_s
        self.end_time: float | None = None
        if self.job_id and read_time_limit:
            start, self.end_time = slurm_times(self.job_id)
            if start is not None and self.end_time is not None:
                # At most a tenth of a short job: a 2-minute test job must still train (and not
                # requeue itself forever at its first step).
                self.time_margin_s = min(time_margin_s, 0.1 * (self.end_time - start))
        self._previous: dict[int, object] = {}
        if threading.current_thread() is threading.main_thread():
            for signum in HANDLED:
                self._previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Only a flag: saving inside a handler races the training step (Lightning#21406).
        self.received = signum

    def close(self) -> None:
        """Give the previous handlers back."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)  # type: ignore[arg-type]
        self._previous = {}

    def near_time_limit(self) -> bool:
        return self.end_time is not None and time.time() > self.end_time - self.time_margin_s

    @property
    def requested(self) -> bool:
        return self.received is not None or self.near_time_limit()

    def reason(self) -> str | None:
        """'signal SIGUSR2', 'time limit', or None."""
        if self.received is not None:
            return f"signal {signal.Signals(self.received).name}"
        return "time limit" if self.near_time_limit() else None

    def wants_requeue(self) -> bool:
        """Inside SLURM: USR2 or the time limit always; TERM only during a preemption."""
        if not self.job_id:
            return False
        if self.received == signal.SIGTERM:
            return was_preempted(self.job_id)
        return self.requested

    def exit_code(self) -> int:
        return 128 + int(self.received if self.received is not None else PREEMPT_SIGNAL)

    def requeue(self) -> bool:
        """`scontrol requeue` this job; False (and an error log) if SLURM refuses."""
        assert self.job_id is not None
        done = subprocess.run(["scontrol", "requeue", self.job_id], capture_output=True,
                              text=True, timeout=60, check=False)  # fmt: skip
        if done.returncode != 0:
            log.error("scontrol requeue %s failed: %s (submit with --requeue)", self.job_id,
                      done.stderr.strip())  # fmt: skip
        return done.returncode == 0
