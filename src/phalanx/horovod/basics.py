"""init / shutdown and the geometry queries, through phalanx's own launcher detection.

Ranks come from whatever started the script (mpirun, srun, torchrun, `phalanx run`, or nothing:
one rank), exactly as for `phalanx.init()`.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from phalanx.config.schema import DistConfig
from phalanx.dist.process_group import Dist
from phalanx.env import detect
from phalanx.horovod.knobs import read_knobs
from phalanx.horovod.runtime import RUNTIME
from phalanx.horovod.unsupported import refuse


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Join the job (idempotent). An existing torch.distributed group (e.g. from phalanx.init())
    is reused; otherwise phalanx.init() creates one."""
    if comm is not None:
        refuse("an mpi4py communicator")
    if process_sets is not None:
        refuse("process sets")
    if RUNTIME.handle is not None:
        return
    knobs = read_knobs(os.environ, RUNTIME.warned)
    if dist.is_initialized():
        handle = _adopt_group()
        RUNTIME.owns_group = False
    else:
        from phalanx.session import init as phalanx_init

        config = DistConfig(setup_logging=False)
        if knobs.timeout_s is not None:
            config = DistConfig(setup_logging=False, timeout_s=knobs.timeout_s)
        handle = phalanx_init(config)
        RUNTIME.owns_group = True
    RUNTIME.handle = handle
    RUNTIME.fusion_threshold_bytes = knobs.fusion_threshold_bytes
    if handle.backend != "gloo" and handle.env.world_size > 1:
        RUNTIME.cpu_group = dist.new_group(backend="gloo")


def _adopt_group() -> Dist:
    env = detect()
    backend = str(dist.get_backend())
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if backend == "nccl"
        else torch.device("cpu")
    )
    return Dist(env=env, device=device, backend=backend)


def shutdown() -> None:
    """Leave the job; destroys the group only when hvd.init() created it."""
    if RUNTIME.handle is not None and RUNTIME.owns_group:
        from phalanx.dist.process_group import shutdown as destroy

        destroy()
    RUNTIME.reset()


def is_initialized() -> bool:
    return RUNTIME.handle is not None


def size() -> int:
    return RUNTIME.require().env.world_size


def rank() -> int:
    return RUNTIME.require().env.rank


def local_size() -> int:
    return RUNTIME.require().env.local_world_size


def local_rank() -> int:
    return RUNTIME.require().env.local_rank


def cross_size() -> int:
    """Number of nodes (Horovod: ranks sharing this rank's local_rank, one per node)."""
    return RUNTIME.require().env.num_nodes


def cross_rank() -> int:
    return RUNTIME.require().env.node_rank


def is_homogeneous() -> bool:
    env = RUNTIME.require().env
    return env.local_world_size * env.num_nodes == env.world_size


def mpi_threads_supported() -> bool:
    return False


# What is built in: collectives run on torch.distributed (gloo always; NCCL where torch has it).
def gloo_built() -> bool:
    return bool(dist.is_gloo_available())


def nccl_built() -> bool:
    return bool(dist.is_nccl_available()) and torch.cuda.is_available()


def cuda_built() -> bool:
    return torch.version.cuda is not None


def rocm_built() -> bool:
    return torch.version.hip is not None


def mpi_built() -> bool:
    return False


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def gloo_enabled() -> bool:
    return gloo_built()


def mpi_enabled() -> bool:
    return False


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    refuse("the timeline")


def stop_timeline() -> None:
    refuse("the timeline")
