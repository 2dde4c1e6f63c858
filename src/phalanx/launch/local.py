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
    """Number of nodes, each running one `phalanx run`; with min_nodes, the most nodes."""
    min_nodes: int | None = None
    """Elastic membership (`--nnodes MIN:MAX`): the job goes on while this many nodes remain."""
    node_rank: int | None = None
    """This node's index; node 0 hosts the rendezvous (optional with resolvable host names)."""
    rdzv_endpoint: str | None = None
    """HOST:PORT of the c10d rendezvous on the first node; required with nnodes > 1."""
    rdzv_id: str = "phalanx"
    """Id shared by all nodes of one job."""
    max_restarts: int = 0
    """Elastic restarts of the whole worker group after a failure."""
    rdzv_conf: tuple[str, ...] = ()
    """KEY=VALUE settings of the c10d rendezvous (timeouts, keep-alive), see RDZV_CONF_KEYS."""

    def __post_init__(self) -> None:
        if self.nproc_per_node < 1:
            raise UsageError(
                f"-n/--nproc-per-node must be >= 1 (processes per node), got {self.nproc_per_node}"
            )
        if self.nnodes < 1:
            raise UsageError(f"--nnodes must be >= 1, got {self.nnodes}")
        _check_elastic(self)
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


RDZV_CONF_KEYS = (
    "join_timeout", "last_call_timeout", "close_timeout", "keep_alive_interval",
    "keep_alive_max_attempt", "read_timeout",
)  # fmt: skip
"""torchrun's c10d rendezvous settings `--rdzv-conf` accepts, all whole seconds or counts (is_host
comes from --node-rank)."""


def parse_nnodes(text: str) -> tuple[int | None, int]:
    """`--nnodes N` or `--nnodes MIN:MAX` as (min_nodes or None, nnodes)."""
    low, colon, high = text.partition(":")
    if not (low.isdigit() and (high.isdigit() or not colon)):
        raise UsageError(f"--nnodes {text!r} is not a number N or a range MIN:MAX (e.g. 1:2)")
    return (int(low), int(high)) if colon else (None, int(low))


def _check_elastic(spec: RunSpec) -> None:
    if spec.min_nodes is not None:
        span = f"--nnodes {spec.min_nodes}:{spec.nnodes}"
        if not 1 <= spec.min_nodes <= spec.nnodes:
            raise UsageError(f"{span}: MIN must be between 1 and MAX (e.g. --nnodes 1:2)")
        if spec.min_nodes < spec.nnodes and spec.max_restarts < 1:
            raise UsageError(
                f"{span} survives a lost node only by restarting: add --max-restarts K (K >= 1)"
            )
    for item in spec.rdzv_conf:
        key, _, value = item.partition("=")
        if key not in RDZV_CONF_KEYS:
            raise UsageError(
                f"--rdzv-conf {item!r}: unknown key {key!r}; valid: {', '.join(RDZV_CONF_KEYS)}"
            )
        if not value.isdigit() or int(value) < 1:
            raise UsageError(f"--rdzv-conf {item!r}: the value must be a whole number >= 1")
    if spec.rdzv_conf and spec.nnodes == 1 and spec.rdzv_endpoint is None:
        raise UsageError(
            "--rdzv-conf applies to the c10d rendezvous of --nnodes > 1 (or --rdzv-endpoint); "
            "one node alone uses --standalone: drop --rdzv-conf"
        )


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
        nnodes = f"{spec.nnodes}" if spec.min_nodes is None else f"{spec.min_nodes}:{spec.nnodes}"
        argv += [
            f"--nnodes={nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={spec.rdzv_endpoint}",
            f"--rdzv-id={spec.rdzv_id}",
        ]
        conf = list(spec.rdzv_conf)
        if spec.node_rank is not None:
            # c10d elects the store host by comparing host names; an explicit node rank makes
            # that choice exact where names are ambiguous (containers, several NICs).
            conf.insert(0, f"is_host={int(spec.node_rank == 0)}")
        if conf:
            argv.append(f"--rdzv-conf={','.join(conf)}")
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


def torchrun_environ(spec: RunSpec, environ: Mapping[str, str]) -> dict[str, str]:
    """torchrun's environment: `environ`, and across nodes one fresh worker store per round.

    By default (torch >= 2.4) the workers of every rendezvous round share one TCPStore, served
    by the rank-0 agent for its whole life, with no prefix per round: keys of a dead round (gloo
    addresses) stay readable. phalanx's single-node fix, a prefix per TORCHELASTIC_RESTART_COUNT,
    does not hold across nodes: that count is per agent, a node that joins later starts at 0 and
    a restart for a returning node does not advance it, so ranks of one round could pick
    different prefixes and never meet. Without sharing, rank 0 of each round serves a new store
    on a new port that every agent reads from the round's own rendezvous keys.
    """
    env = dict(environ)
    if spec.nnodes > 1 or spec.rdzv_endpoint is not None:
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return env


def exec_torchrun(spec: RunSpec) -> None:
    """Replace this process with torchrun, so signals and the exit code pass straight through
    (a usage error in every failed worker: exit 2, phalanx.launch.torchrun_entry)."""
    command = [sys.executable, "-m", "phalanx.launch.torchrun_entry", *torchrun_argv(spec)]
    # SLURM signals every process of the step: torchrun would die of SIGUSR2 (its default
    # action) and take the workers down before they checkpoint. Ignored here, inherited through
    # exec by torchrun; the workers install phalanx's own handler.
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    sys.stdout.flush()
    os.execve(sys.executable, command, torchrun_environ(spec, os.environ))
