"""SLURM job scripts and submission: `phalanx submit`, `status`, `logs`, `cancel`."""

from phalanx.submit.config import CodeSection, EnvSection, JobSection, LaunchSection, SubmitConfig
from phalanx.submit.render import Job, render

__all__ = [
    "CodeSection", "EnvSection", "Job", "JobSection", "LaunchSection", "SubmitConfig", "render",
]  # fmt: skip
