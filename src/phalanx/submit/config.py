"""The typed submission config: what `phalanx submit` renders into an sbatch script.

Sources, later wins: the defaults here < `--config` YAML file < a `--profile` of the profiles
file < command-line flags. Every value that ends in an `#SBATCH` line is checked for newlines;
every other value is shell-quoted by the renderer. Local paths are made absolute against the
directory `phalanx submit` runs in (with_absolute_paths): the job starts elsewhere.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, get_args

from phalanx.config.schema import check_choice
from phalanx.errors import UsageError

LaunchMode = Literal["srun", "torchrun", "mpirun"]
EnvKind = Literal["none", "modules", "venv", "conda", "container"]
Runtime = Literal["apptainer", "singularity", "charliecloud"]
GpuFlag = Literal["gres", "gpus-per-node"]
Snapshot = Literal["copy", "none"]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$|^\d+-\d+$")
_SIGNAL = re.compile(r"^(B:)?(R:)?[A-Z0-9]+(@\d+)?$")
# docker://, library://, oras://, docker-archive:, a charliecloud name:tag: not local paths.
_IMAGE_REF = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def time_limit_s(text: str) -> int:
    """SLURM's time formats in seconds: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        scale = [3600, 60, 1][: len(parts)]
    else:
        scale = {1: [60], 2: [60, 1], 3: [3600, 60, 1]}[len(parts)]
    return int(days or 0) * 86400 + sum(p * k for p, k in zip(parts, scale, strict=True))


def env_name(key: str, name: str) -> None:
    """A variable name that is safe to write unquoted into the script (`${NAME}`)."""
    if not _ENV_NAME.match(name):
        raise UsageError(f"{key}: {name!r} is not an environment variable name (A-Z, 0-9, _)")


def _positive(key: str, value: int, low: int = 1) -> None:
    if value < low:
        raise UsageError(f"submit {key}={value} must be >= {low}")


