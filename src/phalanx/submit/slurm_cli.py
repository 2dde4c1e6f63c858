"""SLURM's commands (sbatch, squeue, sacct, scancel), with their errors turned into one line."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from phalanx.errors import UsageError

HINTS = {
    "invalid partition": "list partitions with `sinfo -s` and set job.partition (-p)",
    "invalid generic resource": "this cluster has no such GRES: drop -G / job.gpus_per_node or "
    "pick a GPU partition",
    "invalid gres": "this cluster has no such GRES: drop -G / job.gpus_per_node",
    "requested node configuration is not available": "fewer nodes, GPUs, CPUs or memory per "
    "node; see `sinfo -N -l`",
    "invalid account": "set job.account (-A) to one of `sacctmgr show assoc user=$USER`",
    "invalid qos": "set job.qos to one your account may use",
    "time limit": "lower job.time (-t) below the partition's MaxTime (`sinfo -s`)",
}


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise UsageError(f"{name} not found on PATH: run this on a SLURM login node")
    return path


def call(
    argv: Sequence[str], *, environ: Mapping[str, str] | None = None, timeout: float = 60.0
) -> str:
    """Run a SLURM command; its error becomes one UsageError line with a hint when known."""
    try:
        done = subprocess.run(
            [_tool(argv[0]), *argv[1:]],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            env=dict(environ) if environ is not None else None,
        )
    except subprocess.TimeoutExpired:
        raise UsageError(f"{argv[0]} did not answer in {timeout:.0f} s; is slurmctld up?") from None
    if done.returncode != 0:
        raise UsageError(_explain(argv[0], done.stderr or done.stdout))
    return done.stdout


def _explain(tool: str, stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    message = lines[-1] if lines else "exit without a message"
    for line in lines:
        if "error" in line.lower():
            message = line
            break
    message = message.removeprefix(f"{tool}: ").removeprefix("error: ")
    hint = next((h for key, h in HINTS.items() if key in message.lower()), None)
    return f"{tool}: {message}" + (f" ({hint})" if hint else "")


def controller_reachable() -> bool:
    """`scontrol ping` answers: sbatch --test-only can check a script."""
    if shutil.which("scontrol") is None:
        return False
    try:
        done = subprocess.run(
            ["scontrol", "ping"], capture_output=True, text=True, check=False, timeout=5
        )
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0 and "UP" in done.stdout


def sbatch(
    script: str, *, pass_vars: Sequence[str], options: Sequence[str] = (), test_only: bool = False
) -> str:
    """Submit a script file; the job id (or sbatch --test-only's report). `options` are
    sbatch options passed as arguments (exact bytes, no shell)."""
    export = ",".join(["ALL", *pass_vars])
    argv = ["sbatch", "--parsable", f"--export={export}", *options]
    if test_only:
        argv.append("--test-only")
        # --test-only reports on stderr and exits 0 when the job would be accepted.
        done = subprocess.run(
            [_tool("sbatch"), *argv[1:], script], capture_output=True, text=True, check=False,
            timeout=60,
        )  # fmt: skip
        if done.returncode != 0:
            raise UsageError(_explain("sbatch", done.stderr))
        return done.stderr.strip()
    return call([*argv, script], environ=os.environ).strip().split(";")[0]
