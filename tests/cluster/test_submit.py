"""`phalanx submit` on the real two-node SLURM cluster: each launch mode runs 2 nodes x 2 ranks,
values reach the job byte-identical, status/logs/cancel work, a failing rank ends the job."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.conftest import need_command
from tests.support.procs import VENV_BIN, run
from tests.support.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.cluster
WORKER = Path(__file__).parents[1] / "support" / "submit_worker.py"
PHALANX = str(VENV_BIN / "phalanx")
REPO = Path(__file__).parents[2]
MODULES_INIT = Path("/usr/share/modules/init/bash")
PAYLOAD = "x $(touch pwned) `touch pwned2` \"dq\" 'sq' * end"
"""Command substitution, backticks, both quotes, blanks and a glob: must arrive verbatim."""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A code directory (not a git tree) holding the training script; submit runs from it."""
    code = tmp_path / "project"
    code.mkdir()
    shutil.copy(WORKER, code / "submit_worker.py")
    (code / "out").mkdir()
    return code


def job_env(slurm: SlurmCluster, **extra: str) -> dict[str, str]:
    """The submitting shell; sbatch --export=ALL hands it to the job."""
    env = {
        **slurm.env,
        # mpirun refuses root unless told so.
        "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        # The two test nodes are one machine: OpenMPI's shared-memory transport between the
        # ranks of one "node" crashed there (vader segfault); TCP is what real nodes use anyway.
        "OMPI_MCA_btl": "tcp,self",
    }  # fmt: skip
    return {**env, **extra}


def submit(slurm: SlurmCluster, project: Path, *args: str, env: dict[str, str] | None = None,
           ) -> tuple[str, Path]:  # fmt: skip
    result = run([PHALANX, "submit", "-t", "3", *args], timeout=120, cwd=project,
                 env=env or job_env(slurm))  # fmt: skip
    assert result.returncode == 0, result.stderr
    job_id = re.search(r"submitted job (\d+)", result.stdout)
    run_dir = re.search(r"run directory: (.+)", result.stdout)
    assert job_id and run_dir, result.stdout
    return job_id.group(1), Path(run_dir.group(1))


def finish(slurm: SlurmCluster, job_id: str, timeout: float = 90) -> str:
    try:
        return slurm.wait(job_id, timeout)
    except BaseException:
        slurm.cancel(job_id)
        raise


def records(out: Path, pattern: str = "rank-*.json") -> list[dict[str, object]]:
    found = [json.loads(p.read_text()) for p in sorted(out.glob(pattern))]
    return sorted(found, key=lambda r: int(r.get("rank", 0)))  # type: ignore[arg-type]


LAUNCHERS = {"srun": "slurm", "torchrun": "torchrun", "mpirun": "mpi"}
MODULEFILE = """#%Module1.0
prepend-path PATH {bin}
setenv PHALANX_MODULE_LOADED 1
"""


def without_venv(env: dict[str, str]) -> dict[str, str]:
    """The submitting shell without the venv on PATH: the job must set up its environment."""
    path = [p for p in env["PATH"].split(os.pathsep) if Path(p) != VENV_BIN]
    return {**env, "PATH": os.pathsep.join(path)}


def charliecloud_image(root: Path) -> Path:
    """A directory image that borrows the host's /usr (merged-/usr host) and has mount points
    for the interpreter and the checkout, so the venv runs inside ch-run unchanged."""
    image = root / "image"
    for name in ("dev", "etc", "home", "proc", "run", "sys", "tmp", "usr", "var", "root"):
        (image / name).mkdir(parents=True)
    for name in ("bin", "lib", "lib64", "sbin"):
        (image / name).symlink_to(f"usr/{name}")
    for name in ("passwd", "group"):
        (image / "etc" / name).touch()
    for name in ("hosts", "nsswitch.conf"):
        shutil.copy(f"/etc/{name}", image / "etc" / name)
    for mount in (sys.base_prefix, str(REPO)):
        (image / mount.lstrip("/")).mkdir(parents=True, exist_ok=True)
    return image


