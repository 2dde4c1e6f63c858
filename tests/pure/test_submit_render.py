"""Golden job scripts: every launch mode x environment kind, each a valid bash script.

Regenerate after an intended change: UPDATE_GOLDEN=1 pytest tests/pure/test_submit_render.py,
then read the diff of tests/golden/submit/ before committing it.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from phalanx.errors import UsageError
from phalanx.submit import Job, SubmitConfig, render
from phalanx.submit.config import (
    EnvSection,
    JobSection,
    LaunchSection,
    time_limit_s,
    with_absolute_paths,
)

GOLDEN = Path(__file__).parents[1] / "golden" / "submit"
RUN_DIR = Path("/scratch/runs/demo-20261126-120000")
MODES = ("srun", "torchrun", "mpirun")
KINDS: dict[str, dict[str, Any]] = {
    "none": {},
    "modules": {"kind": "modules", "modules": ("cuda/12.4", "nccl/2.21")},
    "venv": {"kind": "venv", "venv": "/scratch/venvs/demo"},
    "conda": {"kind": "conda", "conda": "demo"},
    "apptainer": {"kind": "container", "image": "/scratch/images/demo.sif",
                  "binds": ("/scratch/data",)},
    "charliecloud": {"kind": "container", "runtime": "charliecloud",
                     "image": "/scratch/images/demo", "binds": ("/scratch/data:/data",)},
}  # fmt: skip


def job_for(mode: str, env: dict[str, Any], **job: Any) -> Job:
    defaults = {"nodes": 2, "gpus_per_node": 4, "cpus_per_task": 8, "partition": "gpu",
                "account": "proj123", "time": "12:00:00"}  # fmt: skip
    config = SubmitConfig(
        job=JobSection(**{**defaults, **job}),
        launch=LaunchSection(mode=mode),  # type: ignore[arg-type]
        env=EnvSection(vars=("NCCL_IB_GID_INDEX=3",), pass_vars=("WANDB_API_KEY",), **env),
    )
    return Job(config=config, run_dir=RUN_DIR, workdir=RUN_DIR / "code", script="train.py",
               args=("--config", str(RUN_DIR / "config.yaml")))  # fmt: skip


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("mode", MODES)
def test_rendered_script_matches_golden_and_parses(mode: str, kind: str, tmp_path: Path) -> None:
    text = render(job_for(mode, KINDS[kind]))
    golden = GOLDEN / f"{mode}-{kind}.sbatch"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), f"{golden.name} changed (UPDATE_GOLDEN=1 to accept)"
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_cpu_job_ranks_and_gpu_flag_variants() -> None:
    cpu = render(job_for("srun", {}, gpus_per_node=0, ranks_per_node=3, cpus_per_task=0))
    assert "#SBATCH --ntasks-per-node=3" in cpu and "gres" not in cpu and "gpus" not in cpu
    assert "--cpus-per-task" not in cpu
    flag = render(job_for("srun", {}, gpu_flag="gpus-per-node"))
    assert "#SBATCH --gpus-per-node=4" in flag and "--gres" not in flag
    torchrun = render(job_for("torchrun", {}))  # one task per node holds the node's 4 ranks
    assert "#SBATCH --ntasks-per-node=1" in torchrun and "#SBATCH --cpus-per-task=32" in torchrun
    assert "phalanx run -n 4 train.py" in torchrun


def test_preemption_defaults_and_their_opt_outs() -> None:
    text = render(job_for("srun", {}))
    for line in ("#SBATCH --requeue", "#SBATCH --open-mode=append", "#SBATCH --signal=USR2@180"):
        assert line in text
    off = render(job_for("srun", {}, requeue=False, signal=""))
    assert "#SBATCH --no-requeue" in off and "--signal" not in off


def test_secrets_appear_by_name_only() -> None:
    text = render(job_for("srun", {}))
    assert "WANDB_API_KEY" in text and "=" not in _lines_with(text, "WANDB_API_KEY")


def _lines_with(text: str, word: str) -> str:
    return "\n".join(line.split(":?")[0] for line in text.splitlines() if word in line)


@pytest.mark.parametrize(
    "field", ["name", "partition", "account", "qos", "constraint", "mail_user", "mem"]
)
def test_newline_in_an_sbatch_value_is_refused(field: str) -> None:
    with pytest.raises(UsageError, match=f"job.{field} contains a newline"):
        JobSection(**{field: "gpu\n#SBATCH --uid=0"})
    with pytest.raises(UsageError, match=r"job\.extra contains a newline"):
        JobSection(extra=("--comment=a\nb",))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nodes": 0}, "job.nodes=0 must be >= 1"),
        ({"time": "soon"}, "is not a SLURM time"),
        ({"signal": "USR2 @ 90"}, "is not like USR2@180"),
        ({"extra": ("licenses=x",)}, "must start with --"),
    ],
)
def test_bad_job_values(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        JobSection(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "venv"}, "env.kind=venv needs env.venv"),
        ({"kind": "container"}, "needs env.image"),
        ({"vars": ("NOVALUE",)}, "must be NAME=VALUE"),
        ({"vars": ("A B=1",)}, "is not an environment variable name"),
        ({"pass_vars": ("$(x)",)}, "is not an environment variable name"),
    ],
)
def test_bad_env_values(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        EnvSection(**kwargs)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("3", 180), ("3:30", 210), ("1:00:00", 3600), ("2-0", 172800), ("2-1:30", 178200),
     ("1-00:00:01", 86401)],
)  # fmt: skip
def test_slurm_time_formats(text: str, seconds: int) -> None:
    assert time_limit_s(text) == seconds


def test_signal_lead_is_capped_at_a_tenth_of_a_short_time_limit() -> None:
    assert JobSection(time="12:00:00").effective_signal == "USR2@180"
    assert JobSection(time="3").effective_signal == "USR2@18"  # not at the job's start
    assert "#SBATCH --signal=USR2@18\n" in render(job_for("srun", {}, time="3"))


def test_relative_paths_are_absolute_in_the_script_and_uris_are_not(tmp_path: Path) -> None:
    def script(**env: Any) -> str:
        job = job_for("srun", {"modules": ("cuda/12.4",), "module_paths": ("modulefiles",), **env})
        return render(dataclasses.replace(job, config=with_absolute_paths(job.config, tmp_path)))

    sif = script(kind="container", image="phalanx.sif", binds=("data",))
    assert f"apptainer exec --nv --bind {RUN_DIR},{tmp_path}/data --pwd" in sif
    assert f" {tmp_path}/phalanx.sif python train.py" in sif
    assert f"module use {tmp_path}/modulefiles\n" in sif
    venv = script(kind="venv", venv="venvs/my env")
    assert f"source '{tmp_path}/venvs/my env/bin/activate'\n" in venv  # absolute, still quoted
    uri = script(kind="container", image="docker://pytorch/pytorch:2.5.1-cuda12.4")
    assert " docker://pytorch/pytorch:2.5.1-cuda12.4 python train.py" in uri
