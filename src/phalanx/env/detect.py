"""detect(): which launcher started this process, in a fixed, documented priority order.

1. torchrun / TorchElastic -- it may run inside srun or mpirun, so its variables are the truth.
2. MPI -- under `mpirun` inside `sbatch` every rank inherits SLURM variables of another step.
3. SLURM srun task -- only with SLURM_STEP_* variables.
4. local -- one process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from phalanx.env.cluster_env import LAUNCHERS, ClusterEnv
from phalanx.env.local import from_local
from phalanx.env.mpi import Exchange, from_mpi, is_mpi, mpi4py_exchange
from phalanx.env.node_addr import NodeAddr, node_address
from phalanx.env.slurm import from_slurm, is_slurm_step, step_tasks_on_this_node
from phalanx.env.torchrun import from_torchrun, is_torchrun
from phalanx.errors import UsageError

_MARKERS = {
    "torchrun": "RANK, WORLD_SIZE, LOCAL_RANK (set by torchrun / phalanx run)",
    "mpi": "OMPI_COMM_WORLD_* or PMI_RANK + MPI_LOCALRANKID (set by mpirun)",
    "slurm": "SLURM_STEP_ID and SLURM_PROCID (set by srun, not in the batch script itself)",
}


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
    found = {
        "torchrun": is_torchrun(environ),
        "mpi": is_mpi(environ),
        "slurm": slurm and is_slurm_step(environ),
        "local": True,
    }
    chosen = launcher if launcher != "auto" else next(name for name in LAUNCHERS if found[name])
    if not found[chosen]:
        raise UsageError(
            f"launcher {chosen!r} was asked for but its variables are missing: "
            f"{_MARKERS[chosen]}; start the script with that launcher or use launcher 'auto'"
        )
    if chosen == "torchrun" and slurm and "TORCHELASTIC_RUN_ID" in environ:
        # Only a real elastic agent spawns workers; env:// variables set by hand inside one
        # srun task per process are a legitimate (if unusual) set-up.
        refuse_nested_launch(environ, what="torchrun")
    if chosen == "torchrun":
        return from_torchrun(environ)
    if chosen == "mpi":
        return from_mpi(environ, mpi_exchange)
    return from_slurm(environ, node_addr) if chosen == "slurm" else from_local(environ)


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
