"""phalanx's own config sections. Users add theirs by subclassing `Config`:

    @dataclass(frozen=True, kw_only=True)
    class Train:
        lr: float = 3e-4
        '''Peak learning rate.'''

    @dataclass(frozen=True, kw_only=True)
    class MyConfig(phalanx.Config):
        train: Train = field(default_factory=Train)

Each field has a docstring right below it: `python train.py --help` shows it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal, get_args

from phalanx.errors import UsageError

Launcher = Literal["auto", "torchrun", "mpi", "slurm", "local"]
Backend = Literal["auto", "nccl", "gloo"]
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    """For direct construction in Python, where no loader has checked the Literal yet."""
    if value not in choices:
        raise UsageError(f"config {key}={value!r} is not one of: {', '.join(choices)}")


@dataclass(frozen=True, kw_only=True)
class DistConfig:
    """How this process joins the job (phalanx.init)."""

    backend: Backend = "auto"
    """Collective backend: auto (NCCL on CUDA, gloo on CPU), nccl or gloo."""
    timeout_s: float = 600.0
    """Seconds a collective waits for the slowest rank before failing instead of hanging."""
    rendezvous_timeout_s: float = 300.0
    """Seconds every rank may take to reach rank 0 when the job starts (under srun, mpirun or
    MASTER_ADDR by hand); then one line names the ranks that did not arrive. Generous: on a
    busy cluster python and torch may take minutes to import on every node."""
    launcher: Launcher = "auto"
    """Force a launcher instead of detecting it: auto, torchrun, mpi, slurm, local."""
    slurm: bool = True
    """Detect srun tasks; false ignores SLURM variables (e.g. a local run inside salloc)."""
    setup_logging: bool = True
    """Rank 0 logs INFO, other ranks WARNING+, every line prefixed with its rank."""
    flight_recorder: int = 2000
    """Entries of torch's flight recorder (its record of each rank's last collectives), read
    after a hang to name the ranks that never entered a collective; 0: off. The user's own
    TORCH_FR_BUFFER_SIZE / TORCH_NCCL_TRACE_BUFFER_SIZE win."""
    preflight: bool = False
    """After the rendezvous, every rank times a matrix product and one all-reduce (about a
    second; `phalanx doctor --preflight` alone): ranks far slower than the others, or whose
    check failed, are named with host and node in a warning before training starts."""

    def __post_init__(self) -> None:
        check_choice("dist.backend", self.backend, get_args(Backend))
        check_choice("dist.launcher", self.launcher, get_args(Launcher))
        if self.flight_recorder < 0:
            raise UsageError(f"config dist.flight_recorder={self.flight_recorder} must be >= 0")
        if not self.timeout_s > 0:
            raise UsageError(f"config dist.timeout_s={self.timeout_s} must be > 0 seconds")
        if not self.rendezvous_timeout_s > 0:
            raise UsageError(
                f"config dist.rendezvous_timeout_s={self.rendezvous_timeout_s} must be > 0 seconds"
            )
        if self.launcher == "slurm" and not self.slurm:
            raise UsageError(
                "config dist.launcher='slurm' conflicts with dist.slurm=false; drop one of them"
            )


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Where the run lives: its directory holds config, logs, diagnostics, checkpoints."""

    name: str = "run"
    """Run name; the directory is <root>/<name>-<SLURM job id> or <root>/<name>-<time>."""
    root: str = "runs"
    """Folder that holds the run directories."""
    dir: str = ""
    """This run's directory, filled in when the run is resolved; set it to continue a run."""
    dry_run: bool = False
    """Smoke run: a few steps of train and eval in a throw-away directory, nothing kept."""

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise UsageError(
                f"config run.name={self.name!r} must be letters, digits, '.', '_' or '-' "
                "(it names a directory)"
            )
        if not self.root:
            raise UsageError("config run.root is empty; give a folder such as 'runs'")


@dataclass(frozen=True, kw_only=True)
class Config:
    """The root config: phalanx's sections; subclass it to add your own."""

    run: RunConfig = field(default_factory=RunConfig)
    """The run directory and its name."""
    dist: DistConfig = field(default_factory=DistConfig)
    """Process group: launcher, backend, timeout."""