@dataclass(frozen=True, kw_only=True)
class JobSection:
    """The `#SBATCH` resources of the job."""

    name: str = ""
    """Job name (default: the script's file name)."""
    nodes: int = 1
    """Nodes of the job."""
    gpus_per_node: int = 0
    """GPUs per node; one rank per GPU (0: a CPU job)."""
    gpu_flag: GpuFlag = "gres"
    """How GPUs are requested: gres (--gres=gpu:N) or gpus-per-node (--gpus-per-node=N)."""
    ranks_per_node: int = 0
    """Ranks per node of a CPU job (0: one per GPU, or 1 without GPUs)."""
    cpus_per_task: int = 0
    """CPUs of each rank (0: SLURM's default); srun gets it explicitly."""
    mem: str = ""
    """Memory per node, e.g. 64G (empty: SLURM's default)."""
    time: str = "1:00:00"
    """Time limit: minutes, H:MM:SS or D-HH:MM:SS."""
    partition: str = ""
    """Partition (empty: the cluster's default)."""
    account: str = ""
    """Account to charge."""
    qos: str = ""
    """Quality of service."""
    constraint: str = ""
    """Node features, e.g. a100|h100."""
    reservation: str = ""
    """Reservation name."""
    exclusive: bool = False
    """Whole nodes only."""
    mail_user: str = ""
    """Address for SLURM's mails."""
    mail_type: str = ""
    """When to mail, e.g. END,FAIL."""
    signal: str = "USR2@180"
    """Preemption contract: SIGUSR2 to every task this many seconds before the time limit."""
    requeue: bool = True
    """Let SLURM (and phalanx after a checkpoint) requeue the job."""
    extra: tuple[str, ...] = ()
    """More #SBATCH options, each like --licenses=foo:1."""

    def __post_init__(self) -> None:
        check_choice("submit job.gpu_flag", self.gpu_flag, get_args(GpuFlag))
        _positive("job.nodes", self.nodes)
        for key in ("gpus_per_node", "ranks_per_node", "cpus_per_task"):
            _positive(f"job.{key}", getattr(self, key), 0)
        if not _TIME.match(self.time):
            raise UsageError(
                f"submit job.time={self.time!r} is not a SLURM time: use minutes, H:MM:SS or "
                "D-HH:MM:SS"
            )
        if self.signal and not _SIGNAL.match(self.signal):
            raise UsageError(f"submit job.signal={self.signal!r} is not like USR2@180")
        for key, value in vars(self).items():
            for text in value if isinstance(value, tuple) else (value,):
                if isinstance(text, str) and ("\n" in text or "\r" in text):
                    raise UsageError(
                        f"submit job.{key} contains a newline; #SBATCH values must be one line"
                    )
        for item in self.extra:
            if not item.startswith("--"):
                raise UsageError(f"submit job.extra item {item!r} must start with -- (an option)")

    @property
    def effective_signal(self) -> str:
        """The signal option, its lead time capped at a tenth of the time limit: a 3-minute
        test job must not be told at its start that its time is up (and requeue forever)."""
        name, at, lead = self.signal.partition("@")
        if not at:
            return self.signal
        cap = max(1, time_limit_s(self.time) // 10)
        return f"{name}@{min(int(lead), cap)}"

    @property
    def tasks_per_node(self) -> int:
        return self.ranks_per_node or self.gpus_per_node or 1


@dataclass(frozen=True, kw_only=True)
class LaunchSection:
    """How the ranks are started inside the job."""

    mode: LaunchMode = "srun"
    """srun: one task per rank; torchrun: one task per node running phalanx run; mpirun: one
    MPI rank per GPU (the Horovod model)."""
    python: str = "python"
    """The interpreter inside the job's environment."""
    mpirun_args: tuple[str, ...] = ()
    """Extra mpirun options, e.g. --mca,btl_tcp_if_include,ib0."""

    def __post_init__(self) -> None:
        check_choice("submit launch.mode", self.mode, get_args(LaunchMode))


@dataclass(frozen=True, kw_only=True)
class EnvSection:
    """The software environment each node sets up before launching."""

    kind: EnvKind = "none"
    """none, modules, venv, conda or container."""
    modules: tuple[str, ...] = ()
    """Environment modules to load after `module purge` (kind=modules, or with others)."""
    module_paths: tuple[str, ...] = ()
    """Extra modulefile directories (`module use`), e.g. a project's own modulefiles."""
    venv: str = ""
    """Path of a virtual environment to activate (kind=venv)."""
    conda: str = ""
    """Name or path of a conda environment to activate (kind=conda)."""
    image: str = ""
    """Container image: a .sif file, or a directory for charliecloud, or a URI such as
    docker://… (kind=container)."""
    runtime: Runtime = "apptainer"
    """Container runtime: apptainer, singularity or charliecloud."""
    binds: tuple[str, ...] = ()
    """Paths mounted into the container, SRC[:DST] (the run directory always is)."""
    vars: tuple[str, ...] = ()
    """Variables set in the script, NAME=VALUE (e.g. NCCL_IB_GID_INDEX=3). Not for secrets."""
    pass_vars: tuple[str, ...] = ()
    """Names of variables taken from the submitting shell by name, never written into the
    script (API keys, proxies): WANDB_API_KEY,HTTPS_PROXY."""
    setup: tuple[str, ...] = ()
    """Extra shell lines run before the launch (written as given: trusted input)."""

    def __post_init__(self) -> None:
        check_choice("submit env.kind", self.kind, get_args(EnvKind))
        check_choice("submit env.runtime", self.runtime, get_args(Runtime))
        needs = {"modules": "modules", "venv": "venv", "conda": "conda", "container": "image"}
        key = needs.get(self.kind)
        if key is not None and not getattr(self, key):
            raise UsageError(f"submit env.kind={self.kind} needs env.{key}")
        for item in self.vars:
            name, sep, _ = item.partition("=")
            if not sep:
                raise UsageError(f"submit env.vars item {item!r} must be NAME=VALUE")
            env_name("submit env.vars", name)
        for name in self.pass_vars:
            env_name("submit env.pass_vars", name)


@dataclass(frozen=True, kw_only=True)
class CodeSection:
    """What the job runs."""

    snapshot: Snapshot = "copy"
    """copy: the code directory is copied into <run dir>/code at submit and the job runs that
    copy (queued and requeued jobs run what was submitted); none: run in place."""
    dir: str = ""
    """The directory to snapshot (default: the script's git work tree, else its directory)."""

    def __post_init__(self) -> None:
        check_choice("submit code.snapshot", self.snapshot, get_args(Snapshot))


@dataclass(frozen=True, kw_only=True)
class SubmitConfig:
    """Everything `phalanx submit` needs besides the training script and its arguments."""

    job: JobSection = field(default_factory=JobSection)
    """Resources."""
    launch: LaunchSection = field(default_factory=LaunchSection)
    """Launch mode."""
    env: EnvSection = field(default_factory=EnvSection)
    """Software environment."""
    code: CodeSection = field(default_factory=CodeSection)
    """Code snapshot."""


def local_path(value: str, base: Path) -> str:
    """A path as the job must see it: `~` expanded, a relative one taken from `base`."""
    if not value:
        return value
    return os.path.normpath(base / Path(value).expanduser())


def _maybe_path(value: str, base: Path) -> str:
    """A value that is a path only when it looks like one (a conda env, the interpreter)."""
    return local_path(value, base) if "/" in value or value.startswith("~") else value


def _image(env: EnvSection, base: Path) -> str:
    if _IMAGE_REF.match(env.image):
        return env.image
    if env.runtime == "charliecloud" and "/" not in env.image and not (base / env.image).exists():
        return env.image  # the name of an image in ch-image's storage
    return local_path(env.image, base)


def _bind(item: str, base: Path) -> str:
    source, sep, target = item.partition(":")  # SRC[:DST[:OPTS]]: DST lives in the container
    return local_path(source, base) + sep + target


def with_absolute_paths(config: SubmitConfig, base: Path) -> SubmitConfig:
    """The config with every local path absolute, taken from `base` (the submit directory):
    the job script `cd`s into the code snapshot before it launches. URIs, module and conda
    names stay as given."""
    env = config.env
    env = replace(
        env,
        image=_image(env, base),
        venv=local_path(env.venv, base),
        conda=_maybe_path(env.conda, base),
        module_paths=tuple(local_path(p, base) for p in env.module_paths),
        binds=tuple(_bind(b, base) for b in env.binds),
    )
    launch = replace(config.launch, python=_maybe_path(config.launch.python, base))
    code = replace(config.code, dir=local_path(config.code.dir, base))
    return replace(config, env=env, launch=launch, code=code)
