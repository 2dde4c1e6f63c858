"""Run launcher commands from tests with a hard timeout and no stray processes afterwards."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.support.reap import descendants, kill_and_wait

VENV_BIN = Path(sys.executable).parent


def base_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test's environment without launcher variables, plus the venv on PATH."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in drop and not k.startswith(("SLURM_", "OMPI_", "PMI_", "TORCHELASTIC_"))
    }
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra or {})
    return env


def run(
    cmd: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `cmd` in its own process group; on timeout kill it and all its descendants, then fail.

    Descendants are collected before the kill: torchrun puts each worker in a new session and
    OpenMPI each rank in its own group, so killing the group alone would leave them running.
    """
    proc = subprocess.Popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(env) if env is not None else base_env(),
        cwd=cwd,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_and_wait([proc.pid, *descendants(proc.pid)])
        out, err = proc.communicate()
        raise AssertionError(
            f"{' '.join(cmd)} timed out after {timeout}s\nstdout:\n{out}\nstderr:\n{err}"
        ) from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
