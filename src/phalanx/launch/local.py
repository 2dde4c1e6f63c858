"""`phalanx run`: build torch.distributed.run's arguments and hand over to it.

phalanx does not re-implement process supervision: torchrun starts, watches and restarts the
workers. This module only decides its arguments (pure) and replaces the process with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from phalanx.config.args import RESOLVE_FLAG, wants_config
from phalanx.env import refuse_nested_launch
from phalanx.env.cluster_env import read_int
from phalanx.env.mpi import is_mpi
from phalanx.env.slurm import from_slurm, is_slurm_step
from phalanx.env.torchrun import is_torchrun
from phalanx.errors import UsageError
from phalanx.rundir.resolve import RUN_DIR_LINE


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """One `phalanx run` call."""

    nproc_per_node: int
    """Worker processes on this node (one per GPU)."""
    script: str
    """Python file to run, or a module name with module=True."""
    script_args: tuple[str, ...] = ()
    """Arguments passed to the script unchanged."""
    module: bool = False
    """Run `script` as a module (python -m)."""
    nnodes: int = 1
    """Number of nodes, each running one `phalanx run`."""
    node_rank: int | None = None
    """This node's index; node 0 hosts the rendezvous (optional with resolvable host names)."""
    rdzv_endpoint: str | None = None
    """HOST:PORT of the c10d rendezvous on the first node; required with nnodes > 1."""
    rdzv_id: str = "phalanx"
    """Id shared by all nodes of one job."""
    max_restarts: int = 0
    """Elastic restarts of the whole worker group after a failure."""

    def __post_init__(self) -> None:
        if self.nproc_per_node < 1:
            raise UsageError(
                f"-n/--nproc-per-node must be >= 1 (processes per node), got {self.nproc_per_node}"
            )
        if self.nnodes < 1:
            raise UsageError(f"--nnodes must be >= 1, got {self.nnodes}")
        if self.node_rank is not None and not 0 <= self.node_rank < self.nnodes:
            raise UsageError(f"--node-rank {self.node_rank} is not in 0..{self.nnodes - 1}")
        if self.max_restarts < 0:
            raise UsageError(f"--max-restarts must be >= 0, got {self.max_restarts}")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise UsageError(
                f"--nnodes {self.nnodes} needs --rdzv-endpoint HOST:PORT of the first node "
                "(under srun --ntasks-per-node=1 phalanx fills it in)"
            )
        if self.rdzv_endpoint is not None:
            host, _, port = self.rdzv_endpoint.rpartition(":")
            if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
                raise UsageError(
                    f"--rdzv-endpoint {self.rdzv_endpoint!r} is not HOST:PORT (e.g. node01:29400)"
                )
        if not self.module and not os.path.isfile(self.script):
            raise UsageError(f"script {self.script!r} not found; pass a Python file or -m MODULE")


def _outer_tasks_on_node(environ: Mapping[str, str]) -> tuple[str, int]:
    """The launcher this command runs under, and how many of its tasks share this node."""
    if is_torchrun(environ) and "LOCAL_WORLD_SIZE" in environ:
        return "torchrun", read_int(environ, "LOCAL_WORLD_SIZE", launcher="torchrun")
    if is_mpi(environ):
        name = "OMPI_COMM_WORLD_LOCAL_SIZE"
        name = name if name in environ else "MPI_LOCALNRANKS"
        return "mpirun", read_int(environ, name, launcher="mpi")
    return "none", 1


def plan_run(spec: RunSpec, environ: Mapping[str, str], *, slurm: bool = True) -> RunSpec:
    """Refuse double spawns, and under `srun --ntasks-per-node=1` fill in the multi-node flags."""
    outer, tasks = _outer_tasks_on_node(environ)
    if tasks > 1:
        raise UsageError(
            f"phalanx run is inside {outer} with {tasks} processes on this node, so each would "
            f"start {spec.nproc_per_node} workers (double spawn); run the script directly under "
            f"{outer}, or start one phalanx run per node"
        )
    if not slurm or not is_slurm_step(environ):
        return spec
    refuse_nested_launch(environ, what="phalanx run")
    step = from_slurm(environ)
    if spec.nnodes != 1 or step.num_nodes == 1:
        return spec
    return replace(
        spec,
        nnodes=step.num_nodes,
        node_rank=step.node_rank,
        rdzv_endpoint=f"{step.master_addr}:{step.master_port}",
        rdzv_id=f"{step.job_id}.{environ['SLURM_STEP_ID']}",
    )


def torchrun_argv(spec: RunSpec) -> list[str]:
    """Arguments for `python -m torch.distributed.run` that realise `spec`."""
    argv = [f"--nproc-per-node={spec.nproc_per_node}"]
    if spec.nnodes == 1 and spec.rdzv_endpoint is None:
        argv.append("--standalone")
    else:
        argv += [
            f"--nnodes={spec.nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={spec.rdzv_endpoint}",
            f"--rdzv-id={spec.rdzv_id}",
        ]
        if spec.node_rank is not None:
            # c10d elects the store host by comparing host names; an explicit node rank makes
            # that choice exact where names are ambiguous (containers, several NICs).
            argv.append(f"--rdzv-conf=is_host={int(spec.node_rank == 0)}")
    if spec.max_restarts:
        argv.append(f"--max-restarts={spec.max_restarts}")
    if spec.module:
        argv.append("--module")
    return [*argv, spec.script, *spec.script_args]


def resolve_config(spec: RunSpec) -> RunSpec:
    """Resolve the script's config once, here, before any worker exists.

    Only for scripts called with phalanx's config syntax (--config FILE, section.key=VALUE):
    the script runs once with the resolve flag, which makes its `parse_config` validate the
    config, create the run directory with config.yaml and exit. Workers then get that file.
    A bad config stops here with the script's one-line error, before torchrun starts.
    """
    run_dir = resolve_run_dir(spec.script, spec.script_args, module=spec.module)
    if run_dir is None:
        return spec
    return replace(spec, script_args=("--config", str(run_dir / "config.yaml")))


def resolve_run_dir(script: str, args: Sequence[str], *, module: bool = False) -> Path | None:
    """Run `script args --phalanx-resolve` once; the run directory it created (None when the
    arguments do not use phalanx's config syntax). Exits with the script's code on failure."""
    if not wants_config(args):
        return None
    target = ["-m", script] if module else [script]
    done = subprocess.run(
        [sys.executable, *target, *args, RESOLVE_FLAG],
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(done.returncode)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RUN_DIR_LINE)]
    if not lines:
        raise UsageError(
            f"{script} got --config/overrides but did not resolve them; call "
            "phalanx.parse_config(YourConfig) at the start of the script"
        )
    return Path(lines[-1][len(RUN_DIR_LINE) :])


def exec_torchrun(spec: RunSpec) -> None:
    """Replace this process with torchrun, so signals and the exit code pass straight through."""
    command = [sys.executable, "-m", "torch.distributed.run", *torchrun_argv(spec)]
    # SLURM signals every process of the step: torchrun would die of SIGUSR2 (its default
    # action) and take the workers down before they checkpoint. Ignored here, inherited through
    # exec by torchrun; the workers install phalanx's own handler.
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    sys.stdout.flush()
    os.execv(sys.executable, command)
