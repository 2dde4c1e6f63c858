"""The launchers phalanx recognises, in detection priority order: one entry per launcher.

Adding a launcher is adding its module (a `from_<name>(environ) -> ClusterEnv` reader and an
`is_<name>(environ)` test), its name to `cluster_env.LauncherName` (the order there is the
priority order) and one entry here; `LAUNCHERS`, `--launcher`'s choices and `detect()` follow.
A test holds this table to that order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from phalanx.env.cluster_env import LAUNCHERS, ClusterEnv, LauncherName
from phalanx.env.local import from_local
from phalanx.env.mpi import Exchange, from_mpi, is_mpi
from phalanx.env.node_addr import NodeAddr
from phalanx.env.slurm import from_slurm, is_slurm_step
from phalanx.env.torchrun import from_torchrun, is_torchrun


@dataclass(frozen=True)
class Launcher:
    """How to recognise one launcher's processes and read their geometry."""

    name: LauncherName
    """ClusterEnv.launcher, and the value that forces it (--launcher, dist.launcher)."""
    detect: Callable[[Mapping[str, str]], bool]
    """True when the environment carries the launcher's variables."""
    build: Callable[[Mapping[str, str], Exchange, NodeAddr], ClusterEnv]
    """Reads the geometry; gets detect()'s collaborators (the MPI exchange, the node address
    lookup) and uses the ones it needs."""
    marker: str
    """The variables `detect` names when a forced launcher's are missing."""


LAUNCHER_TABLE = (
    # torchrun / TorchElastic first: it may run inside srun or mpirun, so its variables are the
    # truth.
    Launcher(
        name="torchrun",
        detect=is_torchrun,
        build=lambda environ, _exchange, _node_addr: from_torchrun(environ),
        marker="RANK, WORLD_SIZE, LOCAL_RANK (set by torchrun / phalanx run)",
    ),
    # MPI before SLURM: under `mpirun` inside `sbatch` every rank inherits SLURM variables of
    # another step.
    Launcher(
        name="mpi",
        detect=is_mpi,
        build=lambda environ, exchange, _node_addr: from_mpi(environ, exchange),
        marker="OMPI_COMM_WORLD_* or PMI_RANK + MPI_LOCALRANKID (set by mpirun)",
    ),
    # An srun task: only with SLURM_STEP_* variables (the batch script itself is no task).
    Launcher(
        name="slurm",
        detect=is_slurm_step,
        build=lambda environ, _exchange, node_addr: from_slurm(environ, node_addr),
        marker="SLURM_STEP_ID and SLURM_PROCID (set by srun, not in the batch script itself)",
    ),
    # No launcher: one process.
    Launcher(
        name="local",
        detect=lambda _environ: True,
        build=lambda environ, _exchange, _node_addr: from_local(environ),
        marker="none (always available)",
    ),
)

__all__ = ["LAUNCHERS", "LAUNCHER_TABLE", "Launcher"]