def kind_setup(kind: str, project: Path, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """Submit options and the submitting environment for one environment kind, run for real."""
    if kind == "venv":
        return ["--set", "env.kind=venv", "--set", f"env.venv={VENV_BIN.parent}"], without_venv(env)
    if kind == "modules":
        if not MODULES_INIT.is_file():
            need_command("environment-modules (apt)")  # skips, or fails under CI=true
        modulefiles = project.parent / "modulefiles"
        (modulefiles / "phalanx-venv").mkdir(parents=True)
        (modulefiles / "phalanx-venv" / "1.0").write_text(MODULEFILE.format(bin=VENV_BIN))
        args = ["--set", "env.kind=modules", "--set", "env.modules=phalanx-venv/1.0",
                "--set", f"env.module_paths={modulefiles}"]  # fmt: skip
        return args, without_venv(env)
    if kind == "charliecloud":
        need_command("ch-run")
        image = charliecloud_image(project.parent)
        binds = ",".join(["/usr", sys.base_prefix, str(REPO)])
        args = ["--set", "env.kind=container", "--set", "env.runtime=charliecloud",
                "--set", f"env.image={image}", "--set", f"env.binds={binds}",
                "--set", f"launch.python={VENV_BIN / 'python'}"]  # fmt: skip
        return args, env
    return [], env


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("mode", "kind"),
    [("srun", "venv"), ("torchrun", "modules"), ("mpirun", "none"), ("srun", "charliecloud")],
)
def test_each_launch_mode_runs_two_nodes_of_two_ranks(
    slurm: SlurmCluster, project: Path, mode: str, kind: str
) -> None:
    out = project / "out"
    args, env = kind_setup(kind, project, job_env(slurm))
    job_id, run_dir = submit(slurm, project, "-N", "2", "-n", "2", "--mode", mode, *args,
                             "submit_worker.py", f"probe.out={out}", env=env)  # fmt: skip
    state = finish(slurm, job_id)
    log = (run_dir / f"slurm-{job_id}.out").read_text(errors="replace")
    assert state == "COMPLETED", log[-3000:]
    ranks = records(out)
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3], log[-3000:]
    for r in ranks:
        assert r["world_size"] == 4 and r["sum"] == 6.0
        assert r["node_rank"] == int(r["rank"]) // 2 and r["local_rank"] == int(r["rank"]) % 2
        assert r["launcher"] == LAUNCHERS[mode]
        # The job ran the snapshot taken at submit, inside the run directory it was given.
        assert r["file"] == str((run_dir / "code" / "submit_worker.py").resolve())
        assert r["run_dir"] == str(run_dir)
        assert r["module_loaded"] == ("1" if kind == "modules" else None)
        assert Path(str(r["python"])).parent == VENV_BIN
    assert (run_dir / "job.sbatch").is_file() and (run_dir / "code" / "SNAPSHOT.json").is_file()
    assert sorted(p.name for p in (run_dir / "logs").glob("rank-*.log")) == [
        f"rank-{k}.log" for k in range(4)
    ]


@pytest.mark.timeout(180)
def test_values_reach_the_job_byte_identical_and_nothing_runs(
    slurm: SlurmCluster, project: Path
) -> None:
    out = project / "out"
    job_id, _ = submit(
        slurm, project, "-J", PAYLOAD, "--set", f"env.vars=PROBE_VALUE={PAYLOAD}",
        "submit_worker.py", "--raw", str(out), PAYLOAD, "--flag=a b", "*",
    )  # fmt: skip
    assert finish(slurm, job_id) == "COMPLETED"
    got = records(out, "raw-rank-*.json")
    assert len(got) == 1
    assert got[0]["argv"] == [PAYLOAD, "--flag=a b", "*"]
    assert got[0]["value"] == PAYLOAD
    assert got[0]["job_name"] == PAYLOAD
    assert not list(project.rglob("pwned*")) and not list(Path.cwd().glob("pwned*"))


@pytest.mark.timeout(180)
def test_a_failing_rank_ends_the_whole_job(slurm: SlurmCluster, project: Path) -> None:
    out = project / "out"
    job_id, run_dir = submit(slurm, project, "-N", "2", "-n", "2", "submit_worker.py",
                             f"probe.out={out}", "probe.fail_rank=3")  # fmt: skip
    # Ranks 0-2 wait in a collective for rank 3 (timeout 600 s): only srun's
    # --kill-on-bad-exit ends them this soon.
    assert finish(slurm, job_id, timeout=60) == "FAILED"
    assert records(out) == []
    assert "rank 3 fails on purpose" in (run_dir / f"slurm-{job_id}.out").read_text()


