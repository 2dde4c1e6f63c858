"""Submit settings: precedence defaults < file < profile < flags, the code snapshot, and the
`phalanx submit --dry-run` command line (no SLURM needed: the script is printed, not sent)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from phalanx.errors import UsageError
from phalanx.submit import EnvSection, Job, JobSection, SubmitConfig
from phalanx.submit.config import with_absolute_paths
from phalanx.submit.profiles import resolve_submit_config
from phalanx.submit.render import command_line_options, header
from phalanx.submit.snapshot import take
from tests.support.procs import VENV_BIN, base_env, run


def test_precedence_file_then_profile_then_flags(tmp_path: Path) -> None:
    base = tmp_path / "submit.yaml"
    base.write_text("job: {partition: cpu, time: '10', account: base}\nlaunch: {mode: mpirun}\n")
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text("big:\n  job: {partition: gpu, gpus_per_node: 4, time: '30'}\n")
    config = resolve_submit_config(
        config_file=str(base), profile="big", profiles_file=None,
        overrides=["job.time=45"], environ={"PHALANX_PROFILES": str(profiles)},
    )  # fmt: skip
    assert config.job.account == "base"  # file only
    assert config.launch.mode == "mpirun"  # file only
    assert config.job.partition == "gpu" and config.job.gpus_per_node == 4  # profile > file
    assert config.job.time == "45"  # flag > profile


def test_an_unquoted_yaml_time_is_refused_unless_a_flag_sets_it(tmp_path: Path) -> None:
    base = tmp_path / "submit.yaml"
    base.write_text("job:\n  time: 12:00:00\n")  # YAML 1.1: the base-60 number 43200
    with pytest.raises(UsageError, match=r"job.time in a YAML file reads as the number 43200"):
        resolve_submit_config(config_file=str(base), profile=None, profiles_file=None,
                              overrides=[], environ={})  # fmt: skip
    config = resolve_submit_config(config_file=str(base), profile=None, profiles_file=None,
                                   overrides=["job.time=1:00:00"], environ={})  # fmt: skip
    assert config.job.time == "1:00:00"
    base.write_text('job:\n  time: "12:00:00"\n')
    config = resolve_submit_config(config_file=str(base), profile=None, profiles_file=None,
                                   overrides=[], environ={})  # fmt: skip
    assert config.job.time == "12:00:00"


def test_unknown_profile_names_the_known_ones(tmp_path: Path) -> None:
    profiles = tmp_path / "p.yaml"
    profiles.write_text("alpha: {job: {nodes: 2}}\nbeta: {job: {nodes: 3}}\n")
    with pytest.raises(UsageError, match=r"unknown profile 'gamma' .* \(known: alpha, beta\)"):
        resolve_submit_config(config_file=None, profile="gamma", profiles_file=str(profiles),
                              overrides=[], environ={})  # fmt: skip


def test_values_sbatch_cannot_read_go_on_the_command_line() -> None:
    config = SubmitConfig(job=JobSection(name='a "b" c'))
    job = Job(config=config, run_dir=Path("/runs/my run"), workdir=Path("/w"), script="t.py",
              args=())  # fmt: skip
    assert command_line_options(job) == ['--job-name=a "b" c', "--output=/runs/my run/slurm-%j.out"]
    lines = header(job)
    assert "# --job-name is passed on sbatch's command line (blanks or quotes)" in lines
    assert not any(line.startswith("#SBATCH --job-name") for line in lines)


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd,
                   check=True, capture_output=True)  # fmt: skip


def test_snapshot_of_a_git_tree_skips_ignored_files_and_records_the_commit(tmp_path: Path) -> None:
    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "train.py").write_text("print(1)\n")
    (code / "pkg" / "model.py").write_text("X = 1\n")
    (code / ".gitignore").write_text("data/\n")
    (code / "data").mkdir()
    (code / "data" / "big.bin").write_bytes(b"0" * 1000)
    git(code, "init", "-q")
    git(code, "add", ".")
    git(code, "commit", "-qm", "first")
    (code / "untracked.py").write_text("Y = 2\n")  # not ignored: part of what runs
    record = take(code, tmp_path / "snap")
    copied = sorted(str(p.relative_to(tmp_path / "snap")) for p in (tmp_path / "snap").rglob("*")
                    if p.is_file())  # fmt: skip
    assert copied == [".gitignore", "SNAPSHOT.json", "pkg/model.py", "train.py", "untracked.py"]
    assert record["dirty"] is True and len(str(record["commit"])) == 40
    saved = json.loads((tmp_path / "snap" / "SNAPSHOT.json").read_text())
    assert saved["commit"] == record["commit"]


def test_dry_run_prints_the_script_and_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("raise SystemExit('must not run')\n")
    env = base_env({"PATH": str(VENV_BIN)})  # no scontrol: no controller to check against
    result = run([str(VENV_BIN / "phalanx"), "submit", "--dry-run", "-N", "2", "-G", "4",
                  "--mode", "torchrun", "train.py", "--", "--lr", "$(touch pwned)"],
                 timeout=60, env=env, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("#!/bin/bash\n")
    assert "phalanx run -n 4 train.py --lr '$(touch pwned)' &" in result.stdout
    assert "not checked: no SLURM controller" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-N", "0", "train.py"], "job.nodes=0 must be >= 1"),
        (["--mode", "ssh", "train.py"], "launch.mode"),
        (["missing.py"], "training script 'missing.py' not found"),
        (["--set", "env.pass_vars=NOT_SET_ANYWHERE", "train.py"], "NOT_SET_ANYWHERE"),
        (["-J", "a\nb", "train.py"], "contains a newline"),
        (["--profile", "x", "--profiles", "/nonexistent.yaml", "train.py"], "no profiles file"),
    ],
)
def test_bad_submit_input_is_one_line_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "train.py").write_text("\n")
    result = run([str(VENV_BIN / "phalanx"), "submit", "--dry-run", *args], timeout=60,
                 env=base_env(), cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_env_artefacts_pin_what_runs_here_and_the_venv_job_parses(tmp_path: Path) -> None:
    from importlib.metadata import version

    torch_pin = f"torch=={version('torch').split('+')[0]}"
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("numpy\n")
    common = ["--requirements", str(requirements), "--project", str(tmp_path)]
    cli = [str(VENV_BIN / "phalanx"), "env"]
    venv = run([*cli, "venv", "--path", str(tmp_path / "v env"), "--set", "env.modules=py/3.11",
                "--set", "job.partition=cpu", *common], timeout=60, env=base_env())  # fmt: skip
    assert venv.returncode == 0, venv.stderr
    assert "module load py/3.11" in venv.stdout and "#SBATCH --partition=cpu" in venv.stdout
    assert f"python3 -m venv '{tmp_path / 'v env'}'" in venv.stdout  # quoted: a blank in it
    checkout = str(Path(__file__).parents[2])  # the venv installed phalanx from this checkout
    assert f"{torch_pin} {checkout} -r {requirements}" in venv.stdout
    script = tmp_path / "build.sbatch"
    script.write_text(venv.stdout)
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    conda = run([*cli, "conda", "--name", "exp", *common], timeout=60, env=base_env())
    assert (
        "name: exp" in conda.stdout and f"      - {torch_pin}\n      - {checkout}" in conda.stdout
    )
    assert f"      - -r {requirements}" in conda.stdout and "$WORK/envs/exp" in conda.stdout
    definition = run([*cli, "apptainer", *common], timeout=60, env=base_env())
    assert "Bootstrap: docker" in definition.stdout
    assert f"    {tmp_path} /opt/phalanx/project" in definition.stdout
    assert f"    {checkout} /opt/phalanx/phalanx" in definition.stdout  # copied in, then installed
    assert "/opt/phalanx/phalanx -r /opt/phalanx/requirements.txt /opt/phalanx/project" in (
        definition.stdout
    )
    missing = run([*cli, "conda", "--requirements", str(tmp_path / "nope.txt")], timeout=60,
                  env=base_env())  # fmt: skip
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_relative_paths_are_taken_from_the_submit_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", "/home/me")
    settings = ["env.kind=container", "env.image=images/phalanx.sif", "env.venv=~/venvs/demo",
                "env.module_paths=modulefiles,/opt/modules", "env.binds=data:/data,/scratch",
                "env.conda=envs/demo", "launch.python=.venv/bin/python", "code.dir=.."]  # fmt: skip
    config = resolve_submit_config(config_file=None, profile=None, profiles_file=None,
                                   overrides=settings, environ={})  # fmt: skip
    env = config.env
    assert env.image == f"{tmp_path}/images/phalanx.sif" and env.venv == "/home/me/venvs/demo"
    assert env.module_paths == (f"{tmp_path}/modulefiles", "/opt/modules")
    assert env.binds == (f"{tmp_path}/data:/data", "/scratch")  # the container side as given
    assert env.conda == f"{tmp_path}/envs/demo"
    assert config.launch.python == f"{tmp_path}/.venv/bin/python"
    assert config.code.dir == str(tmp_path.parent)


@pytest.mark.parametrize(
    ("runtime", "image"),
    [("apptainer", "docker://pytorch/pytorch:2.5.1"), ("apptainer", "library://u/c/img:1"),
     ("singularity", "docker-archive:img.tar"), ("charliecloud", "pytorch:2.5"),
     ("charliecloud", "stored-image")],
)  # fmt: skip
def test_image_references_and_names_stay_as_given(tmp_path: Path, runtime: str, image: str) -> None:
    env = EnvSection(kind="container", runtime=runtime, image=image,  # type: ignore[arg-type]
                     conda="demo", modules=("cuda/12.4",))  # fmt: skip
    config = with_absolute_paths(SubmitConfig(env=env), tmp_path)
    assert (config.env.image, config.env.conda, config.env.modules) == (
        image, "demo", ("cuda/12.4",))  # fmt: skip
    assert config.launch.python == "python"  # a name looked up on PATH
