"""Async saves under a /dev/shm smaller than the staging copy (Docker's default is 64 MB): the
documented outcome, not a crash at the first save.

A private mount namespace (`unshare --mount`) gets an 8 MiB tmpfs on /dev/shm; in it 2 gloo
ranks train a model whose model + AdamW state is about 11 MiB per rank with async saves through
the writer process. Before the check, torch failed the first save ("unable to allocate shared
memory(shm) ... No space left on device").
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import need, need_command
from tests.support.ckpt_runs import WORKER, committed_steps
from tests.support.procs import VENV_BIN, run

SMALL_SHM = 'mount -t tmpfs -o size=8m tmpfs /dev/shm && exec "$@"'
ASYNC = (
    "checkpoint.every_steps=2", "data.num_workers=0", "data.batch_size=4", "train.progress=false",
    "checkpoint.sharded=true", "checkpoint.async_save=true", "checkpoint.async_writer=process",
    "model.extra=1000000",  # 4 MB of parameters, 12 MB with AdamW's moments, per rank
)  # fmt: skip
pytestmark = [pytest.mark.dist, pytest.mark.timeout(400)]


def need_mount_namespace() -> None:
    need(os.geteuid() == 0, "root (to mount a small /dev/shm in a mount namespace)")
    need_command("unshare", "mount")
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "true"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    need(probe.returncode == 0, f"mount namespaces (unshare: {probe.stderr.strip()})")


def train(run_dir: Path, *overrides: str, small_shm: bool) -> subprocess.CompletedProcess[str]:
    command = [str(VENV_BIN / "phalanx"), "run", "-n", "2", WORKER, f"run.dir={run_dir}",
               *ASYNC, *overrides]  # fmt: skip
    if small_shm:
        command = ["unshare", "--mount", "--propagation", "private",
                   "sh", "-c", SMALL_SHM, "sh", *command]  # fmt: skip
    return run(command, timeout=240)


def test_a_small_shm_falls_back_to_the_thread_writer_and_the_checkpoint_loads(
    tmp_path: Path,
) -> None:
    need_mount_namespace()
    run_dir = tmp_path / "run"
    result = train(run_dir, "train.max_steps=4", small_shm=True)
    assert result.returncode == 0, result.stderr[-5000:]
    fallback = [line for line in result.stderr.splitlines() if "checkpoint staging" in line]
    assert len(fallback) == 1, fallback  # once, from rank 0, for every rank
    assert "needs 22.9 MiB of /dev/shm on host" in fallback[0]
    assert "where 8.0 MiB is free" in fallback[0]
    assert "writing from a thread instead" in fallback[0]
    assert "--shm-size=26m or more" in fallback[0]
    assert "No space left" not in result.stderr and "Bus error" not in result.stderr
    assert committed_steps(run_dir / "checkpoints") == [2, 4]
    # Loadable: a resume (with the node's own /dev/shm, so through the writer process now)
    # continues after step 4.
    result = train(run_dir, "train.max_steps=6", small_shm=False)
    assert result.returncode == 0, result.stderr[-5000:]
    assert (run_dir / "starts-rank-0.txt").read_text().split() == ["1", "5"]
    assert "in /dev/shm for the writer process" in result.stderr
    assert committed_steps(run_dir / "checkpoints")[-1] == 6
