"""MPI launchers (OpenMPI's mpirun, MPICH/Hydra, Intel MPI): the Horovod launch model.

MPI exports ranks but no rendezvous address. With mpi4py installed, every rank shares its host
name and its node through MPI (exact node layout, rank 0's host and a free port of it); without
it, a job whose ranks all run on one node meets at 127.0.0.1, and a multi-node job needs
MASTER_ADDR exported to all ranks (nodes are then assumed to be filled block-wise).
Under OpenMPI a node is what its runtime calls one (the daemon a rank belongs to), not a host
name alone: two containers or two slurmd instances on one machine may share a name.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping

from phalanx.env.cluster_env import ClusterEnv, read_int, read_port
from phalanx.env.slurm import derive_port
from phalanx.errors import UsageError

Exchange = Callable[[], "tuple[list[str], int, list[str] | None] | None"]
"""Returns (host name of every rank, in rank order; a free port on rank 0; a node key of every
rank, or None to group by host name), or None without MPI."""

_OPENMPI = (
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
)
# Hydra and Intel MPI. PMI_RANK alone is not enough: srun --mpi=pmi2 sets it for plain SLURM tasks.
_HYDRA = ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")


def is_mpi(environ: Mapping[str, str]) -> bool:
    """A rank started by mpirun/mpiexec of OpenMPI, MPICH (Hydra) or Intel MPI."""
    return any(all(name in environ for name in names) for names in (_OPENMPI, _HYDRA))


def mpi4py_exchange() -> tuple[list[str], int, list[str] | None] | None:
    """All-gather host names and nodes, broadcast a free port of rank 0; None without mpi4py.

    Collective: every rank of the MPI job must call it (detect() does, on every rank).
    """
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    comm = MPI.COMM_WORLD
    host = socket.gethostname()
    # OpenMPI 4 runs one daemon per node; "<job>.<daemon vpid>" names the node it started.
    daemon = os.environ.get("OMPI_MCA_orte_local_daemon_uri", "").split(";")[0]  # noqa: SIM112
    pairs = comm.allgather((host, f"{host}/{daemon}"))
    hosts, keys = [h for h, _ in pairs], [k for _, k in pairs]
    port = 0
    if comm.Get_rank() == 0:
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
    return hosts, comm.bcast(port, root=0), keys


def _counts(environ: Mapping[str, str]) -> tuple[int, int, int, int]:
    names = _OPENMPI if all(name in environ for name in _OPENMPI) else _HYDRA
    return tuple(read_int(environ, name, launcher="mpi") for name in names)  # type: ignore[return-value]


def from_mpi(environ: Mapping[str, str], exchange: Exchange = mpi4py_exchange) -> ClusterEnv:
    """Geometry of this MPI rank; rendezvous from MASTER_ADDR or through mpi4py."""
    rank, world_size, local_rank, local_world_size = _counts(environ)
    shared = exchange()
    if shared is not None:
        hosts, port, node_keys = shared
        if len(hosts) != world_size:
            raise UsageError(
                f"the launcher reports {world_size} MPI ranks but mpi4py sees {len(hosts)}; "
                "mpi4py is built against another MPI than mpirun: reinstall it with that MPI "
                "(pip install --no-binary mpi4py mpi4py) or uninstall it and export MASTER_ADDR"
            )
        keys = hosts if node_keys is None else node_keys
        nodes = list(dict.fromkeys(keys))
        node_rank, num_nodes = nodes.index(keys[rank]), len(nodes)
        master_addr = environ.get("MASTER_ADDR") or hosts[0]
    else:
        master_addr = environ.get("MASTER_ADDR", "")
        if not master_addr and local_world_size != world_size:
            raise UsageError(
                f"mpirun runs {world_size} ranks on several nodes ({local_world_size} on this "
                "one), so phalanx needs rank 0's host: pip install mpi4py (phalanx then shares "
                "it through MPI), or export MASTER_ADDR=<host of rank 0> (mpirun -x MASTER_ADDR)"
            )
        # Every rank on this node: rank 0 is here too.
        master_addr = master_addr or "127.0.0.1"
        if local_world_size < 1 or world_size % local_world_size:
            raise UsageError(
                f"{world_size} MPI ranks do not fill nodes of {local_world_size} evenly; "
                "pip install mpi4py so phalanx can read the real layout"
            )
        # Derived from the MPI job id so two jobs on one node do not share a port.
        job = environ.get("OMPI_MCA_ess_base_jobid") or environ.get("PMI_JOBID") or ""
        port = derive_port(job, "0") if job else 29500
        node_rank, num_nodes = rank // local_world_size, world_size // local_world_size
    return ClusterEnv(
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=local_world_size,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=master_addr,
        master_port=read_port(environ, default=port),
        launcher="mpi",
        job_id=environ.get("SLURM_JOB_ID")
        or environ.get("OMPI_MCA_ess_base_jobid")
        or environ.get("PMI_JOBID"),
    )
