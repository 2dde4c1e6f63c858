"""The one read-only description of where this process runs, whatever started it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, get_args

from phalanx.errors import UsageError

LauncherName = Literal["torchrun", "mpi", "slurm", "local"]
"""The launchers phalanx recognises, in detection priority order (phalanx.env.launchers holds
one entry for each; the type checker holds each entry's name to this list)."""

LAUNCHERS: tuple[LauncherName, ...] = get_args(LauncherName)
"""Launcher names, in detection priority order (also the values of `--launcher`)."""

FIELDS = (
    "rank",
    "local_rank",
    "world_size",
    "local_world_size",
    "node_rank",
    "num_nodes",
    "master_addr",
    "master_port",
    "launcher",
    "job_id",
)
"""Stable field names of `phalanx info --json`; users parse them in job scripts."""


@dataclass(frozen=True, kw_only=True)
class ClusterEnv:
    """Geometry of the job as seen by this process; built once by `phalanx.env.detect`."""

    rank: int
    """Global rank of this process, 0..world_size-1."""
    local_rank: int
    """Rank among the processes of this node, 0..local_world_size-1."""
    world_size: int
    """Number of processes in the job."""
    local_world_size: int
    """Number of processes on this node."""
    node_rank: int
    """Index of this node, 0..num_nodes-1."""
    num_nodes: int
    """Number of nodes in the job."""
    master_addr: str
    """Host of rank 0, where the rendezvous store listens."""
    master_port: int
    """Port of the rendezvous store; 0 for a local single process (no store is needed)."""
    launcher: LauncherName
    """Which launcher started the process: one of phalanx.env.LAUNCHERS."""
    job_id: str | None
    """The scheduler's job id (SLURM_JOB_ID when set), else the launcher's run id, else None."""

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise UsageError(f"unknown launcher {self.launcher!r}; valid: {', '.join(LAUNCHERS)}")
        checks = (
            (self.world_size >= 1, f"world_size={self.world_size} must be >= 1"),
            (0 <= self.rank < self.world_size, f"rank={self.rank} not in 0..{self.world_size - 1}"),
            (
                1 <= self.local_world_size <= self.world_size,
                f"local_world_size={self.local_world_size} not in 1..world_size={self.world_size}",
            ),
            (
                0 <= self.local_rank < self.local_world_size,
                f"local_rank={self.local_rank} not in 0..{self.local_world_size - 1}",
            ),
            (
                1 <= self.num_nodes <= self.world_size,
                f"num_nodes={self.num_nodes} not in 1..world_size={self.world_size}",
            ),
            (
                0 <= self.node_rank < self.num_nodes,
                f"node_rank={self.node_rank} not in 0..{self.num_nodes - 1}",
            ),
            (0 <= self.master_port <= 65535, f"master_port={self.master_port} not in 0..65535"),
        )
        for ok, problem in checks:
            if not ok:
                raise UsageError(
                    f"inconsistent {self.launcher} environment: {problem}; "
                    "check the launcher's variables (phalanx info --json shows what was read)"
                )

    @property
    def is_main_process(self) -> bool:
        """True on global rank 0, the process that writes shared files."""
        return self.rank == 0

    @property
    def is_local_main_process(self) -> bool:
        """True on local rank 0 of each node."""
        return self.local_rank == 0

    def as_dict(self) -> dict[str, object]:
        """The fields under their stable names (see FIELDS)."""
        return dataclasses.asdict(self)


def read_int(environ: Mapping[str, str], name: str, *, launcher: str) -> int:
    """Read an integer variable, with a one-line error naming the variable when it is not one."""
    raw = environ.get(name)
    if raw is None:
        raise UsageError(
            f"{launcher} environment is missing {name}; was the process started by it?"
        )
    try:
        return int(raw.strip())
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not an integer ({launcher} environment)") from None


def read_port(environ: Mapping[str, str], default: int) -> int:
    """MASTER_PORT when set (it always wins), else the launcher's default."""
    raw = environ.get("MASTER_PORT")
    if raw is None or raw == "":
        return default
    if not raw.strip().isdigit() or not 1 <= int(raw) <= 65535:
        raise UsageError(f"MASTER_PORT={raw!r} is not a port number; set it to an integer 1..65535")
    return int(raw)
