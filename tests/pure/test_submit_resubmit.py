"""A re-submit of a run directory that sbatch refuses, or a dry run of one, leaves the snapshot
the earlier job runs from in place (`code/`), with nothing set aside.

sbatch is a stand-in command on PATH (SLURM's own would need a controller); everything else is
the real `phalanx submit`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.procs import VENV_BIN, run

PHALANX = str(VENV_BIN / "phalanx")
SCRIPT = "import phalanx\n\nphalanx.parse_config(phalanx.Config)\n# version {}\n"


def _tools(bin_dir: Path, *, sbatch_ok: bool) -> None:
    """sbatch that accepts (job 4242) or refuses like slurmctld; scontrol that finds no
    controller, so a dry run is not checked."""
    bin_dir.mkdir(exist_ok=True)
    accept = "echo 4242"
    refuse = "echo 'sbatch: error: Batch job submission failed: Invalid account' >&2; exit 1"
    for name, body in (("sbatch", accept if sbatch_ok else refuse), ("scontrol", "exit 1")):
        tool = bin_dir / name
        tool.write_text(f"#!/bin/sh\n{body}\n")
        tool.chmod(0o755)


def _submit(project: Path, run_dir: Path, *flags: str) -> tuple[int, str]:
    env = {**os.environ, "PATH": f"{project / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    done = run([PHALANX, "submit", *flags, "train.py", f"run.dir={run_dir}"], timeout=120,
               cwd=project, env=env)  # fmt: skip
    return done.returncode, done.stderr


@pytest.mark.timeout(240)
@pytest.mark.parametrize("second", ["refused", "dry-run"])
def test_a_resubmit_that_does_not_queue_keeps_the_previous_snapshot(
    tmp_path: Path, second: str
) -> None:
    project, run_dir = tmp_path / "project", tmp_path / "runs" / "demo"
    project.mkdir()
    (project / "train.py").write_text(SCRIPT.format(1))
    _tools(project / "bin", sbatch_ok=True)
    code, err = _submit(project, run_dir)
    assert code == 0, err
    (project / "train.py").write_text(SCRIPT.format(2))
    _tools(project / "bin", sbatch_ok=second == "dry-run")
    code, err = _submit(project, run_dir, *(["--dry-run"] if second == "dry-run" else []))
    assert (code != 0) == (second == "refused"), err
    assert (run_dir / "code" / "train.py").read_text() == SCRIPT.format(1)
    assert not list(run_dir.glob("code-before-*"))
    assert (run_dir / "jobs.txt").read_text() == "4242\n"