@pytest.mark.timeout(180)
def test_status_logs_and_cancel(slurm: SlurmCluster, project: Path) -> None:
    out = project / "out"
    job_id, run_dir = submit(slurm, project, "submit_worker.py", f"probe.out={out}",
                             "probe.hold=true")  # fmt: skip
    env = job_env(slurm)
    slurm.wait_state(job_id, "RUNNING", timeout=60)
    status = run([PHALANX, "status", job_id], timeout=30, env=env)
    assert re.search(rf"{job_id}\s+submit_worker\s+RUNNING", status.stdout), status
    by_dir = run([PHALANX, "status", str(run_dir)], timeout=30, env=env)
    assert job_id in by_dir.stdout
    follower = subprocess.Popen([PHALANX, "logs", "-f", job_id], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        cancelled = run([PHALANX, "cancel", str(run_dir)], timeout=30, env=env)
        assert cancelled.returncode == 0, cancelled.stderr
        assert finish(slurm, job_id, timeout=60) == "CANCELLED"
        followed, _ = follower.communicate(timeout=60)  # -f ends with the job
    finally:
        follower.kill()
    assert follower.returncode == 0 and "CANCELLED" in followed, followed
    logs = run([PHALANX, "logs", job_id], timeout=30, env=env)
    assert logs.returncode == 0 and "CANCELLED" in logs.stdout + logs.stderr
    after = run([PHALANX, "status", job_id], timeout=30, env=env)
    assert re.search(rf"{job_id}\s+\S+\s+CANCELLED", after.stdout), after.stdout


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-p", "nosuchpartition"], "invalid partition"),
        (["-G", "1"], "gres"),
        (["-N", "0"], "job.nodes=0 must be >= 1"),
        (["--profile", "nope"], "unknown profile 'nope'"),
        (["-J", "two\nlines"], "contains a newline"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    slurm: SlurmCluster, project: Path, args: list[str], message: str
) -> None:
    profiles = project / "profiles.yaml"
    profiles.write_text("known:\n  job: {nodes: 1}\n")
    env = job_env(slurm, PHALANX_PROFILES=str(profiles))
    result = run([PHALANX, "submit", *args, "submit_worker.py", f"probe.out={project}"],
                 timeout=60, cwd=project, env=env)  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message.lower() in lines[0].lower(), lines
    assert lines[0].startswith("phalanx submit: error: ")
    assert not (project / "runs").exists()  # a refused submission leaves nothing behind


@pytest.mark.timeout(120)
def test_dry_run_is_checked_by_sbatch_test_only_and_leaves_nothing(
    slurm: SlurmCluster, project: Path
) -> None:
    result = run([PHALANX, "submit", "--dry-run", "-N", "2", "-n", "2", "submit_worker.py",
                  f"probe.out={project}"], timeout=60, cwd=project, env=job_env(slurm))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("#!/bin/bash\n")
    assert "sbatch --test-only: " in result.stderr and "to start at" in result.stderr
    assert not (project / "runs").exists()
    assert "submit_worker" not in run(["squeue", "--noheader"], timeout=30, env=slurm.env).stdout


@pytest.mark.timeout(240)
def test_grid_sweep_as_a_job_array(slurm: SlurmCluster, tmp_path: Path) -> None:
    from tests.support.sweeps import check_summary, write_spec

    spec = write_spec(tmp_path)
    result = run([PHALANX, "sweep", str(spec), "--slurm", "--wait", "--root",
                  str(tmp_path / "runs"), "--set", "job.time=3"], timeout=220, cwd=tmp_path,
                 env=job_env(slurm))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    sweep_dir = Path(re.search(r"sweep directory: (\S+)", result.stdout).group(1))  # type: ignore[union-attr]
    array = re.search(r"submitted job array (\d+) \(tasks 0-3\)", result.stdout)
    assert array, result.stdout
    assert "#SBATCH --array=0-3" in (sweep_dir / "job.sbatch").read_text()
    assert len(list(sweep_dir.glob("slurm-*_*.out"))) == 4  # one log per array task
    check_summary(sweep_dir, result.stdout)


@pytest.mark.timeout(300)
def test_env_venv_job_builds_the_venv_a_submitted_job_then_runs_in(
    slurm: SlurmCluster, project: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "built venv"  # a blank in the path: quoted in both scripts
    build = tmp_path / "build.sbatch"
    made = run([PHALANX, "env", "venv", "--path", str(venv), "-o", str(build)], timeout=60,
               env=job_env(slurm))  # fmt: skip
    assert made.returncode == 0, made.stderr
    submitted = run(["sbatch", "--parsable", f"--output={tmp_path}/build.out", str(build)],
                    timeout=60, env=slurm.env, cwd=tmp_path)  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    log = tmp_path / "build.out"
    assert finish(slurm, job_id, timeout=240) == "COMPLETED", log.read_text()
    assert version("torch").split("+")[0] in log.read_text()  # the import check at its end
    out = project / "out"
    args = ["--set", "env.kind=venv", "--set", f"env.venv={venv}"]
    job_id, _ = submit(slurm, project, "-n", "2", *args, "submit_worker.py", f"probe.out={out}",
                       env=without_venv(job_env(slurm)))  # fmt: skip
    assert finish(slurm, job_id) == "COMPLETED"
    ranks = records(out)
    assert len(ranks) == 2 and all(Path(str(r["python"])).parent == venv / "bin" for r in ranks)
