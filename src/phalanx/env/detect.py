"""detect(): which launcher started this process, in the fixed, documented priority order of
phalanx.env.launchers.LAUNCHER_TABLE (torchrun, MPI, an srun task, else one local process).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from phalanx.env.cluster_env import ClusterEnv
from phalanx.env.launchers import LAUNCHER_TABLE, LAUNCHERS, Launcher
from phalanx.env.mpi import Exchange, is_mpi, mpi4py_exchange
from phalanx.env.node_addr import NodeAddr, node_address
from phalanx.env.slurm import is_slurm_step, step_tasks_on_this_node
from phalanx.env.torchrun import is_torchrun
from phalanx.errors import UsageError


def detect(
    environ: Mapping[str, str] | None = None,
    *,
    launcher: str = "auto",
    slurm: bool = True,
    mpi_exchange: Exchange = mpi4py_exchange,
    node_addr: NodeAddr = node_address,
) -> ClusterEnv:
    """Detect the environment of this process.

    `launcher` forces one of LAUNCHERS instead of "auto"; `slurm=False` ignores SLURM variables
    (e.g. for a local test run inside an allocation). Under MPI without MASTER_ADDR this is a
    collective call (see phalanx.env.mpi). Under srun without MASTER_ADDR, `node_addr` turns
    the first node's name into an address (it may ask `scontrol show node`).
    """
    environ = os.environ if environ is None else environ
    if launcher != "auto" and launcher not in LAUNCHERS:
        raise UsageError(f"unknown launcher {launcher!r}; valid: auto, {', '.join(LAUNCHERS)}")
    if launcher == "slurm" and not slurm:
        raise UsageError("launcher 'slurm' conflicts with SLURM detection turned off; drop one")

    def found(entry: Launcher) -> bool:
        return (slurm or entry.name != "slurm") and entry.detect(environ)

    if launcher == "auto":
        chosen = next(entry for entry in LAUNCHER_TABLE if found(entry))
    else:
        chosen = LAUNCHER_TABLE[LAUNCHERS.index(launcher)]
    if not found(chosen):
        raise UsageError(
            f"launcher {chosen.name!r} was asked for but its variables are missing: "
            f"{chosen.marker}; start the script with that launcher or use launcher 'auto'"
        )
    if chosen.name == "torchrun" and slurm and "TORCHELASTIC_RUN_ID" in environ:
        # Only a real elastic agent spawns workers; env:// variables set by hand inside one
        # srun task per process are a legitimate (if unusual) set-up.
        refuse_nested_launch(environ, what="torchrun")
    return chosen.build(environ, mpi_exchange, node_addr)


def refuse_nested_launch(environ: Mapping[str, str], *, what: str) -> None:
    """Refuse a process launcher inside an srun step that already runs several tasks per node.

    srun starts one task per slot; a launcher in each of them would start its own workers and
    the node would run tasks x workers processes (the classic double spawn). One launcher per
    node (srun --ntasks-per-node=1) is the supported multi-node pattern.
    """
    if not is_slurm_step(environ):
        return
    tasks = step_tasks_on_this_node(environ)
    if tasks > 1:
        raise UsageError(
            f"{what} runs inside an srun step with {tasks} tasks on this node, so every task "
            f"would spawn its own workers (double spawn); use 'srun --ntasks-per-node=1' with "
            f"{what}, or drop {what} and let srun start one task per GPU"
        )


def is_first_process(environ: Mapping[str, str]) -> bool:
    """True in the one process that speaks for the whole job when its start fails.

    A start-up error (bad launcher set-up, missing package) is the same on every process, and
    may come before the geometry is known; its line is printed by the process that is rank 0
    under every launcher it runs under. torchrun's RANK counts the whole job only when its
    rendezvous spans several agents; a torchrun confined to one srun task or MPI rank (the
    double spawn) numbers its workers from 0 again, so the outer rank must be 0 as well.
    """
    names = ["RANK"] if is_torchrun(environ) else []
    if not names or environ.get("GROUP_WORLD_SIZE", "1").strip() == "1":
        if is_mpi(environ):
            # MPI ranks count the whole job; SLURM variables under mpirun are inherited ones.
            names.append(
                "OMPI_COMM_WORLD_RANK" if "OMPI_COMM_WORLD_RANK" in environ else "PMI_RANK"
            )
        elif is_slurm_step(environ):
            names.append("SLURM_PROCID")
    # A value that is no integer is the same on every process: it cannot tell them apart.
    values = [environ.get(name, "").strip() for name in names]
    return all(value == "0" or not value.isdigit() for value in values)
