"""Run launcher commands from tests with a hard timeout and no stray processes afterwards."""

from __future__ import annotations

import contextlib
import os
import shutil
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
        pids = [proc.pid, *descendants(proc.pid)]
        stacks = python_stacks(pids)  # before the kill: where the hung processes are stuck
        kill_and_wait(pids)
        out, err = proc.communicate()
        raise AssertionError(
            f"{' '.join(cmd)} timed out after {timeout}s\nstdout:\n{out}\nstderr:\n{err}\n{stacks}"
        ) from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def python_stacks(pids: Sequence[int]) -> str:
    """`py-spy dump` of each Python process among `pids` (empty without py-spy), for the
    failure message of a command that hangs."""
    spy = shutil.which("py-spy", path=str(VENV_BIN))
    dumps = []
    for pid in pids if spy is not None else []:
        try:
            if b"python" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            # Native frames too: a process stuck inside C code (e.g. a forked DataLoader worker
            # that never returned from os.fork) shows no Python frame that explains it.
            result = subprocess.run(
                [str(spy), "dump", "--native", "--pid", str(pid)],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            if result.returncode != 0:
                result = subprocess.run([str(spy), "dump", "--pid", str(pid)],
                                        capture_output=True, text=True, timeout=30)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as error:
            dumps.append(f"--- py-spy dump --pid {pid}: {error}")
            continue
        dumps.append(f"--- py-spy dump --pid {pid}\n{result.stdout}{result.stderr[-500:]}")
    return "\n".join(dumps)
